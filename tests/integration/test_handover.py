"""Hand-over between replicas: counts across leaders' terms against the workload generator's ground truth.

Several Service replicas run in one test against the simulated cluster while the generator creates and
finishes TrainJobs continuously. What is checked (docs/leadership.md states the guarantee):

* graceful hand-over (leader stopped → Lease released with its final watermark): a follower leads within
  a retry period or two, and the counters summed over the leaders' terms equal the ground truth EXACTLY,
  per series and per TrainJob uid;
* crash (Service.kill(): no release) and a leader whose Lease API calls hang or fail: it stops exporting
  no later than renew_deadline after its last renew, the follower exports only after the lease duration,
  nothing is lost, and what is counted twice is exactly the old leader's events above the watermark it
  last published, all counted inside one renew period before it stopped.

Timings are FAST_TIMINGS (lease 1.5 s, written to the Lease as 2 s; renew deadline 1.0 s; retry 0.2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.handover.watermarks import WATERMARK_ANNOTATION
from app.kube.lease import parse_lease
from app.kube.microtime import parse_microtime
from kubesim.apiserver.core import LEASES
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.harness import CountedEvent, ExporterSampler, Fleet, LeaseLog, LeaseWrite, counter_values
from tests.support.replica_inprocess import FAST_TIMINGS, STEADY_TIMINGS, Replica
from tests.support.samples import parse_samples
from tests.support.waiting import LoopLag, eventually

pytestmark = pytest.mark.timeout(120)

LEASE_NS, LEASE_NAME = "default", "trainer-metrics"
RETRY = FAST_TIMINGS["retry_period_seconds"]
RENEW_DEADLINE = FAST_TIMINGS["renew_deadline_seconds"]
LEASE_WRITTEN = math.ceil(FAST_TIMINGS["lease_duration_seconds"])  # whole seconds in the Lease: 2
GENERATOR_RATE = 80.0  # steps per second; each step makes at most one countable event
CLOCK_TOLERANCE = 0.05  # wall (Lease renewTime) to monotonic conversion, both read in this process
SCHEDULING_SLACK = 0.3  # a reaction to a timer: the callback chain after it fires, on an unloaded loop
TERM_EVENTS = 20  # what each leader counts in its term before the test moves on (~1 s at GENERATOR_RATE)
# Bound of the waits for an election outcome (a timeout only; the timings asserted come from records).
TAKEOVER_TIMEOUT = 5 * LEASE_WRITTEN
ZERO_HOLD = FAST_TIMINGS["zero_hold_seconds"]

Counts = dict[str, dict[tuple[str, ...], int]]


# --------------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def workload_options() -> dict[str, Any]:
    # 60 TrainJobs in every replica's initial list: never counted (tests/conftest.py: workload)
    return {"seed": 20260401, "max_jobs": 150, "populate": 60}


def step_downs_before(
    fleet: Fleet, identity: str, before: float, caplog: pytest.LogCaptureFixture
) -> list[tuple[float, float]]:
    """The windows from each time ``identity`` stopped leading before ``before`` to the next start of any
    replica. On a loaded machine a renew round can begin past the renew deadline, and the leader then steps
    down, as it must (app/kube/elector.py, ``_renew_round``); that gap is the elector's own, not the fault
    under test. Each such stop must have logged that reason: any other early stop is a failure."""
    early = [c.at for c in fleet.changes if c.identity == identity and not c.leading and c.at < before]
    late_rounds = [
        r
        for r in caplog.records
        if r.name == "app.kube.elector"
        and f"{identity} stopped leading" in r.getMessage()
        and ("renew deadline" in r.getMessage() or "renew_deadline" in r.getMessage())
    ]
    assert len(early) <= len(late_rounds), (early, [r.getMessage() for r in caplog.records])
    windows = []
    for stop in early:
        restart = min((c.at for c in fleet.changes if c.leading and c.at > stop), default=before)
        windows.append((stop, restart))
    return windows


@contextlib.asynccontextmanager
async def generating(gen: WorkloadGenerator, rate: float = GENERATOR_RATE) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(gen.run(rate, stop), name="workload")
    try:
        yield
    finally:
        stop.set()
        await task


def truth_counts(after: TruthSnapshot, before: TruthSnapshot) -> Counts:
    return {
        "created": {k: v for k, v in after.created_since(before).items()},
        "finished": {k: v for k, v in after.finished_since(before).items()},
    }


def add_counts(total: Counts, delta: Counts, sign: int = 1) -> None:
    for kind, series in delta.items():
        into = total.setdefault(kind, {})
        for key, value in series.items():
            into[key] = into.get(key, 0) + sign * value
            if not into[key]:
                del into[key]


def diff_counts(end: Counts, start: Counts) -> Counts:
    out: Counts = {}
    add_counts(out, end)
    add_counts(out, start, -1)
    return out


def new_uids(after: TruthSnapshot, before: TruthSnapshot) -> dict[str, set[str]]:
    return {
        "created": {uid for uid in after.requests if uid not in before.requests},
        "finished": {uid for uid in after.terminal if uid not in before.terminal},
    }


def counted_uids(events: list[CountedEvent]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {"created": Counter(), "finished": Counter()}
    for e in events:
        out[e.kind][e.uid] += 1
    return out


@dataclass
class Published:
    """What a Lease says about its holder's last renew: the hand-over watermark and when it was built."""

    holder: str
    watermark: int | None
    renew_monotonic: float


