"""Informer against the simulated cluster (kubesim): real HTTP, real resourceVersions, injected faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.kube.client import KubeClient
from app.kube.informer import Informer
from app.kube.informer_telemetry import InformerTelemetry
from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.informer_fakes import Recorder
from tests.support.informer_sim_env import OPTS, Env, informer_env, job, options
from tests.support.kubeconfig import write_kubeconfig
from tests.support.waiting import eventually


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with informer_env(tmp_path, Env) as e:
        yield e


async def test_initial_list_then_watch_and_bookmarks(env: Env) -> None:
    a, b = env.create("a"), env.create("b", ns="team2")
    inf = env.start()
    await env.watching()
    assert sorted(env.calls()) == [
        ("added", "team1/a", a["metadata"]["resourceVersion"], True),
        ("added", "team2/b", b["metadata"]["resourceVersion"], True),
    ]
    c = env.create("c")
    m = env.modify("a", suspend=True)
    d = env.delete("b", ns="team2")
    await eventually(lambda: len(env.calls()) == 5)
    assert env.calls()[2:] == [
        ("added", "team1/c", c["metadata"]["resourceVersion"], False),
        ("updated", "team1/a", a["metadata"]["resourceVersion"], m["metadata"]["resourceVersion"]),
        ("deleted", "team2/b", d["metadata"]["resourceVersion"]),  # the deletion RV
    ]
    await eventually(lambda: inf.counters.bookmark >= 1, timeout=3)
    env.assert_matches_store()
    assert not inf.stale


async def test_paginated_list(env: Env) -> None:
    for i in range(23):
        env.create(f"j{i:02d}")
    inf = env.start(options(page_size=5))
    await env.watching()
    assert len(inf) == 23 and all(c[3] is True for c in env.calls())
    env.assert_matches_store()


async def test_relist_after_compaction_delivers_gap_edges_once(env: Env) -> None:
    a, b = env.create("a"), env.create("b")
    env.create("c")
    telemetry = InformerTelemetry()
    inf = env.start(telemetry=telemetry)
    await env.watching()
    env.calls().clear()
    # Freeze the stream, change things during the gap, compact, then let the watch die.
    env.sim.faults.stall_watches()
    d = env.create("d")
    m = env.modify("a", suspend=True)
    env.delete("b")
    env.create("e")
    env.delete("e")
    env.sim.faults.compact()
    env.sim.faults.restart(abrupt=True)
    env.sim.faults.release_watches()
    await eventually(lambda: inf.counters.relists["expired"] >= 1 and inf.watching)
    # The first list and the relist, each a transient the heap trimmer follows (app/replica/heap_trim.py).
    assert inf.counters.lists == 2 and telemetry.lists_applied() == 2
    assert sorted(env.calls()) == sorted(
        [
            ("added", "team1/d", d["metadata"]["resourceVersion"], False),
            ("updated", "team1/a", a["metadata"]["resourceVersion"], m["metadata"]["resourceVersion"]),
            ("deleted", "team1/b", b["metadata"]["resourceVersion"]),
        ]
    )
    env.assert_matches_store()
    before = len(env.calls())
    env.modify("c", suspend=True)
    await eventually(lambda: len(env.calls()) == before + 1)
    assert env.calls()[-1][0] == "updated"  # nothing re-added


async def test_clean_close_rewatches_without_relist(env: Env) -> None:
    env.create("a")
    inf = env.start(options(watch_timeout_range=(1, 1)))
    await env.watching()
    await eventually(lambda: inf.counters.watch_restarts["closed"] >= 2, timeout=5)
    env.create("b")
    await eventually(lambda: len(env.calls()) == 2)
    assert sum(inf.counters.relists.values()) == 0
    env.assert_matches_store()


async def test_stalled_stream_detected_by_inactivity_and_recovered(env: Env) -> None:
    env.create("a")
    inf = env.start(options(inactivity_timeout=0.5))
    await env.watching()
    env.sim.faults.stall_watches()
    env.create("b")
    await eventually(lambda: inf.counters.watch_restarts["inactivity"] >= 1, timeout=3)
    env.sim.faults.release_watches()
    await eventually(lambda: len(env.calls()) == 2)
    assert sum(inf.counters.relists.values()) == 0
    env.assert_matches_store()


async def test_reset_mid_chunk_resumes_without_duplicates(env: Env) -> None:
    env.create("a")
    inf = env.start()
    await env.watching()
    env.sim.faults.reset_next_watches(1, after_events=1)
    assert env.sim.faults.reset_watches() >= 1
    for i in range(5):
        env.create(f"n{i}")
    await eventually(lambda: len(env.calls()) == 6)
    await eventually(lambda: inf.counters.watch_restarts["reset"] >= 2)
    assert [c[0] for c in env.calls()] == ["added"] * 6
    assert sum(inf.counters.relists.values()) == 0 and inf.counters.skipped["malformed"] == 0
    env.assert_matches_store()


async def test_429_text_plain_with_retry_after(env: Env) -> None:
    env.create("a")
    env.sim.faults.fail_next(1, status=429, retry_after=1, watch=True)
    inf = env.start()
    await eventually(lambda: inf.counters.watch_restarts["throttled"] == 1)
    t0 = time.monotonic()
    await env.watching()
    assert time.monotonic() - t0 >= 0.8
    assert sum(inf.counters.relists.values()) == 0


@pytest.mark.parametrize("status", [500, 503, 504])
async def test_5xx_on_watch_and_list(env: Env, status: int) -> None:
    env.create("a")
    env.sim.faults.fail_next(1, status=status, retry_after=0, watch=False)
    env.sim.faults.fail_next(1, status=status, retry_after=0, watch=True)
    inf = env.start()
    await eventually(lambda: inf.counters.relists["watch_failed"] == 1 and inf.watching)
    assert env.calls() == [
        ("added", "team1/a", env.sim.store.get(TRAINJOBS, "team1", "a")["metadata"]["resourceVersion"], True)
    ]


async def test_server_restart(env: Env) -> None:
    for n in "abc":
        env.create(n)
    inf = env.start()
    await env.watching()
    port = env.sim.port
    await env.sim.stop()
    env.delete("a")
    env.create("d")
    await eventually(lambda: inf.counters.watch_restarts["refused"] >= 1)
    env.sim.port = port
    env.sim.store.compact()
    await env.sim.start()
    await eventually(lambda: inf.watching and len(inf) == 3, timeout=5)
    env.assert_matches_store()
    kinds = [c[:2] for c in env.calls()[3:]]
    assert sorted(kinds) == [("added", "team1/d"), ("deleted", "team1/a")]


async def test_odd_and_oversized_objects_are_survived(env: Env) -> None:
    env.create("a")
    inf = env.start()
    await env.watching()
    env.create("odd", numNodes="many")  # odd field type: the test projector's typed decode is unaffected
    env.sim.store.create(
        TRAINJOBS,
        "team1",
        {**job("huge"), "metadata": {"name": "huge", "annotations": {"x": "y" * (100 * 1024)}}},
    )
    await eventually(lambda: inf.counters.skipped["too_large"] >= 1)
    await eventually(lambda: inf.watching and inf.counters.relists["oversized_line"] >= 1)
    env.create("after")
    await eventually(lambda: inf.get("team1/after") is not None)
    assert inf.get("team1/odd") is not None


async def test_real_trainjob_projector(env: Env) -> None:
    from app.trainer.informer_projectors import TrainJobProjector

    env.create("a", trainer={"numNodes": 3})
    recorder = Recorder()
    inf: Informer[Any] = Informer(env.client, TRAINJOBS, "team1", TrainJobProjector(), recorder, options=OPTS)
    task = asyncio.create_task(inf.run())
    try:
        await eventually(lambda: inf.synced)
        got = inf.get("team1/a")
        assert got is not None and got.num_nodes == 3
        env.create("b", trainer={"numNodes": "lots"})  # unusable type: tolerant path keeps the object
        await eventually(lambda: inf.get("team1/b") is not None)
        assert inf.name == "trainjobs/team1"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_rotated_token_401_is_reloaded_and_retried(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t1")
    async with SimulatedCluster(token="t1", bookmark_interval=0.5) as sim:
        cfg = write_kubeconfig(tmp_path / "kubeconfig", sim.url, token_file=token_file)
        client = await KubeClient.connect(str(cfg))
        e = Env(sim, client)
        e.create("a")
        inf = e.start()
        try:
            await e.watching()
            token_file.write_text("t2")  # kubelet rotated the projected token
            sim.faults.set_token("t2")
            sim.faults.restart()  # the next watch needs the new token
            e.create("b")
            await eventually(lambda: inf.get("team1/b") is not None and inf.watching)
            assert inf.counters.watch_restarts["error"] >= 1 or inf.counters.watch_restarts["closed"] >= 1
            assert sim.faults.counters["unauthorized"] >= 1
        finally:
            assert e.task is not None
            e.task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await e.task
            await client.close()
