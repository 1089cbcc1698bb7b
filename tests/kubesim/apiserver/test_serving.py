"""What clients read besides objects: core and aggregated discovery, OpenAPI v2 (JSON and protobuf) and v3,
Table and PartialObjectMetadata output, 406, the initial-events-end bookmark rule, server-side apply."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from kubesim.apiserver.http import protobuf
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS

from .conftest import add_jobs, trainjob

TJ = TRAINJOBS.collection_path("team1")
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
AGGREGATED = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)


async def _get(http: aiohttp.ClientSession, path: str, accept: str | None = None, **params: str) -> Any:
    headers = {"Accept": accept} if accept else {}
    async with http.get(path, headers=headers, params=params) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_core_discovery_lists_namespaces_and_events(http: aiohttp.ClientSession) -> None:
    _, _, raw = await _get(http, "/api/v1")
    resources = {r["name"]: r for r in orjson.loads(raw)["resources"]}
    assert {"namespaces", "events"} <= set(resources)
    assert {"list", "watch", "get", "create", "delete"} <= set(resources["namespaces"]["verbs"])
    assert resources["namespaces"]["namespaced"] is False and resources["namespaces"]["shortNames"] == ["ns"]


async def test_aggregated_discovery(http: aiohttp.ClientSession) -> None:
    status, ctype, raw = await _get(http, "/apis", AGGREGATED)
    assert status == 200 and ctype.startswith("application/json") and "as=APIGroupDiscoveryList" in ctype
    doc = orjson.loads(raw)
    assert doc["kind"] == "APIGroupDiscoveryList" and doc["apiVersion"] == "apidiscovery.k8s.io/v2"
    trainer = next(g for g in doc["items"] if g["metadata"]["name"] == "trainer.kubeflow.org")
    trainjobs = next(r for r in trainer["versions"][0]["resources"] if r["resource"] == "trainjobs")
    assert trainjobs["scope"] == "Namespaced" and trainjobs["subresources"][0]["subresource"] == "status"
    _, _, raw = await _get(http, "/api", AGGREGATED)
    core = orjson.loads(raw)["items"][0]["versions"][0]["resources"]
    assert {r["resource"] for r in core} == {"namespaces", "events", "pods"}


async def test_not_acceptable(http: aiohttp.ClientSession) -> None:
    status, _, raw = await _get(http, TJ, "application/vnd.kubernetes.protobuf")
    assert status == 406 and orjson.loads(raw)["reason"] == "NotAcceptable"
    status, _, _ = await _get(http, TJ, "application/vnd.kubernetes.protobuf, application/json")
    assert status == 200
    status, _, _ = await _get(http, TJ, "application/json;as=Table;v=v9;g=meta.k8s.io")
    assert status == 406


async def test_openapi_v2_v3(http: aiohttp.ClientSession) -> None:
    status, _, raw = await _get(http, "/openapi/v2", "application/json")
    v2 = orjson.loads(raw)
    assert status == 200 and v2["swagger"] == "2.0"
    tj = v2["definitions"]["org.kubeflow.trainer.v1alpha1.TrainJob"]
    assert tj["x-kubernetes-group-version-kind"] == [
        {"group": "trainer.kubeflow.org", "kind": "TrainJob", "version": "v1alpha1"}
    ]
    status, ctype, pb = await _get(
        http, "/openapi/v2", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
    )
    assert status == 200 and ctype == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    top = dict(protobuf.fields(pb))
    assert top[1] == b"2.0" and b"org.kubeflow.trainer.v1alpha1.TrainJob" in pb
    _, _, raw = await _get(http, "/openapi/v3")
    url = orjson.loads(raw)["paths"]["apis/trainer.kubeflow.org/v1alpha1"]["serverRelativeURL"]
    status, _, raw = await _get(http, url)
    v3 = orjson.loads(raw)
    patch = v3["paths"]["/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}"][
        "patch"
    ]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "TrainJob"
    assert "org.kubeflow.trainer.v1alpha1.TrainJob" in v3["components"]["schemas"]


async def test_table_and_partial_metadata(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    add_jobs(sim.store, 2)
    status, _, raw = await _get(http, TJ, TABLE)
    doc = orjson.loads(raw)
    assert status == 200 and doc["kind"] == "Table"
    assert [c["name"] for c in doc["columnDefinitions"]] == ["Name", "State", "Age"]
    assert [r["cells"][0] for r in doc["rows"]] == ["job-00000", "job-00001"]
    assert doc["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    _, _, raw = await _get(http, f"{TJ}/job-00000", TABLE, includeObject="None")
    row = orjson.loads(raw)["rows"][0]
    assert "object" not in row and row["cells"][1] is None  # no conditions yet: no State
    accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
    _, _, raw = await _get(http, TJ, accept)
    doc = orjson.loads(raw)
    assert doc["kind"] == "PartialObjectMetadataList" and "spec" not in doc["items"][0]
    _, _, raw = await _get(http, "/api/v1/namespaces", TABLE)
    assert [c["name"] for c in orjson.loads(raw)["columnDefinitions"]] == ["Name", "Status", "Age"]
    params = {"watch": "1", "timeoutSeconds": "1"}
    async with http.get(TJ, params=params, headers={"Accept": TABLE}) as resp:
        first = orjson.loads(await resp.content.readline())
    assert first["type"] == "ADDED" and first["object"]["kind"] == "Table"


async def test_initial_events_end_only_with_send_initial_events(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    add_jobs(sim.store, 1)
    legacy = {"watch": "1", "allowWatchBookmarks": "true", "resourceVersion": "0", "timeoutSeconds": "1"}
    async with http.get(TJ, params=legacy) as resp:
        lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert all("annotations" not in e["object"]["metadata"] for e in lines if e["type"] == "BOOKMARK")
    watchlist = dict(
        legacy, sendInitialEvents="true", resourceVersionMatch="NotOlderThan", resourceVersion=""
    )
    async with http.get(TJ, params=watchlist) as resp:
        lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert [e["type"] for e in lines[:2]] == ["ADDED", "BOOKMARK"]
    assert lines[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_server_side_apply(http: aiohttp.ClientSession) -> None:
    apply = {"Content-Type": "application/apply-patch+yaml"}

    async def do(manager: str, spec: dict[str, Any], labels: dict[str, str], **params: str) -> Any:
        config = trainjob("a", **spec)
        config["metadata"]["labels"] = labels
        q = {"fieldManager": manager, **params}
        async with http.patch(f"{TJ}/a", data=orjson.dumps(config), headers=apply, params=q) as resp:
            return resp.status, await resp.json()

    status, obj = await do("alice", {"suspend": True}, {"team": "a", "tmp": "1"})
    assert status == 201 and [(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]] == [
        ("alice", "Apply")
    ]
    status, obj = await do("alice", {"suspend": True}, {"team": "a"})  # stops applying the tmp label
    assert status == 200 and obj["metadata"]["labels"] == {"team": "a"}
    status, obj = await do("bob", {"suspend": False}, {"team": "a"})
    assert status == 409 and obj["reason"] == "Conflict"
    assert obj["message"] == 'Apply failed with 1 conflict: conflict with "alice": .spec.suspend'
    assert obj["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"', "field": ".spec.suspend"}
    ]
    status, obj = await do("bob", {"suspend": False}, {"team": "a"}, force="true")
    assert status == 200 and obj["spec"]["suspend"] is False
    managers = {m["manager"]: m["fieldsV1"] for m in obj["metadata"]["managedFields"]}
    assert "f:suspend" not in managers["alice"]["f:spec"] and "f:suspend" in managers["bob"]["f:spec"]
    # A merge patch by another manager takes the field over (Update operation).
    patch = {"spec": {"suspend": True}}
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(
        f"{TJ}/a", data=orjson.dumps(patch), headers=headers, params={"fieldManager": "eve"}
    ) as r:
        after = await r.json()
    owners = {(m["manager"], m["operation"]) for m in after["metadata"]["managedFields"]}
    assert ("eve", "Update") in owners
    eve = next(m for m in after["metadata"]["managedFields"] if m["manager"] == "eve")
    assert eve["fieldsV1"] == {"f:spec": {"f:suspend": {}}}