def published(write: LeaseWrite, wall_minus_mono: float) -> Published:
    raw = write.annotations.get(WATERMARK_ANNOTATION)
    assert write.renew_time is not None
    renew = parse_microtime(write.renew_time).timestamp() - wall_minus_mono
    return Published(write.holder, int(raw) if raw is not None else None, renew)


async def settle(fleet: Fleet, gen: WorkloadGenerator) -> None:
    """After the generator stopped: every live replica has seen its last write (and flushed)."""
    rv = gen.truth.resource_version
    await eventually(lambda: fleet.caught_up(rv), timeout=20, what=f"replicas caught up with rv {rv}")
    for r in fleet.alive():
        r.service.state.flush_pending()


async def leader_then_follower(fleet: Fleet, kubeconfig: Path, **overrides: Any) -> tuple[Replica, Replica]:
    """Replica "a" leads before "b" starts; returns both once "b" runs its elector too."""
    a = await fleet.add(kubeconfig, "a", **overrides)
    await fleet.wait_leader()
    b = await fleet.add(kubeconfig, "b", **overrides)
    await fleet.wait_candidates(timeout=30)
    return a, b


async def exported_counts(r: Replica) -> Counts:
    """The leader's counters as Prometheus scrapes them."""
    samples = parse_samples(await r.metrics_text())
    out: Counts = {"created": {}, "finished": {}}
    for (name, labels), value in samples.items():
        d = dict(labels)
        if name == "kubeflow_trainer_trainjob_created_total":
            out["created"][(d["namespace"], d["runtime_ref"])] = int(value)
        elif name == "kubeflow_trainer_trainjob_finished_total":
            out["finished"][(d["result"], d["reason"], d["runtime_ref"])] = int(value)
    return out


# --------------------------------------------------------------------------------------------------
# graceful hand-over
# --------------------------------------------------------------------------------------------------


