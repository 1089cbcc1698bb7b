"""Leader election at the service level: one exporter at a time, warm standby, /debug/leadership.

Several Service replicas run in one test against the simulated cluster (FAST_TIMINGS: lease 1.5 s, written
as 2 s; renew deadline 1.0 s; retry 0.2 s). Tests that assert the leader never changes use STEADY_TIMINGS
(lease 6 s, renew deadline 4 s): their disturbances must not end the term, a loaded machine's loop lag
must not either. An ExporterSampler checks, every few milliseconds, that
exactly one replica exports the Trainer metrics (none only inside a hand-over window the test opens), and
that every /metrics agrees: Trainer series and ``trainer_metrics_leader 1`` on the leader only.

Lease disturbances (racing candidates, conflicting writes, deletion, garbage watermark, API errors) must
keep one exporter and count every TrainJob event exactly once, or within the bound docs/leadership.md
states for a takeover without a valid hand-over watermark.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.handover.watermarks import WATERMARK_ANNOTATION, parse_watermarks
from app.kube.microtime import format_microtime, parse_microtime
from kubesim.apiserver.core import LEASES
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.harness import (
    ExporterSampler,
    Fleet,
    LeaseLog,
    counter_values,
    running_status,
    trainjob_manifest,
    write_status,
)
from tests.support.replica_inprocess import FAST_TIMINGS, STEADY_TIMINGS, Replica
from tests.support.samples import parse_samples
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

LEASE_NS, LEASE_NAME = "default", "trainer-metrics"
STEADY_LEASE_WRITTEN = math.ceil(STEADY_TIMINGS["lease_duration_seconds"])
STEADY_RENEW_DEADLINE = STEADY_TIMINGS["renew_deadline_seconds"]
RETRY_PERIOD = FAST_TIMINGS["retry_period_seconds"]  # STEADY_TIMINGS keeps it
TERM_EVENTS = 20  # what a leader counts before the test disturbs it (~1 s of the generator at 60 steps/s)


@pytest.fixture
def workload_options() -> dict[str, Any]:
    return {"max_jobs": 120}  # seed 7, 40 TrainJobs up front (tests/conftest.py: workload)


async def run_generator(gen: WorkloadGenerator, steps: int, rate: float = 60.0) -> None:
    """``steps`` generator steps at ``rate`` per second: the same workload however loaded the machine is."""
    await gen.run(rate, max_steps=steps)


def written_by(leases: LeaseLog, holder: str, since: int) -> bool:
    """``holder`` wrote the Lease at or after ``leases.writes[since]``."""
    return any(w.holder == holder for w in leases.writes[since:])


def renewed_by(leases: LeaseLog, holder: str, since: int) -> bool:
    """``holder`` wrote the Lease with a new renewTime after ``leases.writes[since]``: it renewed."""
    seen = leases.writes[since].renew_time
    return any(w.holder == holder and w.renew_time != seen for w in leases.writes[since + 1 :])


def lease(sim: SimulatedCluster) -> dict[str, Any]:
    return sim.store.get(LEASES, LEASE_NS, LEASE_NAME)


def summed_counts(fleet: Fleet) -> dict[str, Counter[tuple[str, ...]]]:
    out: dict[str, Counter[tuple[str, ...]]] = {"created": Counter(), "finished": Counter()}
    for r in fleet.replicas:
        for kind, series in counter_values(r.service).items():
            out[kind].update(series)
    return out


def truth_since(after: TruthSnapshot, before: TruthSnapshot) -> dict[str, Counter[tuple[str, ...]]]:
    return {
        "created": Counter(after.created_since(before)),
        "finished": Counter(after.finished_since(before)),
    }


async def settle(fleet: Fleet, gen: WorkloadGenerator) -> TruthSnapshot:
    rv = gen.truth.resource_version
    await eventually(lambda: fleet.caught_up(rv), timeout=20, what=f"replicas caught up with rv {rv}")
    return gen.snapshot()


async def leadership(r: Replica) -> dict[str, Any]:
    resp = await r.http.get("/debug/leadership")
    assert resp.status_code == 200
    body: dict[str, Any] = resp.json()
    return body


def when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


async def start_fleet(
    fleet: Fleet, sim: SimulatedCluster, tmp_path: Path, *names: str, **overrides: Any
) -> Replica:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    for name in names:
        await fleet.add(kubeconfig, name, **overrides)
    leader = await fleet.wait_leader()
    await fleet.wait_candidates()
    return leader


# --------------------------------------------------------------------------------------------------


async def test_two_replicas_one_exporter_and_debug_leadership(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    async with Fleet(tmp_path) as fleet:
        leader = await start_fleet(fleet, sim, tmp_path, "a", "b", **STEADY_TIMINGS)
        follower = next(r for r in fleet.replicas if r is not leader)
        before = workload.snapshot()
        sampler = ExporterSampler(fleet.replicas).start()
        try:
            await run_generator(workload, 150)
            after = await settle(fleet, workload)

            def follower_read_the_final_watermark() -> bool:
                # A renew publishes it (every retry period); the follower reads it on its next attempt
                # (every 1 to 2.2 retry periods).
                assert follower.service.elector is not None
                seen = parse_watermarks(follower.service.elector.status().annotations)
                return seen == {"": leader.service.journal.watermark}

            await eventually(follower_read_the_final_watermark, timeout=3, what="follower read the watermark")
        finally:
            await sampler.stop()
        sampler.assert_clean()
        assert all(len(s.atomic) == 1 for s in sampler.samples)

        # Warm standby: the follower holds the same gauges, but exports self-telemetry only.
        lead_samples = parse_samples(await leader.metrics_text())
        follow_text = await follower.metrics_text()
        assert "kubeflow_trainer_" not in follow_text
        follow_samples = parse_samples(follow_text)
        assert lead_samples[("trainer_metrics_leader", ())] == 1
        assert follow_samples[("trainer_metrics_leader", ())] == 0
        assert lead_samples[("trainer_metrics_leader_transitions_total", ())] == 1
        assert follow_samples[("trainer_metrics_leader_transitions_total", ())] == 0
        follower.service.metric_state.apply_pending_gauges()
        leader.service.metric_state.apply_pending_gauges()
        assert dict(follower.service.metric_state.trainjobs.values) == dict(
            leader.service.metric_state.trainjobs.values
        )
        # One exporter, exact counts.
        assert counter_values(follower.service) == {"created": {}, "finished": {}}
        assert summed_counts(fleet) == truth_since(after, before)

        stored = lease(sim)
        spec, annotations = stored["spec"], stored["metadata"]["annotations"]
        lead, follow = await leadership(leader), await leadership(follower)
        now = datetime.now(UTC)
        for body, r in ((lead, leader), (follow, follower)):
            assert body["identity"] == r.identity
            assert body["election_enabled"] is True
            assert body["holder"] == leader.identity
            assert (body["lease_name"], body["lease_namespace"]) == (LEASE_NAME, LEASE_NS)
            assert when(body["acquire_time"]) == parse_microtime(spec["acquireTime"])
            assert body["lease_transitions"] == spec["leaseTransitions"] == 0
            renew = when(body["renew_time"])
            # The leader still leads, so it renewed within its renew deadline (else it steps down:
            # app/kube/elector.py); the follower's copy is at most one poll (2.2 retry periods) older. A fixed
            # 2 s failed on a loaded machine (2.5 s) while the leader renewed as it should.
            fresh = STEADY_RENEW_DEADLINE + (0.0 if r is leader else 2.2 * RETRY_PERIOD)
            assert renew is not None and (now - renew).total_seconds() < fresh, (r.identity, now - renew)
            last_change = when(body["last_change"])
            assert last_change is not None and last_change <= now
        assert lead["is_leader"] is True and follow["is_leader"] is False
        assert lead["transitions_seen"] == 1 and follow["transitions_seen"] == 0
        # The leader's watermark is the highest rv it counted, and it is what the Lease carries.
        assert lead["watermark"] == leader.service.journal.watermark
        assert lead["watermark"] == int(annotations[WATERMARK_ANNOTATION])
        assert lead["watermark"] >= max(e.rv for e in fleet.counted)
        assert lead["observed_watermark"] == lead["watermark"]
        assert follow["watermark"] is None  # never led, counted nothing
        assert follow["observed_watermark"] == lead["watermark"]


async def test_racing_candidates_and_conflicting_writes_keep_one_exporter(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    async with Fleet(tmp_path) as fleet:
        # Three replicas start at once against a cluster without a Lease: they race to create it.
        await asyncio.gather(*(fleet.add(kubeconfig, name, **STEADY_TIMINGS) for name in ("a", "b", "c")))
        sampler = ExporterSampler(fleet.replicas)
        sampler.allow_gap(True)  # nobody leads before the first election
        sampler.start()
        try:
            leader = await fleet.wait_leader()
            await fleet.wait_candidates()
            sampler.allow_gap(False)
            transitions = lease(sim)["spec"].get("leaseTransitions", 0)
            before = workload.snapshot()
            stop = asyncio.Event()
            gen_task = asyncio.create_task(workload.run(60.0, stop))
            # Someone else (kubectl annotate, another controller) writes the Lease again and again: the
            # leader's renew over its cached resourceVersion gets 409 Conflict and must re-read, not fall.
            # Each write waits for the leader's next renew, so every one of them is a conflict it handled.
            conflicts_before = 0
            with LeaseLog(sim.store) as leases:
                for i in range(15):
                    poke = len(leases.writes)
                    sim.store.patch(LEASES, LEASE_NS, LEASE_NAME, {"metadata": {"labels": {"poke": str(i)}}})
                    conflicts_before += 1
                    await eventually(
                        functools.partial(renewed_by, leases, leader.identity, poke),
                        timeout=STEADY_RENEW_DEADLINE,
                        what=f"the leader's renew after conflicting write {i}",
                    )
            await fleet.wait_counted(leader, TERM_EVENTS)
            stop.set()
            await gen_task
            after = await settle(fleet, workload)
        finally:
            await sampler.stop()
        sampler.assert_clean()
        assert fleet.leaders() == [leader]
        assert leader.service.elector is not None and leader.service.elector.transitions_seen == 1
        followers = [r.service.elector for r in fleet.replicas if r is not leader]
        assert all(e is not None and e.transitions_seen == 0 for e in followers)
        assert lease(sim)["spec"]["holderIdentity"] == leader.identity
        assert lease(sim)["spec"].get("leaseTransitions", 0) == transitions
        assert summed_counts(fleet) == truth_since(after, before)
        print(f"\nrace + {conflicts_before} conflicting writes: {sampler.describe()}")


async def test_lease_deleted_under_the_leader(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    async with Fleet(tmp_path) as fleet:
        leader = await start_fleet(fleet, sim, tmp_path, "a", "b", **STEADY_TIMINGS)
        first = lease(sim)
        before = workload.snapshot()
        sampler = ExporterSampler(fleet.replicas).start()
        stop = asyncio.Event()
        gen_task = asyncio.create_task(workload.run(60.0, stop))
        try:
            await fleet.wait_counted(leader, TERM_EVENTS)
            with LeaseLog(sim.store) as leases:
                deleted_at = time.monotonic()
                sim.store.delete(LEASES, LEASE_NS, LEASE_NAME)  # kubectl delete lease, under the leader
                # The leader recreates it on its next renew; the follower must not grab it meanwhile.
                recreated = await eventually(lambda: _lease_or_none(sim), timeout=5, what="Lease recreated")
            recreated_after = next(w.at for w in leases.writes if not w.deleted) - deleted_at
            # Proving that nothing happens (no takeover), for longer than the lease duration: a lagging loop
            # only lengthens the window.
            await asyncio.sleep(STEADY_LEASE_WRITTEN + 0.5)
            stop.set()
            await gen_task
            after = await settle(fleet, workload)
        finally:
            stop.set()
            await sampler.stop()
        sampler.assert_clean()  # no gap allowed: the leader never stopped exporting
        assert fleet.leaders() == [leader]
        assert recreated["spec"]["holderIdentity"] == leader.identity
        assert recreated["metadata"]["uid"] != first["metadata"]["uid"]
        # Same term: acquireTime and transitions carried over, watermark published again.
        assert recreated["spec"]["acquireTime"] == first["spec"]["acquireTime"]
        assert recreated["spec"]["leaseTransitions"] == first["spec"]["leaseTransitions"]
        assert WATERMARK_ANNOTATION in recreated["metadata"]["annotations"]
        assert recreated_after < 1.0  # within a renew round
        assert summed_counts(fleet) == truth_since(after, before)
        print(f"\nLease recreated {recreated_after:.3f} s after deletion; {sampler.describe()}")


def _served_twice(sim: SimulatedCluster, counter: str) -> Callable[[], bool]:
    return lambda: sim.faults.counters[counter] >= 2


def _watermark_is_number(sim: SimulatedCluster) -> bool:
    return bool(lease(sim)["metadata"]["annotations"][WATERMARK_ANNOTATION].isdigit())


def _lease_or_none(sim: SimulatedCluster) -> dict[str, Any] | None:
    try:
        return lease(sim)
    except Exception:
        return None


async def test_garbage_watermark_on_a_held_lease_is_overwritten(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    async with Fleet(tmp_path) as fleet:
        leader = await start_fleet(fleet, sim, tmp_path, "a", "b", **STEADY_TIMINGS)
        follower = next(r for r in fleet.replicas if r is not leader)
        before = workload.snapshot()
        sampler = ExporterSampler(fleet.replicas).start()
        stop = asyncio.Event()
        gen_task = asyncio.create_task(workload.run(60.0, stop))
        try:
            await fleet.wait_counted(leader, TERM_EVENTS)
            for garbage in ("not-a-number", "", "12abc", "\u00e9\u00e9"):
                sim.store.patch(
                    LEASES,
                    LEASE_NS,
                    LEASE_NAME,
                    {"metadata": {"annotations": {WATERMARK_ANNOTATION: garbage, "x/other": "{[garbage"}}},
                )
                # The next renew writes the leader's own watermark over it.
                await eventually(lambda: _watermark_is_number(sim), timeout=3, what="watermark rewritten")
            await fleet.wait_counted(leader, TERM_EVENTS)
            stop.set()
            await gen_task
            after = await settle(fleet, workload)

            async def follower_observed_the_final_watermark() -> bool:
                return bool(
                    (await leadership(follower))["observed_watermark"] == leader.service.journal.watermark
                )

            await eventually(
                follower_observed_the_final_watermark, timeout=3, what="the follower read the final watermark"
            )
        finally:
            stop.set()
            await sampler.stop()
        sampler.assert_clean()
        assert fleet.leaders() == [leader]
        annotations = lease(sim)["metadata"]["annotations"]
        assert annotations["x/other"] == "{[garbage"  # other annotations are kept
        assert summed_counts(fleet) == truth_since(after, before)
        follow = await leadership(follower)
        assert follow["observed_watermark"] == leader.service.journal.watermark


async def test_garbage_watermark_at_takeover_does_not_recount_history(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    """A crashed leader's Lease whose watermark is garbage when the follower takes it over.

    Documented bound: nothing is counted twice beyond the events the old leader counted after the last
    valid watermark the Lease carried (the follower saw it on its polls); a takeover without a readable
    watermark must not replay the whole journal (which recounts everything the old leader counted)."""
    async with Fleet(tmp_path) as fleet:
        a = await start_fleet(fleet, sim, tmp_path, "a")
        b = await fleet.add(sim.write_kubeconfig(tmp_path / "kubeconfig-b"), "b")
        await fleet.wait_candidates()
        floors: list[Any] = []  # what b weighs and takes over from (app/handover/watermarks.py)
        takeover_floor = b.service.lease_watermarks.takeover_floor

        def recording_floor(previous: Any) -> Any:
            floors.append(takeover_floor(previous))
            return floors[-1]

        b.service.lease_watermarks.takeover_floor = recording_floor  # type: ignore[method-assign]
        before = workload.snapshot()
        stop = asyncio.Event()
        gen_task = asyncio.create_task(workload.run(60.0, stop))
        sampler = ExporterSampler(fleet.replicas).start()
        try:
            await fleet.wait_counted(a, TERM_EVENTS)
            sampler.allow_gap(True)
            await a.service.kill()
            # Read and overwrite in one step (no await between): a renew of a still landing after this
            # carries an older resourceVersion and gets 409, so `valid` is the last watermark a published.
            valid = int(lease(sim)["metadata"]["annotations"][WATERMARK_ANNOTATION])
            sim.store.patch(
                LEASES, LEASE_NS, LEASE_NAME, {"metadata": {"annotations": {WATERMARK_ANNOTATION: "garbage"}}}
            )
            await eventually(lambda: b.service.journal.leading, timeout=10, what="b leads")
            sampler.allow_gap(False)
            await fleet.wait_counted(b, TERM_EVENTS)
            stop.set()
            await gen_task
            after = await settle(fleet, workload)
        finally:
            stop.set()
            await sampler.stop()
        sampler.assert_clean()
        summed, truth = summed_counts(fleet), truth_since(after, before)
        over = {kind: summed[kind] - truth[kind] for kind in summed}
        lost = {kind: truth[kind] - summed[kind] for kind in summed}
        assert not any(lost.values()), lost
        # b takes over from the highest valid watermark it saw in the Lease while following, not "nothing":
        # at most the last one a published (docs/leadership.md, "An unreadable watermark").
        # (Asked before too, while b weighed whether to defer its takeover: Service.takeover_delay; the floor
        # it took over from is the last one asked.)
        assert floors and all(isinstance(f, dict) for f in floors), floors
        floor = floors[-1][""]
        assert floor <= valid, (floor, valid)
        # Recounted at most what a counted above that floor (seen by a scrape or not: the state-level crash
        # re-count, docs/leadership.md "The guarantee"); a poll of b may trail a's last renew by one.
        allowed = sum(1 for e in fleet.counted if e.identity == "a" and e.rv > floor)
        recounted = sum(sum(c.values()) for c in over.values())
        assert recounted <= allowed, (
            f"recounted {recounted}, bound {allowed} (floor {floor}, last valid {valid}, "
            f"a counted {a.service.journal.counted})"
        )
        print(
            f"\ngarbage watermark at takeover: recounted {recounted}, bound {allowed}, floor {floor}/{valid}"
        )


async def test_brief_api_errors_during_renew_keep_the_leader(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    async with Fleet(tmp_path) as fleet:
        leader = await start_fleet(fleet, sim, tmp_path, "a", "b", **STEADY_TIMINGS)
        before = workload.snapshot()
        sampler = ExporterSampler(fleet.replicas).start()
        stop = asyncio.Event()
        gen_task = asyncio.create_task(workload.run(60.0, stop))
        try:
            with LeaseLog(sim.store) as leases:
                for status in (429, 503, 500, 504):
                    # Two renew PUTs fail (the fast path and the PUT after its fallback GET): well inside
                    # the renew deadline, so leadership holds and nothing is handed over.
                    sim.faults.fail_next(2, status=status, resource="leases", method="PUT")
                    served = f"status_{status}"
                    await eventually(_served_twice(sim, served), timeout=3, what=served)
                    failed = len(leases.writes)
                    await eventually(
                        functools.partial(written_by, leases, leader.identity, failed),
                        timeout=STEADY_RENEW_DEADLINE,
                        what=f"a successful renew after the {status}s",
                    )
            stop.set()
            await gen_task
            after = await settle(fleet, workload)
        finally:
            stop.set()
            await sampler.stop()
            sim.faults.clear()
        sampler.assert_clean()
        assert fleet.leaders() == [leader]
        assert leader.service.elector is not None and leader.service.elector.transitions_seen == 1
        assert summed_counts(fleet) == truth_since(after, before)


async def test_a_former_leader_taking_the_lease_back_never_lowers_the_watermark(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    """A replica that led, lost the Lease to another leader and takes it back later.

    Its journal still holds its own old term's watermark when it writes the acquiring PUT. Were that
    written, a takeover from it before its first renew would start below what the leader in between
    counted, and recount those events. Every Lease write after the other leader's must carry at least
    the other leader's watermark."""
    async with Fleet(tmp_path) as fleet:
        a = await start_fleet(fleet, sim, tmp_path, "a")
        await run_generator(workload, 60)
        own = a.service.journal.watermark
        assert own is not None and own > 0
        writes: list[tuple[str, int | None]] = []

        def on_event(event: Any) -> None:
            if event.resource == LEASES:
                obj = event.entry.obj
                raw = (obj["metadata"].get("annotations") or {}).get(WATERMARK_ANNOTATION)
                writes.append((obj["spec"].get("holderIdentity", ""), int(raw) if raw else None))

        unsubscribe = sim.store.subscribe(on_event)
        try:
            # Another leader (a ghost: it never renews) took the Lease and counted up to now.
            ghost = sim.store.resource_version + 1
            sim.store.patch(
                LEASES,
                LEASE_NS,
                LEASE_NAME,
                {
                    "metadata": {"annotations": {WATERMARK_ANNOTATION: str(ghost)}},
                    "spec": {
                        "holderIdentity": "ghost",
                        "leaseDurationSeconds": 2,
                        "renewTime": format_microtime(datetime.now(UTC)),
                    },
                },
            )
            await eventually(lambda: not a.service.journal.leading, timeout=5, what="a loses the Lease")
            await eventually(lambda: a.service.journal.leading, timeout=10, what="a leads again")

            def renews_after_the_ghost() -> int:
                holders = [holder for holder, _ in writes]
                return len(writes) - holders.index("ghost") - 1 if "ghost" in holders else 0

            await eventually(lambda: renews_after_the_ghost() >= 3, timeout=5, what="a few renews of a")
        finally:
            unsubscribe()
        assert own < ghost
        after_ghost = writes[[holder for holder, _ in writes].index("ghost") + 1 :]
        assert after_ghost and all(holder == "a" for holder, _ in after_ghost), writes
        lowered = [w for _, w in after_ghost if w is None or w < ghost]
        assert not lowered, f"watermarks written after the ghost's {ghost}: {after_ghost}"


