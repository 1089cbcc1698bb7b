"""BearerAuth + KubeReviewer against TokenReview/SubjectAccessReview served by
kubesim.apiserver.http.authn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.api.auth import (
    STARTING,
    BearerAuth,
    Decision,
    KubeReviewer,
    LazyKubeReviewer,
    bearer_token,
    install_auth,
)
from app.api.routes import install_routes
from app.config import Settings
from app.kube.client import KubeClient
from kubesim.apiserver.http.authn import TokenRegistry
from tests.support.auth_rig import (
    ALICE_TOKEN,
    OPS_TOKEN,
    PROM_TOKEN,
    ApiServer,
    Harness,
    StubView,
    bearer,
    connect,
    protected_app,
)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


async def test_missing_token_is_401_status_without_any_review(
    harness: Harness, registry: TokenRegistry
) -> None:
    resp = await harness.http.get("/metrics")
    assert resp.status_code == 401
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert resp.json() == _status(401, "Unauthorized", "Unauthorized")
    assert registry.counters == {"tokenreviews": 0, "subjectaccessreviews": 0}


@pytest.mark.parametrize(
    "header", ["Basic YWxpY2U6cHc=", "Bearer", "Bearer    ", "prom-token", "Bearer\tprom-token"]
)
async def test_malformed_authorization_is_401(harness: Harness, header: str) -> None:
    resp = await harness.http.get("/metrics", headers={"Authorization": header})
    assert resp.status_code == 401
    assert resp.json()["reason"] == "Unauthorized"


async def test_unknown_token_is_401(harness: Harness, registry: TokenRegistry) -> None:
    resp = await harness.http.get("/metrics", headers=bearer("no-such-token"))
    assert resp.status_code == 401
    assert resp.json() == _status(401, "Unauthorized", "Unauthorized")
    assert registry.counters == {"tokenreviews": 1, "subjectaccessreviews": 0}


async def test_expired_token_is_401_and_reason_not_leaked(harness: Harness, registry: TokenRegistry) -> None:
    registry.invalidate(PROM_TOKEN, "token has expired")
    resp = await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))
    assert resp.status_code == 401
    assert "expired" not in resp.text


async def test_authenticated_but_not_allowed_is_403(harness: Harness, registry: TokenRegistry) -> None:
    resp = await harness.http.get("/metrics", headers=bearer(ALICE_TOKEN))
    assert resp.status_code == 403
    assert resp.json() == _status(403, "Forbidden", 'forbidden: User "alice" cannot get path "/metrics"')
    assert registry.counters == {"tokenreviews": 1, "subjectaccessreviews": 1}


async def test_allowed_token_reaches_metrics(harness: Harness) -> None:
    resp = await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))
    assert resp.status_code == 200
    assert resp.text == "# HELP up ok\nup 1\n"


async def test_explicit_denial_is_403_with_reason(harness: Harness, registry: TokenRegistry) -> None:
    registry.deny(name="no-metrics", paths=["/metrics"], service_accounts=["monitoring/prometheus"])
    resp = await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))
    assert resp.status_code == 403
    assert "no-metrics" in resp.json()["message"]


# /openapi.json and /docs are protected like /debug/* (tests/api/test_docs_auth.py).
@pytest.mark.parametrize("path", ["/", "/healthz", "/livez", "/readyz"])
async def test_probes_and_index_stay_open(harness: Harness, registry: TokenRegistry, path: str) -> None:
    resp = await harness.http.get(path)
    assert resp.status_code == 200
    assert registry.counters["tokenreviews"] == 0


async def test_debug_paths_are_protected(harness: Harness) -> None:
    for path in (
        "/debug/snapshot",
        "/debug/terminal",
        "/debug/leadership",
        "/debug/nope",
        "/debug//snapshot",
    ):
        assert (await harness.http.get(path)).status_code == 401, path
        assert (await harness.http.get(path, headers=bearer(PROM_TOKEN))).status_code == 403, path
    # Allowed through (debug endpoints are off in the stub, so the route itself answers 404).
    resp = await harness.http.get("/debug/snapshot", headers=bearer(OPS_TOKEN))
    assert resp.status_code == 404
    assert resp.json() == {"detail": "debug endpoints are disabled"}


async def test_wildcard_rules(harness: Harness, registry: TokenRegistry) -> None:
    # OPS has "/debug/*": every debug page, but not /metrics.
    assert (await harness.http.get("/debug/leadership", headers=bearer(OPS_TOKEN))).status_code == 404
    assert (await harness.http.get("/metrics", headers=bearer(OPS_TOKEN))).status_code == 403
    # "*" for alice: everything.
    registry.add_user("carol-token", "carol")
    registry.allow(paths=["*"], users=["carol"])
    assert (await harness.http.get("/metrics", headers=bearer("carol-token"))).status_code == 200
    assert (await harness.http.get("/debug/terminal", headers=bearer("carol-token"))).status_code == 404
    # "/metrics" exactly does not give "/metrics/anything".
    assert (await harness.http.get("/metrics/extra", headers=bearer(PROM_TOKEN))).status_code == 403


async def test_cache_hit_avoids_second_review(harness: Harness, registry: TokenRegistry) -> None:
    for _ in range(5):
        assert (await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
    assert registry.counters == {"tokenreviews": 1, "subjectaccessreviews": 1}
    assert harness.reviewer.stats.cache_hits == 4
    # Another path is another decision.
    await harness.http.get("/debug/snapshot", headers=bearer(PROM_TOKEN))
    assert registry.counters["tokenreviews"] == 2
    # Denials are cached too.
    for _ in range(3):
        assert (await harness.http.get("/metrics", headers=bearer(ALICE_TOKEN))).status_code == 403
    assert registry.counters["tokenreviews"] == 3


async def test_concurrent_scrapes_share_one_review(harness: Harness, registry: TokenRegistry) -> None:
    results = await asyncio.gather(
        *(harness.http.get("/metrics", headers=bearer(PROM_TOKEN)) for _ in range(20))
    )
    assert {r.status_code for r in results} == {200}
    assert registry.counters == {"tokenreviews": 1, "subjectaccessreviews": 1}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_cache_expiry_allow_longer_than_deny(kube: KubeClient, registry: TokenRegistry) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(kube, cache_seconds=30, deny_cache_seconds=5, clock=clock)
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).status == 403
    rule = registry.allow(paths=["/metrics"], users=["alice"])  # permission granted meanwhile
    clock.now += 4
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).status == 403  # denial still cached
    clock.now += 2
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).allowed  # denial expired after 5 s
    registry.revoke(rule)
    clock.now += 29
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).allowed  # allow cached for 30 s
    clock.now += 2
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).status == 403
    assert registry.counters["tokenreviews"] == 3


async def test_cache_disabled_with_zero_seconds(kube: KubeClient, registry: TokenRegistry) -> None:
    reviewer = KubeReviewer(kube, cache_seconds=0)
    for _ in range(3):
        assert (await reviewer.review(PROM_TOKEN, "/metrics")).allowed
    assert registry.counters["tokenreviews"] == 3
    assert reviewer.cache_size == 0


async def test_cache_is_bounded_lru(kube: KubeClient) -> None:
    reviewer = KubeReviewer(kube, cache_seconds=30, max_entries=3)
    for i in range(10):
        await reviewer.review(f"random-{i}", "/metrics")
    assert reviewer.cache_size == 3


async def test_cache_key_does_not_hold_the_token(kube: KubeClient) -> None:
    reviewer = KubeReviewer(kube, cache_seconds=30)
    await reviewer.review(PROM_TOKEN, "/metrics")
    assert PROM_TOKEN not in repr(reviewer.cache_keys())
    assert PROM_TOKEN.encode() not in b"".join(k[0] for k in reviewer.cache_keys())


async def test_api_unreachable_is_503_and_not_cached(
    harness: Harness, api_server: ApiServer, registry: TokenRegistry
) -> None:
    await api_server.stop()
    resp = await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))
    assert resp.status_code == 503
    body = resp.json()
    assert body["kind"] == "Status" and body["code"] == 503 and body["reason"] == "ServiceUnavailable"
    assert harness.reviewer.stats.api_errors == 1
    assert harness.reviewer.cache_size == 0
    await api_server.start()  # same port: the client reconnects, and nothing stale was cached
    assert (await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200


async def test_reviewer_lacking_permission_is_503(harness: Harness, registry: TokenRegistry) -> None:
    registry.reviewer_forbidden = True  # the exporter's service account lacks system:auth-delegator
    assert (await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 503
    registry.reviewer_forbidden = False
    assert (await harness.http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200


async def test_exporter_credentials_rejected_is_503(api_server: ApiServer, tmp_path: Path) -> None:
    client = await connect(api_server.url, tmp_path, token="wrong-service-token")
    try:
        decision = await KubeReviewer(client).review(PROM_TOKEN, "/metrics")
    finally:
        await client.close()
    assert decision.status == 503


async def test_nonsense_answer_is_503(registry: TokenRegistry) -> None:
    class Junk:
        async def request_json(self, *args: Any, **kwargs: Any) -> Any:
            return ["not", "a", "review"]

    reviewer = KubeReviewer(Junk(), cache_seconds=30)  # type: ignore[arg-type]
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).status == 503
    assert reviewer.cache_size == 0


async def test_review_request_bodies(api_server: ApiServer, tmp_path: Path) -> None:
    """What goes to the API: TokenReview with the token; SAR with user, uid, groups, extra, path, verb."""
    seen: list[tuple[str, Any]] = []

    class Recording:
        def __init__(self, inner: KubeClient) -> None:
            self.inner = inner

        async def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
            seen.append((path, kwargs["body"]))
            return await self.inner.request_json(method, path, **kwargs)

    client = await connect(api_server.url, tmp_path)
    try:
        reviewer = KubeReviewer(Recording(client), audiences=["api"])  # type: ignore[arg-type]
        api_server.registry.add_service_account("aud-token", "monitoring", "prometheus", audiences=["api"])
        assert (await reviewer.review("aud-token", "/metrics")).allowed
    finally:
        await client.close()
    (tr_path, tr), (sar_path, sar) = seen
    assert tr_path == "/apis/authentication.k8s.io/v1/tokenreviews"
    assert tr == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "aud-token", "audiences": ["api"]},
    }
    assert sar_path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    spec = sar["spec"]
    assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert spec["user"] == "system:serviceaccount:monitoring:prometheus"
    assert spec["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:monitoring",
        "system:authenticated",
    ]
    assert spec["uid"]
    assert list(spec["extra"]) == ["authentication.kubernetes.io/credential-id"]


async def test_odd_spellings_of_protected_paths_are_protected(harness: Harness) -> None:
    for path in ("/metrics/", "/debug", "/debug/", "//metrics", "///debug/x"):
        # Raw ASGI paths: httpx would read "//metrics" as a host.
        sent: list[Any] = []

        async def send(message: Any, sent: list[Any] = sent) -> None:
            sent.append(message)

        async def receive() -> Any:
            return {"type": "http.request", "body": b""}

        app_scope: dict[str, Any] = {
            "type": "http",
            "method": "GET",
            "path": path,
            "headers": [],
            "query_string": b"",
        }

        async def inner(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("reached the app")

        await BearerAuth(inner, harness.reviewer)(app_scope, receive, send)
        assert sent[0]["status"] == 401, path
    # Paths that merely start with the same letters are not ours to guard.
    assert (await harness.http.get("/metricsfoo")).status_code == 404


def test_bearer_token_parsing() -> None:
    def parse(value: bytes) -> str | None:
        return bearer_token([(b"accept", b"*/*"), (b"authorization", value)])

    assert parse(b"Bearer abc.def") == "abc.def"
    assert parse(b"bearer   abc  ") == "abc"
    assert parse(b"BEARER abc") == "abc"
    assert parse(b"Basic abc") is None
    assert parse(b"Bearer ") is None
    assert parse(b"Bearer \xc3\xa9") is None
    assert parse(b"Bearer " + b"a" * 20000) is None
    assert bearer_token([]) is None


async def test_websocket_on_protected_path_is_closed() -> None:
    sent: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("must not reach the app")

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    class Never:
        async def review(self, token: str, path: str, verb: str = "get") -> Decision:
            raise AssertionError("no token: no review")

    mw = BearerAuth(inner, Never())
    await mw({"type": "websocket", "path": "/metrics", "headers": []}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]


async def test_install_auth_off_is_noop() -> None:
    app = FastAPI()
    assert install_auth(app, Settings(auth_enabled=False)) is None
    assert app.user_middleware == []


async def test_install_auth_uses_the_running_services_client(
    kube: KubeClient, registry: TokenRegistry
) -> None:
    app = FastAPI()
    install_routes(app)
    app.state.service = None
    reviewer = install_auth(app, Settings(auth_enabled=True, auth_cache_seconds=10))
    assert isinstance(reviewer, LazyKubeReviewer)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
        # Before the lifespan has started the service: protected paths 503, probes... are the routes' own.
        resp = await http.get("/metrics", headers=bearer(PROM_TOKEN))
        assert resp.status_code == 503
        assert resp.json()["message"] == STARTING.message
        assert (await http.get("/metrics")).status_code == 401
        app.state.service = StubView(kube)
        assert (await http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
        assert (await http.get("/metrics", headers=bearer(ALICE_TOKEN))).status_code == 403
        assert (await http.get("/healthz")).status_code == 200
    assert reviewer.current is not None
    assert registry.counters["tokenreviews"] == 2


async def test_protected_app_custom_prefixes(kube: KubeClient) -> None:
    app = FastAPI()
    install_routes(app)
    app.state.service = StubView()
    app.add_middleware(BearerAuth, reviewer=KubeReviewer(kube), protected_prefixes=("/debug/",))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/debug/snapshot")).status_code == 401


def test_protected_app_helper_builds() -> None:
    class Allow:
        async def review(self, token: str, path: str, verb: str = "get") -> Decision:
            return Decision(200, "", "")

    assert isinstance(protected_app(Allow()), FastAPI)