# Only releases hand over in the graceful test, so its lease can be long: STEADY_TIMINGS.
async def test_graceful_handovers_count_exactly(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path, tmp_path: Path
) -> None:
    async with Fleet(tmp_path) as fleet:
        for name in ("a", "b", "c"):
            await fleet.add(kubeconfig, name, **STEADY_TIMINGS)
        await fleet.wait_leader()
        await fleet.wait_candidates()
        before = workload.snapshot()
        last_end: dict[str, Counts] = {r.identity: {} for r in fleet.replicas}
        terms: list[tuple[str, Counts]] = []  # (identity, contribution of the term)
        latencies: list[float] = []
        sampler = ExporterSampler(fleet.replicas).start()
        try:
            with LeaseLog(sim.store) as leases:
                async with generating(workload), LoopLag() as lag:
                    for handover in range(3):
                        leader = fleet.leaders()[0]
                        await fleet.wait_counted(leader, TERM_EVENTS)  # the leader's term
                        if handover == 1:  # keep two followers: a fresh replica joins, warm standby
                            last_end["d"] = {}
                            await fleet.add(kubeconfig, "d", **STEADY_TIMINGS)
                            # A newcomer defers its candidacy by the lease duration plus three retries.
                            await fleet.wait_candidates(timeout=30)
                        # Followers count nothing: their counters are where their last term left them.
                        for r in fleet.alive():
                            if r is not leader:
                                assert counter_values(r.service) == _nonzero(last_end[r.identity]), r.identity
                        sampler.allow_gap(True)
                        started = time.monotonic()
                        await leader.service.stop()  # releases the Lease with the final watermark
                        end = counter_values(leader.service)
                        terms.append((leader.identity, diff_counts(end, last_end[leader.identity])))
                        last_end[leader.identity] = end
                        successor = await fleet.wait_leader(timeout=TAKEOVER_TIMEOUT)
                        assert successor is not leader
                        took_over = fleet.started(successor.identity, after=started)
                        assert took_over is not None
                        latencies.append(took_over - started)
                        sampler.allow_gap(False)
                        # It took the released Lease: the write before its acquiring one is the release.
                        first = next(
                            i
                            for i, w in enumerate(leases.writes)
                            if w.holder == successor.identity and w.at > started
                        )
                        assert leases.writes[first - 1].holder == "", leases.writes[first - 1]
                await settle(fleet, workload)
        finally:
            await sampler.stop()
        after = workload.snapshot()
        final = fleet.leaders()[0]
        end = counter_values(final.service)
        terms.append((final.identity, diff_counts(end, last_end[final.identity])))

        sampler.assert_clean()
        # A released Lease is taken on the follower's next retry: well inside the lease duration (the
        # recorded take-over instants; plus however late this loop ran timers).
        assert max(latencies) < RETRY * 3 + 1.0 + lag.max, (latencies, lag.max)
        assert max(latencies) < STEADY_TIMINGS["lease_duration_seconds"] + lag.max, (latencies, lag.max)

        truth = truth_counts(after, before)
        summed: Counts = {}
        for _, contribution in terms:
            add_counts(summed, contribution)
        assert sum(truth["created"].values()) > 50 and sum(truth["finished"].values()) > 30, truth
        assert summed == truth, {"summed": summed, "truth": truth}

        # Same at the level of TrainJob uids: each counted by exactly one leader, exactly once.
        counted = counted_uids(fleet.counted)
        for kind, uids in new_uids(after, before).items():
            assert set(counted[kind]) == uids, kind
            assert all(n == 1 for n in counted[kind].values()), kind
        # What the final leader exports is what its state holds, once its newest series (born at zero:
        # the first read that shows a series shows it at 0) are past their first read.
        want = counter_values(final.service)

        async def exports_its_state() -> bool:
            return await exported_counts(final) == want

        await eventually(exports_its_state, timeout=5, what="the final leader's /metrics to show its state")
        replayed = sum(r.service.journal.replayed for r in fleet.replicas)
        print(f"\nhand-over latencies {[round(x, 3) for x in latencies]} s; terms {[t[0] for t in terms]};")
        print(f"replayed on takeover {replayed}; truth {sum(truth['created'].values())} created, ", end="")
        print(f"{sum(truth['finished'].values())} finished; {sampler.describe()}; loop lag {lag.max:.3f} s")


def _nonzero(counts: Counts) -> Counts:
    return {"created": dict(counts.get("created", {})), "finished": dict(counts.get("finished", {}))}


# --------------------------------------------------------------------------------------------------
# crash and unresponsive leader
# --------------------------------------------------------------------------------------------------


def scrape_interval(sampler: ExporterSampler, start: float, end: float) -> float:
    """The longest time between two consecutive scrapes of one replica by ``sampler`` in [start, end].

    A round's ``at`` is taken after it scraped every replica, so one replica's scrapes in consecutive
    rounds are at most two round gaps apart."""
    at = [x.at for x in sampler.samples if start <= x.at <= end]
    return max((b - a for a, b in zip(at, at[2:], strict=False)), default=sampler.interval * 2)


