"""Stale-watch detection in the probes (issue "Reliability and security", item 2).

A TrainJob watch that is silently dead (``sim.faults.stall_watches(resource="trainjobs")``: headers sent,
then no byte, no bookmark, no close) must be reported: ``/readyz`` 503 naming the informer and
``trainer_metrics_informer_stale{informer="trainjobs"} 1`` within ``watch_inactivity_timeout_seconds``, for
as long as the watch stays silent. The informer restarts the watch by itself on the inactivity timeout;
once the stall is released it recovers: the events written during the stall arrive, ``/readyz`` is 200
again, the stale gauge back to 0. A watch that delivers only bookmarks is alive: never stale.

One replica, leader election off (nothing here is about leadership), a 2 s inactivity timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.kube.informer import Informer
from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from tests.support.replica_inprocess import Replica, replica
from tests.support.samples import total
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

INACTIVITY = 2.0
INFORMER = "trainjobs"


async def _stale_gauge(r: Replica, informer: str = INFORMER) -> float:
    return total(await r.samples(), "trainer_metrics_informer_stale", informer=informer)


async def _readyz(r: Replica) -> tuple[int, str]:
    resp = await r.http.get("/readyz")
    return resp.status_code, resp.text


def _trainjob_informer(r: Replica) -> Informer[Any]:
    return next(i for i in r.service.informers if i.name == INFORMER)


def _runtime_informer(r: Replica) -> Informer[Any]:
    return next(i for i in r.service.informers if i.name == "clustertrainingruntimes")


@pytest.fixture
def sim_options() -> dict[str, Any]:
    # Bookmarks every 0.5 s: a healthy idle watch is never silent for as long as the inactivity timeout.
    return {"bookmark_interval": 0.5, "load_runtimes": True}


@pytest.fixture
def gen(sim: SimulatedCluster) -> WorkloadGenerator:
    g = WorkloadGenerator(sim.store, seed=7, namespaces=2, finalizer_ratio=0.0)
    g.load_runtimes()
    for _ in range(20):
        g.create_job(suspended=False)
    return g


@pytest.fixture
async def one(sim: SimulatedCluster, gen: WorkloadGenerator, tmp_path: Path) -> AsyncIterator[Replica]:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    async with replica(
        kubeconfig, "stale-a", leader_election=False, watch_inactivity_timeout_seconds=INACTIVITY
    ) as r:
        await eventually(r.ready, timeout=20, what="replica ready")
        yield r


async def test_silent_watch_is_reported_stale_until_it_recovers(sim: SimulatedCluster, one: Replica) -> None:
    """Within the inactivity timeout /readyz is 503 naming the TrainJob informer and the stale gauge is 1,
    and both stay so for as long as the stall lasts (here three more inactivity timeouts)."""
    assert await _stale_gauge(one) == 0.0
    sim.faults.stall_watches(resource="trainjobs")
    stalled_at = time.monotonic()
    try:

        async def not_ready() -> str | None:
            code, body = await _readyz(one)
            return body if code == 503 else None

        body = await eventually(not_ready, timeout=INACTIVITY + 3.0, interval=0.02, what="/readyz 503")
        # The timeout plus scheduling noise on a shared machine; never earlier than the last byte allows.
        assert time.monotonic() - stalled_at <= INACTIVITY + 3.0
        assert f"informer {INFORMER} is stale" in body, body
        # Only the TrainJob watch is stalled: the runtime informers keep receiving bookmarks.
        assert "trainingruntimes" not in body, body

        samples: list[tuple[float, int, float]] = []
        deadline = time.monotonic() + 3 * INACTIVITY
        while time.monotonic() < deadline:
            code, _ = await _readyz(one)
            samples.append((round(time.monotonic() - stalled_at, 3), code, await _stale_gauge(one)))
            await asyncio.sleep(0.05)
        healthy = [s for s in samples if s[1] != 503 or s[2] != 1.0]
        assert not healthy, f"{len(healthy)}/{len(samples)} samples not stale during the stall: {healthy[:5]}"
    finally:
        sim.faults.release_watches()
    await eventually(one.ready, timeout=10, what="/readyz 200 after release")
    assert await _stale_gauge(one) == 0.0


async def test_informer_restarts_silent_watch_and_recovers_after_release(
    sim: SimulatedCluster, gen: WorkloadGenerator, one: Replica
) -> None:
    """The informer abandons the silent watch on the inactivity timeout (a watch restart counted as
    'inactivity', no relist needed), and after the release catches up on what was written meanwhile."""
    informer = _trainjob_informer(one)
    restarts_before = informer.counters.watch_restarts["inactivity"]
    sim.faults.stall_watches(resource="trainjobs")
    before = gen.snapshot()
    for _ in range(10):
        gen.create_job(suspended=False)
    rec = next(iter(gen.jobs.values()))
    gen.start(rec)
    gen.finish(rec, "Complete")
    during = gen.snapshot()
    assert during.created_since(before)
    try:
        # Two bookmarks on an unstalled watch: the server has had a full bookmark interval, after the
        # writes, in which the stalled watch could have let them through.
        runtimes = _runtime_informer(one)
        bookmarks = runtimes.counters.bookmark
        await eventually(lambda: runtimes.counters.bookmark >= bookmarks + 2, timeout=5, what="bookmarks")
        assert int(informer.resource_version) < during.resource_version, "the stall let events through"
        await eventually(
            lambda: informer.counters.watch_restarts["inactivity"] >= restarts_before + 2,
            timeout=3 * INACTIVITY + 5,
            what="two watch restarts on inactivity",
        )
        assert int(informer.resource_version) < during.resource_version, "the stall let events through"
    finally:
        sim.faults.release_watches()
    # Recovery: every object written during the stall is in the cache, readiness and the gauge are back.
    await eventually(
        lambda: int(informer.resource_version or 0) >= during.resource_version,
        timeout=INACTIVITY + 10,
        what="the informer catching up",
    )
    stored = {
        f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in sim.store.list(TRAINJOBS, None)[0]
    }
    assert set(informer.keys()) == set(stored)
    cached = informer.get(f"{rec.namespace}/{rec.name}")
    assert (
        cached is not None
        and cached.resource_version == stored[f"{rec.namespace}/{rec.name}"]["metadata"]["resourceVersion"]
    )
    await eventually(one.ready, timeout=10, what="/readyz 200 after release")
    assert await _stale_gauge(one) == 0.0
    assert informer.counters.relists["expired"] == 0  # resumed from its RV, no relist needed


async def test_watch_with_only_bookmarks_is_not_stale(sim: SimulatedCluster, one: Replica) -> None:
    """No object changes for three inactivity timeouts, bookmarks every 0.5 s: ready and never stale."""
    rv = sim.store.resource_version
    informer = _trainjob_informer(one)
    bookmarks_before = informer.counters.bookmark
    deadline = time.monotonic() + 3 * INACTIVITY
    bad: list[tuple[int, str, float]] = []
    checks = 0
    while time.monotonic() < deadline:
        code, body = await _readyz(one)
        gauge = await _stale_gauge(one)
        checks += 1
        if code != 200 or gauge != 0.0:
            bad.append((code, body, gauge))
        await asyncio.sleep(0.1)
    assert sim.store.resource_version == rv, "something wrote objects: this test needs an idle cluster"
    assert informer.counters.bookmark - bookmarks_before >= 3, "the watch received (almost) no bookmarks"
    assert informer.counters.watch_restarts["inactivity"] == 0
    assert not bad, f"{len(bad)}/{checks} checks saw a stale informer: {bad[:3]}"
