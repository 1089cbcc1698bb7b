"""docs/design/k8s-protocol.md §2 WATCH conformance: kubernetes-asyncio resume plus raw-stream checks."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client, watch

from kubesim.apiserver.http.list_options import parse_bool
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS

from .conftest import add_jobs, trainjob

TJ = TRAINJOBS.collection_path()


async def read_events(
    resp: aiohttp.ClientResponse, n: int | None = None, timeout: float = 5.0
) -> list[dict[str, Any]]:
    """Events until ``n`` arrived or the stream ended."""
    events: list[dict[str, Any]] = []

    async def collect() -> None:
        async for line in resp.content:
            events.append(orjson.loads(line))
            if n is not None and len(events) >= n:
                return

    await asyncio.wait_for(collect(), timeout)
    return events


def test_bool_parsing_follows_conversion_rules() -> None:
    assert [parse_bool(v) for v in (None, "0", "false", "FALSE")] == [False] * 4
    assert [parse_bool(v) for v in ("", "1", "true", "True", "yes")] == [True] * 5


async def test_headers_flushed_before_any_event(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    params = {"watch": "", "resourceVersion": str(sim.store.resource_version), "timeoutSeconds": "5"}
    resp = await asyncio.wait_for(http.get(TJ, params=params), 1.0)  # no event exists, headers still arrive
    assert resp.status == 200 and resp.headers["Transfer-Encoding"] == "chunked"
    assert resp.headers["Content-Type"] == "application/json"
    resp.close()


async def test_synthetic_added_then_live_events_and_clean_end(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    add_jobs(sim.store, 3)
    params = {"watch": "true", "timeoutSeconds": "1"}
    async with http.get(TJ, params=params) as resp:
        first = await read_events(resp, 3)
        sim.store.create(TRAINJOBS, "team1", trainjob("live"))
        rest = await read_events(resp)  # ends cleanly at the deadline, no ERROR
    assert [e["type"] for e in first] == ["ADDED"] * 3
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in rest] == [("ADDED", "live")]


async def test_resume_from_resource_version_with_kubernetes_asyncio(
    sim: SimulatedCluster, api: client.ApiClient
) -> None:
    add_jobs(sim.store, 2)
    rv = sim.store.resource_version
    obj = sim.store.get(TRAINJOBS, "team1", "job-00000")
    obj["spec"]["suspend"] = True
    sim.store.update(TRAINJOBS, "team1", obj)
    sim.store.delete(TRAINJOBS, "team1", "job-00001")
    crd = client.CustomObjectsApi(api)
    seen = []
    async with watch.Watch().stream(
        crd.list_cluster_custom_object,
        "trainer.kubeflow.org",
        "v1alpha1",
        "trainjobs",
        resource_version=str(rv),
        timeout_seconds=1,
    ) as stream:
        async for event in stream:
            seen.append(
                (
                    event["type"],
                    event["object"]["metadata"]["name"],
                    event["object"]["metadata"]["resourceVersion"],
                )
            )
    assert seen == [("MODIFIED", "job-00000", str(rv + 1)), ("DELETED", "job-00001", str(rv + 2))]


async def test_too_old_resource_version_is_single_error_event(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    add_jobs(sim.store, 3)
    sim.faults.compact()
    async with http.get(TJ, params={"watch": "1", "resourceVersion": "1"}) as resp:
        assert resp.status == 200
        events = await read_events(resp)
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: 1 ({sim.store.resource_version})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


async def test_kubernetes_asyncio_sees_410(sim: SimulatedCluster, api: client.ApiClient) -> None:
    add_jobs(sim.store, 3)
    sim.faults.compact()
    crd = client.CustomObjectsApi(api)
    try:
        async with watch.Watch().stream(
            crd.list_cluster_custom_object,
            "trainer.kubeflow.org",
            "v1alpha1",
            "trainjobs",
            resource_version="1",
            timeout_seconds=2,
        ) as stream:
            async for _ in stream:
                pass
    except client.ApiException as exc:
        assert exc.status == 410
    else:
        raise AssertionError("expected ApiException(410)")


async def test_future_resource_version_waits(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    future = sim.store.resource_version + 2
    async with http.get(
        TJ, params={"watch": "1", "resourceVersion": str(future), "timeoutSeconds": "2"}
    ) as resp:
        add_jobs(sim.store, 3)
        events = await read_events(resp, 1)
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(future + 1)


async def test_selector_transitions(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    add_jobs(sim.store, 1)
    params = {
        "watch": "1",
        "labelSelector": "tier=gold",
        "resourceVersion": str(sim.store.resource_version),
        "timeoutSeconds": "3",
    }
    async with http.get(TJ, params=params) as resp:
        sim.store.patch(TRAINJOBS, "team1", "job-00000", {"metadata": {"labels": {"tier": "gold"}}})
        sim.store.patch(TRAINJOBS, "team1", "job-00000", {"spec": {"suspend": True}})
        sim.store.patch(TRAINJOBS, "team1", "job-00000", {"metadata": {"labels": {"tier": None}}})
        events = await read_events(resp, 3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[2]["object"]["metadata"]["labels"]["tier"] == "gold"  # previous content
    assert events[2]["object"]["metadata"]["resourceVersion"] == str(sim.store.resource_version)


async def test_field_selector_single_object(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    add_jobs(sim.store, 3)
    params = {"watch": "1", "fieldSelector": "metadata.name=job-00001", "timeoutSeconds": "1"}
    async with http.get(
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team1/trainjobs", params=params
    ) as resp:
        events = await read_events(resp)
    assert [e["object"]["metadata"]["name"] for e in events] == ["job-00001"]


async def test_bookmarks_periodic_and_before_deadline(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    sim.server.watches.bookmark_interval = 0.3
    add_jobs(sim.store, 1)
    rv = sim.store.resource_version
    params = {"watch": "1", "resourceVersion": str(rv), "allowWatchBookmarks": "true", "timeoutSeconds": "3"}
    async with http.get(TJ, params=params) as resp:
        events = await read_events(resp)
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"] == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"resourceVersion": str(rv)},
    }
    assert len(events) >= 3  # every 0.3 s until deadline-2 s, then the pre-deadline one


async def test_send_initial_events_end_bookmark(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    add_jobs(sim.store, 2)
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "2",
    }
    async with http.get(TJ, params=params) as resp:
        events = await read_events(resp, 3)
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    meta = events[2]["object"]["metadata"]
    assert meta == {
        "resourceVersion": str(sim.store.resource_version),
        "annotations": {"k8s.io/initial-events-end": "true"},
    }
    async with http.get(TJ, params={"watch": "1", "sendInitialEvents": "true"}) as resp:
        assert resp.status == 422


async def test_slow_watcher_is_closed_others_keep_going(sim: SimulatedCluster) -> None:
    sim.server.watches.queue_size = 5
    rv = sim.store.resource_version
    url = sim.url + TJ
    params = {"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "5"}
    async with aiohttp.ClientSession() as s1, aiohttp.ClientSession() as s2:
        slow = await s1.get(url, params=params)
        fast = await s2.get(url, params=params)
        fast_task = asyncio.create_task(read_events(fast, 50))
        await asyncio.sleep(0.05)
        sim.faults.stall_watches()  # freeze both writers so their queues fill up...
        add_jobs(sim.store, 3)
        sim.faults.release_watches()  # ...then the fast one drains; feed the rest
        await asyncio.sleep(0.05)
        for i in range(47):
            sim.store.create(TRAINJOBS, "team1", trainjob(f"more-{i}"))
            await asyncio.sleep(0)
        assert len(await fast_task) == 50
        slow.close()
        fast.close()
    assert sim.server.counters["watch_overflows"] == 0  # 3 pending < 5: nobody overflowed yet
    sim.server.watches.queue_size = 2
    async with aiohttp.ClientSession() as s3:
        w = await s3.get(url, params={**params, "resourceVersion": str(sim.store.resource_version)})
        await asyncio.sleep(0.05)
        sim.faults.stall_watches()
        add_jobs(sim.store, 5, prefix="burst")
        sim.faults.release_watches()
        events = await read_events(w)  # closed cleanly on overflow
    assert events == [] and sim.server.counters["watch_overflows"] == 1