def check_counts_after_crash(
    fleet: Fleet, window: tuple[TruthSnapshot, TruthSnapshot], old: str, pub: Published
) -> list[CountedEvent]:
    """Nothing lost; counted twice = exactly the old leader's events above its last published watermark.

    ``window`` is the truth (before, after) the run. Returns those events (the duplicates)."""
    before, after = window
    truth = truth_counts(after, before)
    summed: Counts = {}
    for r in fleet.replicas:
        add_counts(summed, counter_values(r.service))
    over = diff_counts(summed, truth)
    assert all(v > 0 for series in over.values() for v in series.values()), {"over-minus-truth": over}
    assert pub.watermark is not None
    duplicates = [e for e in fleet.counted if e.identity == old and e.rv > pub.watermark]
    dup_counts: Counts = {}
    for e in duplicates:
        add_counts(dup_counts, {e.kind: {e.labels: 1}})
    over = {kind: series for kind, series in over.items() if series}  # a kind with no difference is absent
    assert over == dup_counts, {"summed-minus-truth": over, "old leader above watermark": dup_counts}
    counted = counted_uids(fleet.counted)
    for kind, uids in new_uids(after, before).items():
        assert set(counted[kind]) == uids, f"{kind}: lost {uids - set(counted[kind])}"
        twice = {uid for uid, n in counted[kind].items() if n > 1}
        assert twice == {e.uid for e in duplicates if e.kind == kind}, kind
        assert all(n <= 2 for n in counted[kind].values())
    return duplicates


# The crash and unresponsive-leader tests' Lease timings: with FAST_TIMINGS' 1 s renew deadline, two replicas
# in one process on two cores kept busy by two CPU burners lagged a leader's renew round past its deadline: it
# stepped down (as it must) and no replica exported for a moment, or (the unresponsive-leader test, 429) the
# old leader had two terms before the fault, and the counts summed over the replicas' last terms came out
# short of the truth. The takeover still waits for the Lease to expire.
CRASH_LEASE = {"lease_duration_seconds": 4.0, "renew_deadline_seconds": 3.0}
CRASH_LEASE_WRITTEN = math.ceil(CRASH_LEASE["lease_duration_seconds"])  # whole seconds in the Lease


async def test_killed_leader_loses_nothing_and_recounts_at_most_one_renew_period(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path, tmp_path: Path
) -> None:
    wall_minus_mono = time.time() - time.monotonic()
    async with Fleet(tmp_path) as fleet:
        a, b = await leader_then_follower(fleet, kubeconfig, **CRASH_LEASE)
        before = workload.snapshot()
        sampler = ExporterSampler(fleet.replicas).start()
        try:
            with LeaseLog(sim.store) as leases:
                async with generating(workload), LoopLag() as lag:
                    await fleet.wait_counted(a, TERM_EVENTS)
                    sampler.allow_gap(True)
                    killed_at = time.monotonic()
                    await a.service.kill()
                    await eventually(
                        lambda: b.service.journal.leading, timeout=5 * CRASH_LEASE_WRITTEN, what="b leads"
                    )
                    sampler.allow_gap(False)
                    await fleet.wait_counted(b, TERM_EVENTS)
                await settle(fleet, workload)
        finally:
            await sampler.stop()
        after = workload.snapshot()
        sampler.assert_clean()

        # What b took over: a's last write (a renew cut by the kill included, if it reached the server).
        last = leases.last_before_takeover("a", "b")
        assert leases.writes[leases.writes.index(last) + 1].holder == "b"  # a crashed: no release
        pub = published(last, wall_minus_mono)
        took_over = fleet.started("b")
        assert took_over is not None
        # The crashed leader's Lease is taken only after it expired: lease duration after its last renew.
        assert took_over - pub.renew_monotonic >= CRASH_LEASE_WRITTEN - CLOCK_TOLERANCE
        # It was a live leader until the kill: renewed within a renew deadline (+ timer lateness).
        renew_deadline = CRASH_LEASE["renew_deadline_seconds"]
        assert killed_at - pub.renew_monotonic < renew_deadline + lag.max, killed_at - pub.renew_monotonic
        duplicates = check_counts_after_crash(fleet, (before, after), "a", pub)
        # Counted twice: only what the old leader counted after building its last renew, before it died.
        for e in duplicates:
            assert pub.renew_monotonic - CLOCK_TOLERANCE <= e.at <= killed_at, e
        assert b.service.journal.replayed >= len(duplicates)
        print(
            f"\nkill: takeover {took_over - killed_at:.3f} s after the kill, "
            f"{took_over - pub.renew_monotonic:.3f} s after the last renew; "
            f"counted twice {len(duplicates)} (window {killed_at - pub.renew_monotonic:.3f} s); "
            f"replayed {b.service.journal.replayed}; loop lag {lag.max:.3f} s"
        )


