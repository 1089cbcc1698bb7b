"""docs/design/k8s-protocol.md §1 LIST conformance: kubernetes-asyncio pagination plus wire-level checks."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kubesim.apiserver.core import LEASES
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS

from .conftest import add_jobs, trainjob

TJ = TRAINJOBS.collection_path()


async def test_paginated_list_with_kubernetes_asyncio(sim: SimulatedCluster, api: client.ApiClient) -> None:
    add_jobs(sim.store, 25)
    add_jobs(sim.store, 5, namespace="team2")
    crd = client.CustomObjectsApi(api)
    names, token, rvs = [], None, set()
    while True:
        page = await crd.list_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "trainjobs", limit=10, _continue=token
        )
        rvs.add(page["metadata"]["resourceVersion"])
        names += [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in page["items"]]
        if token is None:
            assert page["metadata"]["remainingItemCount"] == 20
            sim.store.create(TRAINJOBS, "team1", trainjob("zz-added-after-first-page"))  # pinned snapshot
        token = page["metadata"].get("continue")
        if not token:
            break
    assert len(names) == 30 and names == sorted(names) and len(rvs) == 1
    ns_page = await crd.list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "team2", "trainjobs"
    )
    assert ns_page["kind"] == "TrainJobList" and len(ns_page["items"]) == 5


async def test_empty_list_shape(http: aiohttp.ClientSession, sim: SimulatedCluster) -> None:
    async with http.get(TJ) as resp:
        body = await resp.json()
        assert resp.status == 200 and resp.content_type == "application/json"
    assert body == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJobList",
        "metadata": {"continue": "", "resourceVersion": str(sim.store.resource_version)},
        "items": [],
    }
    async with http.get(LEASES.collection_path()) as resp:
        assert (await resp.json())["kind"] == "LeaseList"


async def test_continue_after_compaction_is_410_with_inconsistent_token(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    add_jobs(sim.store, 30)
    async with http.get(TJ, params={"limit": "10"}) as resp:
        first = await resp.json()
    sim.faults.compact()
    async with http.get(TJ, params={"limit": "10", "continue": first["metadata"]["continue"]}) as resp:
        status = await resp.json()
        assert resp.status == 410
    assert status["reason"] == "Expired" and status["code"] == 410
    assert "use the continue token in this response" in status["message"]
    async with http.get(TJ, params={"limit": "100", "continue": status["metadata"]["continue"]}) as resp:
        rest = await resp.json()
    assert rest["items"][0]["metadata"]["name"] == "job-00010" and len(rest["items"]) == 20


async def test_continue_token_expires_after_snapshot_ttl(
    sim: SimulatedCluster, api: client.ApiClient
) -> None:
    add_jobs(sim.store, 4)
    sim.store.snapshot_ttl = 0.0
    crd = client.CustomObjectsApi(api)
    page = await crd.list_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "trainjobs", limit=2)
    await asyncio.sleep(0.01)
    try:
        await crd.list_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "trainjobs", limit=2, _continue=page["metadata"]["continue"]
        )
    except ApiException as exc:
        assert exc.status == 410
    else:
        raise AssertionError("expected 410")


async def test_resource_version_with_continue_is_400(
    http: aiohttp.ClientSession, sim: SimulatedCluster
) -> None:
    add_jobs(sim.store, 3)
    async with http.get(TJ, params={"limit": "1"}) as resp:
        token = (await resp.json())["metadata"]["continue"]
    async with http.get(TJ, params={"limit": "1", "continue": token, "resourceVersion": "2"}) as resp:
        body = await resp.json()
        assert resp.status == 400
    assert body["message"] == "specifying resource version is not allowed when using continue"
    async with http.get(TJ, params={"continue": "not-a-token!"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["message"].startswith("invalid continue token")


async def test_list_options_validation_is_422(http: aiohttp.ClientSession) -> None:
    cases = {
        "resourceVersionMatch=NotOlderThan": "resourceVersionMatch is forbidden unless resourceVersion is",
        "resourceVersion=0&resourceVersionMatch=Exact": 'resourceVersionMatch "exact" is forbidden',
        "resourceVersion=1&resourceVersionMatch=Bogus": 'Unsupported value: "Bogus"',
        "sendInitialEvents=true": "sendInitialEvents is forbidden for list",
    }
    for query, fragment in cases.items():
        async with http.get(f"{TJ}?{query}") as resp:
            body = await resp.json()
            assert resp.status == 422, query
        assert body["reason"] == "Invalid" and fragment in body["message"], body
        assert body["message"].startswith('ListOptions.meta.k8s.io "" is invalid: ')
        assert body["details"]["kind"] == "ListOptions"


async def test_resource_version_ahead_is_504_too_large(
    http: aiohttp.ClientSession, sim: SimulatedCluster
) -> None:
    async with http.get(TJ, params={"resourceVersion": "900"}) as resp:
        body = await resp.json()
        assert resp.status == 504 and resp.headers["Retry-After"] == "1"
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"Timeout: Too large resource version: 900, current: {sim.store.resource_version}",
        "reason": "Timeout",
        "details": {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
        "code": 504,
    }


async def test_exact_resource_version_list_and_expiry(
    http: aiohttp.ClientSession, sim: SimulatedCluster
) -> None:
    add_jobs(sim.store, 3)
    rv = sim.store.resource_version
    sim.store.delete(TRAINJOBS, "team1", "job-00000")
    add_jobs(sim.store, 2, prefix="later")
    query = {"resourceVersion": str(rv), "resourceVersionMatch": "Exact"}
    async with http.get(TJ, params=query) as resp:
        body = await resp.json()
    assert body["metadata"]["resourceVersion"] == str(rv)
    assert [i["metadata"]["name"] for i in body["items"]] == ["job-00000", "job-00001", "job-00002"]
    sim.faults.compact()
    async with http.get(TJ, params=query) as resp:
        assert resp.status == 410
        assert (await resp.json())["message"] == "The resourceVersion for the provided list is too old."


async def test_selectors(http: aiohttp.ClientSession, sim: SimulatedCluster) -> None:
    add_jobs(sim.store, 4)
    sim.store.patch(TRAINJOBS, "team1", "job-00001", {"metadata": {"labels": {"tier": "gold"}}})

    async def names(**params: str) -> list[str]:
        async with http.get(TJ, params=params) as resp:
            assert resp.status == 200, await resp.text()
            return [i["metadata"]["name"] for i in (await resp.json())["items"]]

    assert await names(labelSelector="tier=gold") == ["job-00001"]
    assert await names(labelSelector="tier in (gold,silver),app") == ["job-00001"]
    assert len(await names(labelSelector="!tier")) == 3
    assert await names(fieldSelector="metadata.name=job-00002") == ["job-00002"]
    assert await names(fieldSelector="metadata.namespace=team9") == []
    async with http.get(TJ, params={"fieldSelector": "spec.suspend=true"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["message"] == "field label not supported: spec.suspend"
    async with http.get(TJ, params={"limit": "2", "labelSelector": "app=demo"}) as resp:
        assert "remainingItemCount" not in (await resp.json())["metadata"]


async def test_large_list_pages_are_fast(http: aiohttp.ClientSession, sim: SimulatedCluster) -> None:
    add_jobs(sim.store, 5000)
    start = time.perf_counter()
    token, total = "", 0
    while True:
        params = {"limit": "500", **({"continue": token} if token else {})}
        async with http.get(TJ, params=params) as resp:
            body = await resp.json()
        total += len(body["items"])
        token = body["metadata"]["continue"]
        if not token:
            break
    assert total == 5000
    assert time.perf_counter() - start < 5.0