async def test_an_edge_a_relist_found_across_the_floor_is_counted_only_if_the_old_leader_had_not(
    sim: SimulatedCluster, workload: WorkloadGenerator, tmp_path: Path
) -> None:
    """The follower's TrainJob watch misses two creations, and its relist finds them on later states, above
    the floor it then takes over from: X was created at or below the floor (the old leader counted it), Y
    after it. From its own data the follower cannot tell them apart; it reads the TrainJobs as they were at
    the floor (LIST, resourceVersionMatch=Exact) and counts Y only."""
    store = sim.store
    now = format_microtime(datetime.now(UTC))
    store.create(
        LEASES,
        LEASE_NS,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE_NAME, "annotations": {WATERMARK_ANNOTATION: "1"}},
            "spec": {
                "holderIdentity": "ghost",  # a leader that has just died: it never renews again
                "leaseDurationSeconds": 2,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        },
    )
    async with Fleet(tmp_path) as fleet:
        b = await fleet.add(sim.write_kubeconfig(tmp_path / "kubeconfig"), "b")
        await eventually(lambda: all(i.synced for i in b.service.informers), timeout=10, what="b synced")
        sim.faults.stall_watches(resource="trainjobs")  # b's TrainJob watch goes silent
        x = store.create(TRAINJOBS, "team-a", trainjob_manifest("x"))
        floor = store.resource_version  # the ghost counted up to here: X included
        store.patch(
            LEASES, LEASE_NS, LEASE_NAME, {"metadata": {"annotations": {WATERMARK_ANNOTATION: str(floor)}}}
        )
        write_status(store, "team-a", "x", running_status())  # X listed above the floor
        y = store.create(TRAINJOBS, "team-a", trainjob_manifest("y"))
        sim.faults.restart()  # b's watch ends; its resume gets 410: a relist finds X and Y
        sim.faults.release_watches()
        informer = b.service._trainjob_informers[0]
        await eventually(lambda: informer.get("team-a/y") is not None, timeout=10, what="b relisted")
        assert b.service.journal.leading is False
        await eventually(lambda: b.service.journal.leading, timeout=10, what="b takes over")
        await eventually(lambda: b.service.journal.uncertain == 0, timeout=10, what="uncertain settled")
        counted = {e.uid for e in fleet.counted if e.identity == "b" and e.kind == "created"}
        assert y["metadata"]["uid"] in counted
        assert x["metadata"]["uid"] not in counted
        assert b.service.journal.skipped >= 1