@pytest.fixture
async def second_server(sim: SimulatedCluster) -> AsyncIterator[SimulatedCluster]:
    """Another API server over the same Store: its faults hit only the replicas pointed at it."""
    async with SimulatedCluster(host="127.0.0.1", port=0, store=sim.store) as other:
        yield other


@pytest.mark.parametrize("fault", ["hang", "503", "429"])
async def test_unresponsive_leader_stops_before_takeover(
    sim: SimulatedCluster,
    second_server: SimulatedCluster,
    workload: WorkloadGenerator,
    tmp_path: Path,
    fault: str,
    *,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wall_minus_mono = time.time() - time.monotonic()
    async with Fleet(tmp_path) as fleet:
        a = await fleet.add(second_server.write_kubeconfig(tmp_path / "kubeconfig-a"), "a", **CRASH_LEASE)
        await fleet.wait_leader()
        b = await fleet.add(sim.write_kubeconfig(tmp_path / "kubeconfig-b"), "b", **CRASH_LEASE)
        await fleet.wait_candidates()
        before = workload.snapshot()
        sampler = ExporterSampler(fleet.replicas).start()
        try:
            with LeaseLog(sim.store) as leases:
                async with generating(workload), LoopLag() as lag:
                    await fleet.wait_counted(a, TERM_EVENTS)
                    sampler.allow_gap(True)
                    assert a.service.journal.leading
                    faulted_at = time.monotonic()
                    if fault == "hang":
                        second_server.faults.stall_requests(resource="leases")
                    else:
                        second_server.faults.fail_next(100_000, status=int(fault), resource="leases")
                    # a must stop within renew_deadline of its last renew, b take over a lease duration after
                    # it: wait for whichever comes first, then compare the recorded instants.
                    await eventually(
                        lambda: fleet.stopped("a", after=faulted_at) or fleet.started("b"),
                        timeout=5 * CRASH_LEASE_WRITTEN,
                        what="a to stop leading (or b to take over)",
                    )
                    await eventually(
                        lambda: b.service.journal.leading, timeout=5 * CRASH_LEASE_WRITTEN, what="b leads"
                    )
                    sampler.allow_gap(False)
                    await fleet.wait_counted(b, TERM_EVENTS)
                await settle(fleet, workload)
        finally:
            await sampler.stop()
            second_server.faults.clear()
        after = workload.snapshot()
        pub = published(leases.last_before_takeover("a", "b"), wall_minus_mono)
        a_stopped, took_over = fleet.stopped("a", after=faulted_at), fleet.started("b")
        assert took_over is not None
        # The old leader stopped before anyone could take over ...
        assert a_stopped is not None and a_stopped < took_over, (
            f"two leaders: b took over {took_over - pub.renew_monotonic:.3f} s after a's last renew while "
            f"a still led (a stopped: {a_stopped and a_stopped - pub.renew_monotonic})"
        )
        sampler.assert_clean(excused=step_downs_before(fleet, "a", faulted_at, caplog))
        a_last = sampler.last_exporting("a")
        b_first = sampler.first_exporting("b", faulted_at)
        assert a_last is not None and b_first is not None
        assert a_last < b_first
        # ... no later than renew_deadline after its last successful renew (+ scheduling slack, + however
        # late this loop ran timers) ...
        renew_deadline = CRASH_LEASE["renew_deadline_seconds"]
        assert a_stopped - pub.renew_monotonic <= renew_deadline + SCHEDULING_SLACK + lag.max, (
            a_stopped - pub.renew_monotonic,
            lag.max,
        )
        # ... and the follower waited out the lease duration from that renew.
        assert took_over - pub.renew_monotonic >= CRASH_LEASE_WRITTEN - CLOCK_TOLERANCE
        duplicates = check_counts_after_crash(fleet, (before, after), "a", pub)  # all above pub.watermark
        # The published watermark is the *served* one: counted twice at most what a counted in the 2 x H +
        # 2 actual scrape intervals before its last renew (seen and not yet published), up to its stop
        # (docs/leadership.md, "A leader that cannot renew": the crash bound with the renew deadline).
        scrape = scrape_interval(sampler, pub.renew_monotonic - 1.0, a_stopped)
        floor = pub.renew_monotonic - 2 * ZERO_HOLD - 2 * scrape - CLOCK_TOLERANCE - lag.max
        for e in duplicates:
            assert floor <= e.at <= a_stopped, (e, {"renew": pub.renew_monotonic, "scrape interval": scrape})
        print(
            f"\n{fault}: a stopped {a_stopped - pub.renew_monotonic:.3f} s after its last renew, "
            f"b took over {took_over - pub.renew_monotonic:.3f} s after it; "
            f"margin {took_over - a_stopped:.3f} s; "
            f"counted twice {len(duplicates)}; loop lag {lag.max:.3f} s"
        )


async def test_hung_renew_stops_the_leader_even_when_the_loop_lags_past_the_deadline(
    sim: SimulatedCluster, second_server: SimulatedCluster, tmp_path: Path
) -> None:
    """The load-dependent failure of test_unresponsive_leader_stops_before_takeover[hang], made
    deterministic: the event loop is blocked (as a starved process is) from just after a renew request
    started hanging until after both the renew deadline and that request's own timeout are due."""
    async with Fleet(tmp_path) as fleet:
        a = await fleet.add(second_server.write_kubeconfig(tmp_path / "kubeconfig-a"), "a")
        await fleet.wait_leader()
        stalled = second_server.faults.counters["stalled_requests"]
        second_server.faults.stall_requests(resource="leases")
        try:
            await eventually(
                lambda: second_server.faults.counters["stalled_requests"] > stalled,
                timeout=RENEW_DEADLINE,
                interval=0.005,
                what="a renew request hanging",
            )
            # The lag itself: a blocking call (not a wait for anything) longer than a renew deadline.
            time.sleep(RENEW_DEADLINE + 0.2)  # noqa: ASYNC251
            resumed = time.monotonic()
            await eventually(
                lambda: fleet.stopped("a") is not None,
                timeout=LEASE_WRITTEN + RENEW_DEADLINE,
                what="a to stop leading once the loop resumed (its renew deadline has passed)",
            )
            stopped = fleet.stopped("a")
            assert stopped is not None and stopped - resumed < SCHEDULING_SLACK
        finally:
            second_server.faults.clear()
            # With the bug, the stale renew deadline also turns Service.stop()'s cancellation into a
            # TimeoutError: the elector carries on and stop() waits for it forever. Bounded here so that the
            # test ends (the Fleet stops the replica once more on exit, which then works).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(a.service.stop(), timeout=LEASE_WRITTEN + RENEW_DEADLINE)


async def test_fresh_replica_started_at_a_kill_defers_to_the_warm_follower(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path, tmp_path: Path
) -> None:
    """A replica that starts right when the leader dies saw nothing before its first list; the warm
    follower, whose journal covers the gap, must take over, and nothing is lost.

    The crash test's Lease: with FAST_TIMINGS, a loaded CI machine lagged a's renew round past its 1 s
    deadline and a stepped down before the scenario began (b led, a never counted its term)."""
    async with Fleet(tmp_path) as fleet:
        a, b = await leader_then_follower(fleet, kubeconfig, **CRASH_LEASE)
        before = workload.snapshot()
        electing: list[float] = []  # when c's elector first existed (c ran for leadership)

        async def watch_elector(r: Replica) -> None:
            # A sampler (records when the elector appears), not a wait for a condition.
            while r.service.elector is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            electing.append(time.monotonic())

        async with generating(workload):
            await fleet.wait_counted(a, TERM_EVENTS)
            await a.service.kill()
            c_started = time.monotonic()
            c = await fleet.add(kubeconfig, "c", **CRASH_LEASE)  # fresh; a's Lease is still valid
            watcher = asyncio.create_task(watch_elector(c), name="c's elector")
            try:
                await eventually(lambda: all(i.synced for i in c.service.informers), what="c synced")
                await eventually(
                    lambda: b.service.journal.leading, timeout=5 * CRASH_LEASE_WRITTEN, what="b leads"
                )
                await fleet.wait_counted(b, TERM_EVENTS)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        await settle(fleet, workload)
        after = workload.snapshot()
        # A fresh replica does not run while another holds the Lease: not before a's Lease (renewed at the
        # latest when c started) could have expired.
        assert not electing or electing[0] - c_started >= CRASH_LEASE_WRITTEN, electing[0] - c_started
        assert not c.service.journal.leading
        assert c.service.journal.counted == 0
        # No TrainJob was counted before `before` (the workload only runs inside `generating`), so the
        # replicas' totals are what they counted in this test: nothing lost means at least the truth.
        truth = truth_counts(after, before)
        counted: Counts = {}
        for r in fleet.replicas:
            add_counts(counted, counter_values(r.service))
        for kind, series in truth.items():
            for labels, value in series.items():
                assert counted.get(kind, {}).get(labels, 0) >= value, (kind, labels, value)


# The coverage test's timings: the crash test's Lease (a FAST_TIMINGS leader lagged past its 1 s renew
# deadline on a CI machine and stepped down before the scenario began), and a retry period that gives the
# replica that defers a head start (3 retry periods, 1.2 s) well above a loaded loop's lag.
COVERAGE_LEASE = {**CRASH_LEASE, "retry_period_seconds": 0.4}
COVERAGE_RETRY = COVERAGE_LEASE["retry_period_seconds"]


async def test_replica_whose_journal_starts_above_the_watermark_defers_to_one_that_covers_it(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path, tmp_path: Path
) -> None:
    """A replica that started after the leader's last published watermark cannot replay what the leader
    counted above it (those edges came before its first list); one that started before can. When the leader
    dies, the one that can takes over (app/handover/coverage.py; the hour soak's "suspects",
    docs/reliability.md). The other only waits longer: it is not excluded."""
    async with Fleet(tmp_path) as fleet:
        a, b = await leader_then_follower(fleet, kubeconfig, **COVERAGE_LEASE)
        async with generating(workload):
            await fleet.wait_counted(a, TERM_EVENTS)
            b_from = b.service.journal.remembered_from[""]

            async def shown_past_b() -> bool:
                await a.metrics_text()  # a scrape: what it shows is handed over (zero hold 0)
                return a.service.served_watermarks().get("", -1) >= b_from

            await eventually(shown_past_b, what="a's served watermark past b's first list")
            # From here nobody scrapes a: its published watermark stays while the workload goes on.
            await fleet.wait_counted(a, TERM_EVENTS)
            c = await fleet.add(kubeconfig, "c", **COVERAGE_LEASE)
            await eventually(lambda: c.service.elector is not None, timeout=30, what="c runs for leadership")
            await a.service.kill()
            record = parse_lease(sim.store.get(LEASES, LEASE_NS, LEASE_NAME))
            floor = b.service.lease_watermarks.takeover_floor(record)
            assert isinstance(floor, dict) and b_from <= floor[""] < c.service.journal.remembered_from[""]
            # c holds back three retry periods after the Lease expires by its clock; b does not.
            assert c.service.takeover_delay(record) == pytest.approx(3 * COVERAGE_RETRY)
            assert b.service.takeover_delay(record) == 0.0
            await eventually(
                lambda: b.service.journal.leading or c.service.journal.leading,
                timeout=5 * CRASH_LEASE_WRITTEN,
                what="a new leader",
            )
            assert b.service.journal.leading and not c.service.journal.leading
            await fleet.wait_counted(b, TERM_EVENTS)
        await settle(fleet, workload)
