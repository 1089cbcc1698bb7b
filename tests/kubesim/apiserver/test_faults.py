"""Fault injection: 429/5xx, stalls, mid-chunk resets, compaction, restart, 401 after token change."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client, config

from kubesim.apiserver.core import LEASES
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS

from .conftest import add_jobs

TJ = TRAINJOBS.collection_path()


async def test_429_is_text_plain_with_retry_after(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    sim.faults.fail_next(2, status=429, resource="trainjobs")
    for _ in range(2):
        async with http.get(TJ) as resp:
            assert resp.status == 429 and resp.headers["Retry-After"] == "1"
            assert resp.content_type == "text/plain"
            assert await resp.text() == "Too many requests, please try again later.\n"
    async with http.get(LEASES.collection_path()) as resp:
        assert resp.status == 200
    async with http.get(TJ) as resp:
        assert resp.status == 200
    assert sim.faults.counters["status_429"] == 2


@pytest.mark.parametrize(
    ("code", "reason"), [(500, "InternalError"), (503, "ServiceUnavailable"), (504, "Timeout")]
)
async def test_5xx_are_status_bodies(
    sim: SimulatedCluster, http: aiohttp.ClientSession, code: int, reason: str
) -> None:
    sim.faults.fail_next(status=code, method="GET")
    async with http.get(TJ) as resp:
        body = await resp.json()
        assert resp.status == code
    assert body["kind"] == "Status" and body["reason"] == reason and body["code"] == code


async def test_stalled_request_hangs_until_released(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    sim.faults.stall_requests(resource="leases", method="PUT")
    put = asyncio.create_task(
        http.put(f"{LEASES.collection_path('team1')}/l", json={"metadata": {"name": "l"}})
    )
    await asyncio.sleep(0.2)
    assert not put.done() and sim.faults.counters["stalled_requests"] == 1
    sim.faults.release_requests()
    resp = await asyncio.wait_for(put, 2)
    assert resp.status == 201
    resp.close()


async def test_stalled_watch_sends_nothing(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    sim.server.watches.bookmark_interval = 0.1
    sim.faults.stall_watches(resource="trainjobs")
    params = {"watch": "1", "allowWatchBookmarks": "1", "timeoutSeconds": "1", "resourceVersion": "0"}
    async with http.get(TJ, params=params) as resp:
        assert resp.status == 200  # headers, then silence: no events, no bookmarks, no end at the deadline
        add_jobs(sim.store, 2)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(resp.content.readline(), 1.3)
        sim.faults.release_watches()
        added = orjson.loads(await asyncio.wait_for(resp.content.readline(), 1))
    # RV=0 without sendInitialEvents: no initial-events-end bookmark (nothing existed), the events follow.
    assert added["type"] == "ADDED"


async def test_reset_mid_chunk(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    add_jobs(sim.store, 1)
    params = {"watch": "1", "resourceVersion": str(sim.store.resource_version), "timeoutSeconds": "5"}
    async with http.get(TJ, params=params) as resp:
        await asyncio.sleep(0.05)
        assert sim.faults.reset_watches() == 1
        with pytest.raises(aiohttp.ClientPayloadError):
            async for line in resp.content:
                raise AssertionError(f"a half event must not parse as a line: {line!r}")
    sim.faults.reset_next_watches(after_events=1)
    add_jobs(sim.store, 1, prefix="second")
    async with http.get(TJ, params={"watch": "1", "timeoutSeconds": "5"}) as resp:
        first = await resp.content.readline()
        assert orjson.loads(first)["type"] == "ADDED"
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()
    assert sim.faults.counters["watch_resets"] == 2


async def test_restart_drops_watches_and_history(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    add_jobs(sim.store, 2)
    last, first = sim.store.resource_version, sim.store.resource_version - 1
    params = {"watch": "1", "resourceVersion": str(last), "timeoutSeconds": "30"}
    async with http.get(TJ, params=params) as resp:
        await asyncio.sleep(0.05)
        assert sim.faults.restart() == 1
        assert await asyncio.wait_for(resp.content.read(), 2) == b""  # ended, no ERROR
    params = {"watch": "1", "resourceVersion": str(first), "timeoutSeconds": "1"}
    async with http.get(TJ, params=params) as resp:
        event = orjson.loads(await resp.content.readline())
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    assert sim.store.count(TRAINJOBS) == 2


async def test_after_a_restart_etcd_still_answers_exact_lists_until_compaction(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    """A restart starts a new watch cache (old watches get 410) but etcd keeps its revisions: a LIST with
    resourceVersionMatch=Exact at an older revision still shows the objects as they were then."""
    add_jobs(sim.store, 1)
    at = sim.store.resource_version
    add_jobs(sim.store, 2, prefix="later")
    sim.faults.restart()
    exact = {"resourceVersion": str(at), "resourceVersionMatch": "Exact"}
    async with http.get(TJ, params=exact) as resp:
        body = await resp.json()
    assert resp.status == 200 and len(body["items"]) == 1
    assert body["metadata"]["resourceVersion"] == str(at)
    sim.faults.compact()
    async with http.get(TJ, params=exact) as resp:
        assert resp.status == 410 and (await resp.json())["reason"] == "Expired"


async def test_401_after_token_change(sim: SimulatedCluster, tmp_path: Path) -> None:
    sim.faults.set_token("old-token")
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(sim.write_kubeconfig(tmp_path / "kc")), client_configuration=cfg
    )
    async with client.ApiClient(cfg) as api:
        coord = client.CoordinationV1Api(api)
        assert (await coord.list_namespaced_lease("ns")).items == []
        sim.faults.set_token("new-token")
        try:
            await coord.list_namespaced_lease("ns")
        except client.ApiException as exc:
            assert exc.status == 401 and orjson.loads(exc.body)["reason"] == "Unauthorized"
        else:
            raise AssertionError("expected 401")
