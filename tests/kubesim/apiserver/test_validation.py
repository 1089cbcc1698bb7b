"""Writes are checked as the apiserver checks them: the CRDs' schemas and CEL rules, names, TypeMeta,
typed Leases, pruning with warnings, fieldValidation, dryRun, depth; 422 bodies with field causes."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from kubesim.apiserver.core import LEASES
from kubesim.apiserver.status import StoreError
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS

from .conftest import trainjob

TJ = TRAINJOBS.collection_path("team1")
LS = LEASES.collection_path("team1")


async def _post(http: aiohttp.ClientSession, path: str, body: Any, **params: str) -> tuple[int, Any, Any]:
    async with http.post(path, json=body, params=params) as resp:
        return resp.status, await resp.json(), resp.headers


def _causes(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["field"], c["reason"]) for c in body["details"]["causes"]]


async def test_schema_types_required_and_names(http: aiohttp.ClientSession) -> None:
    status, body, _ = await _post(http, TJ, trainjob("a", trainer={"numNodes": "abc"}))
    assert status == 422 and body["reason"] == "Invalid"
    assert ("spec.trainer.numNodes", "FieldValueTypeInvalid") in _causes(body)
    assert body["message"].startswith(
        'TrainJob.trainer.kubeflow.org "a" is invalid: [spec.trainer.numNodes: '
    )
    no_ref = trainjob("b")
    del no_ref["spec"]["runtimeRef"]
    status, body, _ = await _post(http, TJ, no_ref)
    assert status == 422 and ("spec.runtimeRef", "FieldValueRequired") in _causes(body)
    status, body, _ = await _post(http, TJ, trainjob("Bad_Name"))
    assert status == 422 and ("metadata.name", "FieldValueInvalid") in _causes(body)
    # The CRD's own CEL rule on the name (RFC 1035 label) is reported at the root.
    assert any(
        f == "<nil>" and "RFC 1035" in c["message"]
        for f, c in zip(
            [c["field"] for c in body["details"]["causes"]], body["details"]["causes"], strict=True
        )
    )
    status, body, _ = await _post(http, TJ, dict(trainjob("c"), kind="Pod"))
    assert status == 422 and _causes(body) == [("kind", "FieldValueInvalid")]
    status, body, _ = await _post(http, TJ, dict(trainjob("d"), apiVersion="v1"))
    assert status == 400 and "does not match the expected API version" in body["message"]
    status, body, _ = await _post(http, TJ, {k: v for k, v in trainjob("e").items() if k != "kind"})
    assert status == 400 and body["message"].startswith("Object 'Kind' is missing in")
    status, body, _ = await _post(http, TJ, trainjob("f", managedBy="someone-else"))
    assert status == 422 and ("spec.managedBy", "FieldValueInvalid") in _causes(body)


async def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(
    http: aiohttp.ClientSession,
) -> None:
    status, body, headers = await _post(http, TJ, trainjob("a", bogus=1, trainer={"numNodes": 1, "x": 2}))
    assert status == 201 and "bogus" not in body["spec"] and body["spec"]["trainer"] == {"numNodes": 1}
    assert headers.getall("Warning") == [
        '299 - "unknown field \\"spec.bogus\\""',
        '299 - "unknown field \\"spec.trainer.x\\""',
    ]
    status, body, _ = await _post(http, TJ, trainjob("b", bogus=1), fieldValidation="Strict")
    assert status == 400 and body["message"] == (
        'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error: '
        'unknown field "spec.bogus"'
    )
    status, body, headers = await _post(http, TJ, trainjob("c", bogus=1), fieldValidation="Ignore")
    assert status == 201 and "Warning" not in headers
    status, body, _ = await _post(http, TJ, trainjob("d"), fieldValidation="Loud")
    assert status == 422 and body["details"]["kind"] == "CreateOptions"


async def test_immutable_fields_and_ratcheting(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    _, created, _ = await _post(http, TJ, trainjob("a"))
    created["spec"]["runtimeRef"]["name"] = "other"
    async with http.put(f"{TJ}/a", json=created) as resp:
        body = await resp.json()
        assert resp.status == 422 and body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "object": field is immutable',
                "field": "spec.runtimeRef",
            }
        ]
    # An object the schema rejects today (written before a CRD change) stays updatable where unchanged.
    sim.store.create(TRAINJOBS, "team1", trainjob("old", trainer={"numNodes": "lots"}))
    patch = {"metadata": {"labels": {"seen": "yes"}}}
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(f"{TJ}/old", data=orjson.dumps(patch), headers=headers) as resp:
        assert resp.status == 200


async def test_leases_are_typed(http: aiohttp.ClientSession) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "junk": 1},
        "spec": {"holderIdentity": "a", "renewTime": "2025-03-01T12:00:00.000000+02:00", "extra": True},
        "status": {"x": 1},
    }
    status, body, headers = await _post(http, LS, lease)
    assert status == 201
    assert body["spec"] == {"holderIdentity": "a", "renewTime": "2025-03-01T10:00:00.000000Z"}
    assert "status" not in body and "junk" not in body["metadata"]
    assert len(headers.getall("Warning")) == 3
    status, body, _ = await _post(
        http, LS, dict(lease, metadata={"name": "m"}, spec={"leaseDurationSeconds": "15"})
    )
    assert status == 400 and body["message"] == (
        'Lease in version "v1" cannot be handled as a Lease: json: cannot unmarshal string into Go struct '
        "field LeaseSpec.spec.leaseDurationSeconds of type int32"
    )


async def test_writes_into_a_missing_namespace_are_404(http: aiohttp.ClientSession) -> None:
    status, body, _ = await _post(http, TRAINJOBS.collection_path("nope"), trainjob("a"))
    assert status == 404 and body["message"] == 'namespaces "nope" not found'
    assert body["details"] == {"name": "nope", "group": "", "kind": "namespaces"}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nope"}}
    status, body, _ = await _post(http, "/api/v1/namespaces", ns)
    assert status == 201 and body["status"] == {"phase": "Active"}
    assert body["metadata"]["labels"] == {"kubernetes.io/metadata.name": "nope"}
    status, _, _ = await _post(http, TRAINJOBS.collection_path("nope"), trainjob("a"))
    assert status == 201
    held = trainjob("held")
    held["metadata"]["finalizers"] = ["example.com/keep"]
    await _post(http, TRAINJOBS.collection_path("nope"), held)
    async with http.delete("/api/v1/namespaces/nope") as resp:
        assert resp.status == 200 and (await resp.json())["status"]["phase"] == "Terminating"
    status, body, _ = await _post(http, TRAINJOBS.collection_path("nope"), trainjob("b"))
    assert status == 403 and body["details"]["causes"][0]["reason"] == "NamespaceTerminating"
    patch = {"metadata": {"finalizers": None}}
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(
        f"{TRAINJOBS.collection_path('nope')}/held", data=orjson.dumps(patch), headers=headers
    ):
        pass
    async with http.get("/api/v1/namespaces/nope") as resp:
        assert resp.status == 404  # emptied, so gone


async def test_dry_run_persists_nothing(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    rv = sim.store.resource_version
    status, body, _ = await _post(http, TJ, trainjob("a"), dryRun="All")
    assert status == 201 and "resourceVersion" not in body["metadata"] and body["metadata"]["uid"]
    assert sim.store.resource_version == rv and sim.store.count(TRAINJOBS, "team1") == 0
    status, body, _ = await _post(http, TJ, trainjob("a"), dryRun="Some")
    assert status == 422 and body["details"]["causes"][0]["field"] == "dryRun"
    _, created, _ = await _post(http, TJ, trainjob("a"))
    rv = sim.store.resource_version
    created["spec"]["suspend"] = True
    async with http.put(f"{TJ}/a", json=created, params={"dryRun": "All"}) as resp:
        assert resp.status == 200 and (await resp.json())["spec"]["suspend"] is True
    async with http.delete(f"{TJ}/a", params={"dryRun": "All"}) as resp:
        assert resp.status == 200
    assert sim.store.resource_version == rv and not sim.store.get(TRAINJOBS, "team1", "a")["spec"]["suspend"]


async def test_deep_nesting_is_refused_on_write_and_lists_keep_working(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    deep: Any = "leaf"
    for _ in range(250):
        deep = {"a": deep}
    status, body, _ = await _post(http, TJ, trainjob("deep", bogus=deep))
    assert status == 201 and "bogus" not in body["spec"]  # unknown: pruned before it is stored
    try:
        sim.store.create(TRAINJOBS, "team1", dict(trainjob("deeper"), extra=deep))
    except StoreError as exc:  # the Python path stores as given, but never what cannot be served
        assert exc.code == 400
    async with http.get(TJ) as resp:
        assert resp.status == 200 and [i["metadata"]["name"] for i in (await resp.json())["items"]] == [
            "deep"
        ]


async def test_delete_collection_and_headers(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    for name in ("a", "b", "c"):
        obj = trainjob(name)
        obj["metadata"]["labels"] = {"grp": "x" if name != "c" else "y"}
        await _post(http, TJ, obj)
    async with http.delete(TJ, params={"labelSelector": "grp=x"}) as resp:
        body = await resp.json()
        assert resp.status == 200 and body["kind"] == "TrainJobList"
        assert sorted(i["metadata"]["name"] for i in body["items"]) == ["a", "b"]
        assert resp.headers["Cache-Control"] == "no-cache, private" and len(resp.headers["Audit-Id"]) == 36
    assert [e.key[1] for e in sim.store.entries(TRAINJOBS, "team1")] == ["c"]
    async with http.post(TJ, data=b"{nope", headers={"Content-Type": "application/json"}) as resp:
        assert (await resp.json())["message"] == (
            "couldn't get version/kind; json parse error: "
            "invalid character 'n' looking for beginning of value"
        )
