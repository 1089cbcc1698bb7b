"""LeaseElector against the simulated cluster over real HTTP (KubeClient + KubeLeaseClient), real time.

Durations are small (lease 1.5 s, written to the Lease as 2 s; deadline 1.0 s; retry 0.2 s). Each candidate
has its own KubeClient, like separate replicas. For faults that must hit one replica only, a second
SimulatedCluster serves the same Store on another port (faults are per server).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from app.kube.client import KubeClient
from app.kube.elector import LeaseElector
from app.kube.elector_api import ElectorConfig
from app.kube.lease import KubeLeaseClient, LeaseRecord, parse_lease
from app.kube.microtime import parse_microtime
from app.kube.resources import LEASES
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.store import Store
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.election import Timeline  # loop time, which is time.monotonic() here

NS, NAME = "monitoring", "trainer-metrics"
WATERMARK = "trainer-metrics.kubeflow.org/watermark"
LEASE, DEADLINE, RETRY = 1.5, 1.0, 0.2
LEASE_WRITTEN = 2  # whole seconds, rounded up

pytestmark = pytest.mark.timeout(60)


class Candidate:
    def __init__(
        self,
        identity: str,
        kube: KubeClient,
        timeline: Timeline,
        *,
        release_on_cancel: bool = True,
        annotations: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.identity = identity
        self.kube = kube
        self.timeline = timeline
        self.elector = LeaseElector(
            KubeLeaseClient(kube, request_timeout=DEADLINE),
            ElectorConfig(NAME, NS, identity, LEASE, DEADLINE, RETRY, release_on_cancel=release_on_cancel),
            self,
            annotations=annotations,
        )
        self.task: asyncio.Task[None] | None = None

    def on_started_leading(self, previous: LeaseRecord | None) -> None:
        self.timeline.started(self.identity, previous)

    def on_stopped_leading(self) -> None:
        self.timeline.stopped(self.identity)

    def on_new_leader(self, identity: str | None) -> None:
        pass

    def start(self) -> Candidate:
        self.task = asyncio.create_task(self.elector.run(), name=self.identity)
        return self

    async def stop(self) -> None:
        if self.task is None or self.task.done():
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        assert self.task.cancelled()


class Replicas:
    """Creates candidates with their own clients and always cleans up (tasks first, then sessions)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.timeline = Timeline()
        self.candidates: list[Candidate] = []
        self._clients: list[KubeClient] = []

    async def add(self, identity: str, sim: SimulatedCluster, **kwargs: Any) -> Candidate:
        path = sim.write_kubeconfig(self.tmp_path / f"kubeconfig-{identity}-{sim.port}")
        kube = await KubeClient.connect(kubeconfig=str(path))
        self._clients.append(kube)
        cand = Candidate(identity, kube, self.timeline, **kwargs)
        self.candidates.append(cand)
        return cand.start()

    def by_identity(self, identity: str) -> Candidate:
        return next(c for c in self.candidates if c.identity == identity)

    async def close(self) -> None:
        for c in self.candidates:
            await c.stop()
        for kube in self._clients:
            await kube.close()


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    r = Replicas(tmp_path)
    try:
        yield r
    finally:
        await r.close()


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def stored_lease(store: Store) -> dict[str, Any]:
    return store.get(LEASES, NS, NAME)


def lease_exists(store: Store) -> bool:
    try:
        stored_lease(store)
    except StoreError:  # NotFound
        return False
    return True


