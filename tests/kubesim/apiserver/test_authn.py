"""kubesim.apiserver.http.authn: TokenReview / SubjectAccessReview wire shapes, validation, RBAC-style
matching, and the
whole chain through the real SimulatedCluster (routes installed on its SimServer before it starts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from app.api.auth import KubeReviewer
from app.kube.client import KubeClient
from kubesim.apiserver.http.authn import (
    SUBJECT_ACCESS_REVIEW_PATH,
    TOKEN_REVIEW_PATH,
    TokenRegistry,
    install_auth_routes,
    non_resource_url_matches,
)
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.auth_rig import (
    ALICE_TOKEN,
    OPS_TOKEN,
    PROM_TOKEN,
    SERVICE_TOKEN,
    ApiServer,
    bearer,
    make_registry,
    protected_app,
)

SA_USER = "system:serviceaccount:monitoring:prometheus"


@pytest.fixture
async def http(api_server: ApiServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=api_server.url, headers=bearer(SERVICE_TOKEN)) as session:
        yield session


async def _post(http: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    async with http.post(path, json=body) as resp:
        return resp.status, await resp.json()


def _tr(token: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, **spec}}


def _sar(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


async def test_token_review_authenticated_shape(http: aiohttp.ClientSession, registry: TokenRegistry) -> None:
    code, body = await _post(http, TOKEN_REVIEW_PATH, _tr(PROM_TOKEN))
    assert code == 201
    assert body["kind"] == "TokenReview" and body["apiVersion"] == "authentication.k8s.io/v1"
    assert body["metadata"] == {"creationTimestamp": None}
    assert body["spec"] == {"token": PROM_TOKEN}
    status = body["status"]
    assert status["authenticated"] is True
    assert status["audiences"] == ["https://kubernetes.default.svc.cluster.local"]
    user = status["user"]
    assert user["username"] == SA_USER
    assert user["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:monitoring",
        "system:authenticated",
    ]
    assert set(user) == {"username", "uid", "groups", "extra"}


async def test_token_review_unknown_and_invalidated(
    http: aiohttp.ClientSession, registry: TokenRegistry
) -> None:
    code, body = await _post(http, TOKEN_REVIEW_PATH, _tr("nope"))
    assert code == 201
    assert body["status"] == {"user": {}}  # authenticated is omitempty
    registry.invalidate(ALICE_TOKEN, "token has been invalidated")
    _, body = await _post(http, TOKEN_REVIEW_PATH, _tr(ALICE_TOKEN))
    assert body["status"] == {"user": {}, "error": "token has been invalidated"}


async def test_token_review_audiences(http: aiohttp.ClientSession, registry: TokenRegistry) -> None:
    registry.add_user("aud", "dave", audiences=["a", "b"])
    _, body = await _post(http, TOKEN_REVIEW_PATH, _tr("aud", audiences=["b", "c"]))
    assert body["status"]["authenticated"] is True and body["status"]["audiences"] == ["b"]
    _, body = await _post(http, TOKEN_REVIEW_PATH, _tr("aud", audiences=["c"]))
    assert "authenticated" not in body["status"] and "audiences" in body["status"]["error"]


async def test_token_review_validation(http: aiohttp.ClientSession) -> None:
    code, body = await _post(http, TOKEN_REVIEW_PATH, _tr(""))
    assert code == 400
    assert body["kind"] == "Status" and body["reason"] == "BadRequest"
    assert body["message"] == "token is required for TokenReview in authentication"
    code, body = await _post(http, TOKEN_REVIEW_PATH, {"apiVersion": "v1", "kind": "Pod", "spec": {}})
    assert code == 400
    async with http.post(TOKEN_REVIEW_PATH, data=b"{not json") as resp:
        assert resp.status == 400


async def test_subject_access_review_allowed_shape(http: aiohttp.ClientSession) -> None:
    spec = {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}, "user": SA_USER, "groups": ["x"]}
    code, body = await _post(http, SUBJECT_ACCESS_REVIEW_PATH, _sar(**spec))
    assert code == 201
    assert body["kind"] == "SubjectAccessReview" and body["apiVersion"] == "authorization.k8s.io/v1"
    assert body["metadata"] == {"creationTimestamp": None}
    assert body["spec"] == spec
    assert body["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by ClusterRoleBinding "metrics-reader" of ClusterRole "metrics-reader" '
        'to ServiceAccount "prometheus/monitoring"',
    }


async def test_subject_access_review_denied_and_no_opinion(
    http: aiohttp.ClientSession, registry: TokenRegistry
) -> None:
    nra = {"path": "/metrics", "verb": "get"}
    _, body = await _post(http, SUBJECT_ACCESS_REVIEW_PATH, _sar(nonResourceAttributes=nra, user="alice"))
    assert body["status"] == {"allowed": False}
    _, body = await _post(
        http, SUBJECT_ACCESS_REVIEW_PATH, _sar(nonResourceAttributes=nra, user="x", groups=["ops"])
    )
    assert body["status"] == {"allowed": False}  # ops has /debug/* only
    _, body = await _post(
        http, SUBJECT_ACCESS_REVIEW_PATH, _sar(nonResourceAttributes=nra, user="r", groups=["system:masters"])
    )
    assert body["status"] == {"allowed": True}
    registry.deny(name="block", paths=["*"], users=["mallory"])
    registry.allow(paths=["*"], users=["mallory"])
    _, body = await _post(http, SUBJECT_ACCESS_REVIEW_PATH, _sar(nonResourceAttributes=nra, user="mallory"))
    assert body["status"]["allowed"] is False and body["status"]["denied"] is True
    # Verb matters: post is not get.
    post = {"path": "/metrics", "verb": "post"}
    _, body = await _post(http, SUBJECT_ACCESS_REVIEW_PATH, _sar(nonResourceAttributes=post, user=SA_USER))
    assert body["status"] == {"allowed": False}


async def test_subject_access_review_validation(http: aiohttp.ClientSession) -> None:
    code, body = await _post(http, SUBJECT_ACCESS_REVIEW_PATH, _sar(user="alice"))
    assert code == 422
    assert body["reason"] == "Invalid"
    assert "exactly one of nonResourceAttributes or resourceAttributes" in body["message"]
    code, body = await _post(
        http, SUBJECT_ACCESS_REVIEW_PATH, _sar(nonResourceAttributes={"path": "/metrics"})
    )
    assert code == 422
    assert "at least one of user or group must be specified" in body["message"]
    assert body["details"]["causes"][0]["field"] == "spec.user"


@pytest.mark.parametrize(
    ("rule", "path", "expected"),
    [
        ("/metrics", "/metrics", True),
        ("/metrics", "/metrics/x", False),
        ("/metrics", "/metricsx", False),
        ("*", "/anything", True),
        ("/debug/*", "/debug/snapshot", True),
        ("/debug/*", "/debug/", True),
        ("/debug/*", "/debug", False),
        ("/debug*", "/debug", True),
        ("/debug*", "/debugger", True),
        ("/metrics*", "/debug/x", False),
    ],
)
def test_non_resource_url_matching(rule: str, path: str, expected: bool) -> None:
    assert non_resource_url_matches(rule, path) is expected


async def test_reviews_pass_the_callers_own_auth(api_server: ApiServer) -> None:
    async with (
        aiohttp.ClientSession(base_url=api_server.url) as anon,
        anon.post(TOKEN_REVIEW_PATH, json=_tr(PROM_TOKEN)) as resp,
    ):
        assert resp.status == 401


async def test_reviewer_forbidden_status(http: aiohttp.ClientSession, registry: TokenRegistry) -> None:
    registry.reviewer_forbidden = True
    code, body = await _post(http, TOKEN_REVIEW_PATH, _tr(PROM_TOKEN))
    assert code == 403 and body["reason"] == "Forbidden"
    assert 'cannot create resource "tokenreviews" in API group "authentication.k8s.io"' in body["message"]


# ---------------------------------------------------------------------------------------------- end to end


async def test_end_to_end_through_simulated_cluster(tmp_path: Path) -> None:
    registry = make_registry()
    sim = SimulatedCluster(token=SERVICE_TOKEN)
    install_auth_routes(sim.server, registry)
    async with sim:
        client = await KubeClient.connect(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            reviewer = KubeReviewer(client, cache_seconds=30)
            app = protected_app(reviewer)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as http:
                assert (await http.get("/metrics")).status_code == 401
                assert (await http.get("/metrics", headers=bearer("bogus"))).status_code == 401
                assert (await http.get("/metrics", headers=bearer(ALICE_TOKEN))).status_code == 403
                assert (await http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
                assert (await http.get("/debug/leadership", headers=bearer(OPS_TOKEN))).status_code == 404
                assert (await http.get("/readyz")).status_code == 200
                assert registry.counters == {"tokenreviews": 4, "subjectaccessreviews": 3}
                # The cluster's own auth applies to the reviews: rotate its token, ours is now stale → 503.
                sim.faults.set_token("rotated")
                reviewer.clear()
                assert (await http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 503
        finally:
            await client.close()