async def test_single_candidate_creates_the_lease_with_valid_microtimes(
    sim: SimulatedCluster, replicas: Replicas
) -> None:
    a = await replicas.add("a", sim, annotations=lambda: {WATERMARK: "41"})
    await wait_until(lambda: replicas.timeline.leaders() == ["a"])
    first = stored_lease(sim.store)["spec"]["renewTime"]
    await wait_until(lambda: stored_lease(sim.store)["spec"]["renewTime"] != first)  # a renew
    lease = stored_lease(sim.store)
    spec = lease["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == LEASE_WRITTEN
    assert spec["leaseTransitions"] == 0
    for key in ("acquireTime", "renewTime"):  # the sim would have rejected anything else, but be explicit
        assert len(spec[key]) == 27 and spec[key].endswith("Z")
        parse_microtime(spec[key])
    assert spec["renewTime"] > spec["acquireTime"]
    assert lease["metadata"]["annotations"] == {WATERMARK: "41"}
    st = a.elector.status()
    assert st.is_leader and st.holder == "a" and st.lease_transitions == 0
    await a.stop()
    spec = stored_lease(sim.store)["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("", 1, 0)


async def test_three_candidates_one_leader_at_every_instant_and_quick_graceful_handover(
    sim: SimulatedCluster, replicas: Replicas
) -> None:
    tl = replicas.timeline
    for name in ("a", "b", "c"):
        await replicas.add(name, sim, annotations=lambda name=name: {WATERMARK: f"wm-{name}"})
    samples = 0

    async def sampler() -> None:
        nonlocal samples
        while True:
            assert len(tl.leaders()) <= 1, tl.leaders()
            holders = [c.identity for c in replicas.candidates if c.elector.is_leader]
            assert len(holders) <= 1, holders
            samples += 1
            await asyncio.sleep(0.005)

    sampling = asyncio.create_task(sampler())
    try:
        await wait_until(lambda: len(tl.leaders()) == 1)
        await asyncio.sleep(1.0)
        assert len(tl.intervals) == 1
        for _ in range(2):  # two graceful hand-overs
            leader = replicas.by_identity(tl.leaders()[0])
            stopped_at = time.monotonic()
            await leader.stop()
            await wait_until(lambda: len(tl.leaders()) == 1)
            new = tl.intervals[-1]
            # released Lease: taken on the followers' next attempt (retry * [1, 2.2]) plus HTTP latency
            assert new[1] - stopped_at < 2.2 * RETRY + 0.3
            previous: LeaseRecord = new[3]
            assert previous.holder_identity == ""
            assert previous.annotations[WATERMARK] == f"wm-{leader.identity}"
            await asyncio.sleep(0.5)
        assert not sampling.done()
    finally:
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
    assert samples > 100
    tl.assert_no_overlap()
    assert stored_lease(sim.store)["spec"]["leaseTransitions"] == 2


async def test_killed_leader_is_replaced_only_after_the_lease_duration(
    sim: SimulatedCluster, replicas: Replicas
) -> None:
    tl = replicas.timeline
    a = await replicas.add("a", sim, release_on_cancel=False)
    await wait_until(lambda: tl.leaders() == ["a"])
    b = await replicas.add("b", sim)
    await wait_until(lambda: b.elector.status().holder == "a")
    renews_before = stored_lease(sim.store)["metadata"]["resourceVersion"]
    await a.stop()  # like SIGKILL: no release
    killed_at = time.monotonic()
    lease = stored_lease(sim.store)
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["metadata"]["resourceVersion"] >= renews_before
    await wait_until(lambda: tl.leaders() == ["b"])
    taken_at = tl.intervals[-1][1]
    # b waits for the record to stay unchanged for leaseDurationSeconds (a renewed < 1 retry before the kill)
    assert taken_at - killed_at >= LEASE_WRITTEN - RETRY - 0.05
    assert taken_at - killed_at <= LEASE_WRITTEN + 2 * 2.2 * RETRY + 0.3
    assert stored_lease(sim.store)["spec"]["leaseTransitions"] == 1
    assert tl.intervals[-1][3].holder_identity == "a"
    await b.stop()


async def test_hung_requests_stop_the_leader_before_the_follower_takes_over(
    sim: SimulatedCluster, replicas: Replicas
) -> None:
    tl = replicas.timeline
    # a reaches the API through its own server (same store), so only a's requests hang
    async with SimulatedCluster(host="127.0.0.1", port=0, store=sim.store) as a_sim:
        a = await replicas.add("a", a_sim)
        await wait_until(lambda: tl.leaders() == ["a"])
        b = await replicas.add("b", sim)
        await wait_until(lambda: b.elector.status().holder == "a")
        a_sim.faults.stall_requests(resource="leases")
        stalled_at = time.monotonic()
        await wait_until(lambda: tl.leaders() != ["a"])
        a_stopped = tl.intervals[0][2]
        # a's last successful renew was sent at most one retry period (+ latency) before the stall
        assert a_stopped - stalled_at <= DEADLINE + 0.05
        await wait_until(lambda: tl.leaders() == ["b"])
        b_started = tl.intervals[1][1]
        tl.assert_no_overlap()
        # b waited a whole lease from its last observed change, which is after a's last renew
        assert b_started - stalled_at >= LEASE_WRITTEN - RETRY - 0.1
        assert b_started > a_stopped + 0.3
        # when a's network recovers it stays a follower
        a_sim.faults.release_requests()
        await wait_until(lambda: a.elector.status().holder == "b")
        assert tl.leaders() == ["b"]
        await a.stop()
        await b.stop()


async def test_429_and_5xx_during_renew(sim: SimulatedCluster, replicas: Replicas) -> None:
    tl = replicas.timeline
    a = await replicas.add("a", sim)
    await wait_until(lambda: tl.leaders() == ["a"])
    # a short burst (429 text/plain, 5xx Status) is ridden out within the renew deadline
    sim.faults.fail_next(2, status=429, resource="leases")
    sim.faults.fail_next(1, status=503, resource="leases")
    sim.faults.fail_next(1, status=500, resource="leases")
    await wait_until(lambda: sim.faults.counters["status_500"] == 1)  # the last of the burst
    renewed = stored_lease(sim.store)["spec"]["renewTime"]
    await wait_until(lambda: stored_lease(sim.store)["spec"]["renewTime"] != renewed)
    assert len(tl.intervals) == 1 and tl.leaders() == ["a"]
    assert sim.faults.counters["status_429"] == 2 and sim.faults.counters["status_503"] == 1
    # a lasting outage: the leader stops within the deadline, then re-acquires its own Lease
    sim.faults.fail_next(10_000, status=503, resource="leases")
    outage = time.monotonic()
    await wait_until(lambda: tl.leaders() == [])
    assert tl.intervals[0][2] - outage <= DEADLINE + RETRY + 0.1
    sim.faults.clear()
    await wait_until(lambda: tl.leaders() == ["a"])
    spec = stored_lease(sim.store)["spec"]
    assert spec["holderIdentity"] == "a"
    await a.stop()


async def test_lease_deleted_under_the_leader_is_recreated(sim: SimulatedCluster, replicas: Replicas) -> None:
    tl = replicas.timeline
    a = await replicas.add("a", sim)
    await wait_until(lambda: tl.leaders() == ["a"])
    b = await replicas.add("b", sim)
    await wait_until(lambda: b.elector.status().holder == "a")
    acquire = stored_lease(sim.store)["spec"]["acquireTime"]
    sim.store.delete(LEASES, NS, NAME)
    await wait_until(lambda: lease_exists(sim.store))
    lease = stored_lease(sim.store)
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["acquireTime"] == acquire
    assert len(tl.intervals) == 1 and tl.leaders() == ["a"]
    await asyncio.sleep(2.5)  # b never jumped in, not even after the old record's duration
    assert len(tl.intervals) == 1
    await a.stop()
    await b.stop()


async def test_racing_candidates_with_a_pre_existing_expired_lease(
    sim: SimulatedCluster, replicas: Replicas
) -> None:
    tl = replicas.timeline
    sim.store.create(
        LEASES,
        NS,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": NAME, "namespace": NS, "labels": {"app": "trainer-metrics"}},
            "spec": {
                "holderIdentity": "old-pod",
                "leaseDurationSeconds": 1,
                "acquireTime": "2025-03-01T10:00:00.000000Z",
                "renewTime": "2025-03-01T10:00:00.000000Z",
                "leaseTransitions": 6,
            },
        },
    )
    for name in ("a", "b", "c", "d"):
        await replicas.add(name, sim)
    await wait_until(lambda: len(tl.leaders()) == 1)
    await asyncio.sleep(1.5)
    assert len(tl.intervals) == 1
    lease = stored_lease(sim.store)
    rec = parse_lease(lease)
    assert rec.holder_identity == tl.leaders()[0] and rec.lease_transitions == 7
    assert lease["metadata"]["labels"] == {"app": "trainer-metrics"}
    assert tl.intervals[0][3].holder_identity == "old-pod"
    # everyone agrees on the holder
    await wait_until(
        lambda: all(c.elector.status().holder == rec.holder_identity for c in replicas.candidates)
    )
