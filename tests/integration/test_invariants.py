"""product.md §6 invariants, one named test each, against a simulated cluster through the real HTTP path.

Invariant 5 (leader exclusivity) lives in the leader-election tests. Each test runs one replica against a
``SimulatedCluster`` loaded with the upstream ClusterTrainingRuntimes, writes TrainJobs and runtimes
straight into the simulated store (as the Trainer controller and users would through the API), waits until
every informer cache equals the store, then reads ``/metrics`` and the debug endpoints over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from tests.support.harness import (
    ACCELERATORS,
    CREATED,
    FINISHED,
    JOBS,
    LIFETIME,
    NODES,
    RUNTIME_INFO,
    cluster_ref,
    condition,
    running_status,
    runtime_manifest,
    terminal_status,
    trainjob_manifest,
    wait_caught_up,
    wait_leading,
    write_status,
)
from tests.support.replica_inprocess import STEADY_TIMINGS, Replica, replica
from tests.support.samples import Samples, by_labels, scrape_counts, total
from tests.support.waiting import eventually

TORCH = cluster_ref("torch-distributed")
# Watches and a term that do not end on their own during a test: every watch restart and relist is one we
# caused, and the one replica leads throughout (STEADY_TIMINGS: on a loaded CI machine FAST_TIMINGS' 1 s renew
# deadline once passed before a renew round started, the replica stepped down, and a relist's counts went
# unexported).
QUIET: dict[str, Any] = {"watch_timeout_min_seconds": 300, "watch_timeout_max_seconds": 600, **STEADY_TIMINGS}


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"load_runtimes": True}  # the upstream ClusterTrainingRuntimes (tests/conftest.py: sim)


def create_job(sim: SimulatedCluster, namespace: str, name: str, **kw: Any) -> dict[str, Any]:
    return sim.store.create(TRAINJOBS, namespace, trainjob_manifest(name, **kw))


def relists(s: Samples, informer: str = "trainjobs", reason: str | None = None) -> float:
    match = {"informer": informer} | ({"reason": reason} if reason else {})
    return total(s, "trainer_metrics_informer_relists_total", **match)


def watch_restarts(s: Samples, reason: str, informer: str = "trainjobs") -> float:
    return total(s, "trainer_metrics_informer_watch_restarts_total", informer=informer, reason=reason)


def break_trainjob_watch(sim: SimulatedCluster, while_down: Callable[[], None]) -> None:
    """Silence the TrainJob watch, run ``while_down`` (writes the informer cannot see), compact the
    history and cut the watch: its resume from the old resourceVersion gets 410 Expired and relists.

    Deterministic: the stall holds every matching stream before its next write, the reset is flagged
    before the release, and a released stream checks its reset flag before sending queued events."""
    sim.faults.stall_watches(resource="trainjobs")
    before = sim.store.resource_version
    while_down()
    assert sim.store.resource_version > before, "while_down() wrote nothing: no 410 would follow"
    sim.faults.compact()
    assert sim.faults.reset_watches(resource="trainjobs") >= 1
    sim.faults.release_watches()


async def terminal_page(r: Replica) -> dict[str, Any]:
    resp = await r.http.get("/debug/terminal", params={"limit": 1000})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


# --- 1. initial list ---------------------------------------------------------------------------------


# Election on is the deployed path; off, the replica exports from its first event on and replays all it
# remembers, so a wrongly counted initial-list job could not hide behind a takeover.
ELECTION = pytest.mark.parametrize("election", [True, False], ids=["election", "no-election"])


@ELECTION
async def test_initial_list_jobs_not_counted_created(
    sim: SimulatedCluster, kubeconfig: Path, election: bool
) -> None:
    for i in range(3):
        create_job(sim, "team1", f"pending-{i}")
    create_job(sim, "team1", "suspended-0", suspend=True)
    create_job(sim, "team2", "running-0", num_nodes=2)
    write_status(sim.store, "team2", "running-0", running_status())

    async with replica(kubeconfig, "a", leader_election=election, **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert total(s, CREATED) == 0
        assert total(s, NODES + "_count") == 0 and total(s, ACCELERATORS + "_count") == 0
        # ... yet the gauge, derived from the cache, shows them all.
        assert by_labels(s, JOBS, "namespace", "runtime_ref", "state") == {
            ("team1", TORCH, "pending"): 3,
            ("team1", TORCH, "suspended"): 1,
            ("team2", TORCH, "running"): 1,
        }

        # Updates of initial-list jobs, then a relist (410 after compaction) that sees them again: still
        # not "created".
        def while_down() -> None:
            write_status(sim.store, "team1", "pending-0", running_status())
            sim.store.patch(TRAINJOBS, "team1", "suspended-0", {"spec": {"suspend": False}})

        write_status(sim.store, "team1", "pending-1", running_status())
        await wait_caught_up(r, sim.store)
        break_trainjob_watch(sim, while_down)
        await eventually(lambda: _relisted(r), timeout=20, what="TrainJob relist after 410")
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert total(s, CREATED) == 0
        assert total(s, JOBS, state="running") == 3

        # A job first seen after the initial list is counted, once, with its labels.
        create_job(sim, "team1", "new-0", num_nodes=2)
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert by_labels(s, CREATED, "namespace", "runtime_ref") == {("team1", TORCH): 1}
        assert total(s, NODES + "_count") == 1 and total(s, NODES + "_sum") == 2


async def _relisted(r: Replica) -> bool:
    return relists(await r.samples(), reason="expired") >= 1


@ELECTION
async def test_terminal_at_initial_list_not_counted_finished(
    sim: SimulatedCluster, kubeconfig: Path, election: bool
) -> None:
    create_job(sim, "team1", "done-ok")
    write_status(sim.store, "team1", "done-ok", terminal_status("Complete"))
    create_job(sim, "team1", "done-failed")
    write_status(sim.store, "team1", "done-failed", terminal_status("Failed", "FailedJobs"))
    create_job(sim, "team1", "still-running")
    write_status(sim.store, "team1", "still-running", running_status())

    async with replica(kubeconfig, "a", leader_election=election, **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert total(s, FINISHED) == 0 and total(s, LIFETIME + "_count") == 0
        assert by_labels(s, JOBS, "state") == {("succeeded",): 1, ("failed",): 1, ("running",): 1}
        # Recorded in the dedup set (so a later terminal update cannot count them), not counted.
        page = await terminal_page(r)
        assert {e["name"] for e in page["items"]} == {"done-ok", "done-failed"}

        # The controller rewrites their terminal status: no not-terminal -> terminal edge, no count.
        for name, result in (("done-ok", "Complete"), ("done-failed", "Failed")):
            write_status(sim.store, "team1", name, terminal_status(result) | {"trainerStatus": {"x": 1}})
        await wait_caught_up(r, sim.store)
        assert total(await scrape_counts(r), FINISHED) == 0

        # The job that was running in the initial list does make the edge: counted once.
        write_status(sim.store, "team1", "still-running", terminal_status("Complete"))
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert by_labels(s, FINISHED, "result", "reason", "runtime_ref") == {("succeeded", "none", TORCH): 1}
        assert total(s, LIFETIME + "_count") == 1


# --- 2. dedup ----------------------------------------------------------------------------------------


async def test_duplicate_terminal_modifieds_counted_once(sim: SimulatedCluster, kubeconfig: Path) -> None:
    async with replica(kubeconfig, "a", **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        create_job(sim, "team1", "dup", num_nodes=1)
        write_status(sim.store, "team1", "dup", running_status())
        done = terminal_status("Failed", "DeadlineExceeded")
        write_status(sim.store, "team1", "dup", done)
        await wait_caught_up(r, sim.store)
        expected = {("failed", "DeadlineExceeded", TORCH): 1}

        async def finished() -> dict[tuple[str, ...], float]:
            await wait_caught_up(r, sim.store)
            s = await scrape_counts(r)
            assert total(s, LIFETIME + "_count") == 1
            assert total(s, CREATED) == 1
            return by_labels(s, FINISHED, "result", "reason", "runtime_ref")

        assert await finished() == expected

        def duplicate(i: int) -> None:
            # Same terminal condition, other status fields change (progress, JobSet gone): a MODIFIED each.
            status = done | {"trainerStatus": {"progressPercentage": 100, "metrics": [{"loss": str(i)}]}}
            if i % 2:
                status["jobsStatus"] = None
            write_status(sim.store, "team1", "dup", status)

        for i in range(3):
            duplicate(i)
        assert await finished() == expected

        # A watch restart (stream cut mid-event; resume from the last resourceVersion, no relist).
        assert sim.faults.reset_watches(resource="trainjobs") == 1
        await eventually(lambda: _restarts_at_least(r, "reset", 1), timeout=15, what="TrainJob watch restart")
        duplicate(3)
        assert await finished() == expected

        # A relist (410 after compaction) that finds the job terminal, with a duplicate written meanwhile.
        break_trainjob_watch(sim, lambda: duplicate(4))
        await eventually(lambda: _relisted(r), timeout=20, what="TrainJob relist after 410")
        assert await finished() == expected

        # Even a later Complete=True beside Failed=True (another terminal reading) is not a second count.
        status = dict(done)
        status["conditions"] = [*done["conditions"], condition("Complete", reason="JobsCompleted")]
        write_status(sim.store, "team1", "dup", status)
        assert await finished() == expected
        page = await terminal_page(r)
        assert page["total"] == 1 and page["items"][0]["name"] == "dup"


async def _restarts_at_least(r: Replica, reason: str, n: int) -> bool:
    return watch_restarts(await r.samples(), reason) >= n


async def test_dedup_entry_dropped_on_delete(sim: SimulatedCluster, kubeconfig: Path) -> None:
    async with replica(kubeconfig, "a", leader_election=False, **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        uids = {}
        for name in ("a", "b", "kept"):
            uids[name] = create_job(sim, "team1", name, num_nodes=1)["metadata"]["uid"]
            write_status(sim.store, "team1", name, terminal_status("Complete"))
        # One with a finalizer: deleting it only sets deletionTimestamp until the finalizer goes.
        manifest = trainjob_manifest("final", num_nodes=1)
        manifest["metadata"]["finalizers"] = ["example.com/cleanup"]
        uids["final"] = sim.store.create(TRAINJOBS, "team1", manifest)["metadata"]["uid"]
        write_status(sim.store, "team1", "final", terminal_status("Failed", "FailedJobs"))
        await wait_caught_up(r, sim.store)

        page = await terminal_page(r)
        assert page["total"] == 4
        assert {e["uid"] for e in page["items"]} == set(uids.values())
        assert (await r.http.get("/debug/snapshot")).json()["terminal_entries"] == 4

        sim.store.delete(TRAINJOBS, "team1", "a")
        sim.store.delete(TRAINJOBS, "team1", "b")
        sim.store.delete(TRAINJOBS, "team1", "final")  # still there: deletionTimestamp + finalizer
        await wait_caught_up(r, sim.store)
        page = await terminal_page(r)
        assert page["total"] == 2
        assert {e["uid"] for e in page["items"]} == {uids["kept"], uids["final"]}

        sim.store.patch(TRAINJOBS, "team1", "final", {"metadata": {"finalizers": None}})  # now it is gone
        await wait_caught_up(r, sim.store)
        page = await terminal_page(r)
        assert page["total"] == 1 and [e["uid"] for e in page["items"]] == [uids["kept"]]
        assert (await r.http.get("/debug/snapshot")).json()["terminal_entries"] == 1

        s = await scrape_counts(r)
        # Deletion forgets the entries, never the counts; the gauge follows the cache.
        assert total(s, FINISHED) == 4 and total(s, CREATED) == 4
        assert by_labels(s, JOBS, "state") == {("succeeded",): 1}


# --- 3. relist diff ----------------------------------------------------------------------------------


async def test_relist_after_410_diffs_against_cache(sim: SimulatedCluster, kubeconfig: Path) -> None:
    async with replica(kubeconfig, "a", **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        for name in ("run-a", "run-b", "to-delete", "done-delete"):
            create_job(sim, "team1", name, num_nodes=2)
            write_status(sim.store, "team1", name, running_status())
        write_status(sim.store, "team1", "done-delete", terminal_status("Complete"))
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert total(s, CREATED) == 4 and total(s, FINISHED) == 1
        relists_before = relists(s)

        def while_down() -> None:
            create_job(sim, "team2", "new-while-down", num_nodes=4)  # created
            create_job(sim, "team2", "born-and-done", num_nodes=1)  # created and finished
            write_status(sim.store, "team2", "born-and-done", terminal_status("Failed", "ReachedMaxRestarts"))
            write_status(sim.store, "team1", "run-a", terminal_status("Complete"))  # edge while down
            write_status(sim.store, "team1", "run-b", running_status() | {"trainerStatus": {"p": 50}})
            sim.store.delete(TRAINJOBS, "team1", "to-delete")  # gone from the gauge
            sim.store.delete(TRAINJOBS, "team1", "done-delete")  # gone, dedup entry dropped

        break_trainjob_watch(sim, while_down)

        async def relisted() -> bool:
            return relists(await r.samples(), reason="expired") > relists_before

        await eventually(relisted, timeout=20, what="TrainJob relist after 410")
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert by_labels(s, CREATED, "namespace") == {("team1",): 4, ("team2",): 2}
        assert by_labels(s, FINISHED, "result", "reason") == {
            ("succeeded", "none"): 2,  # done-delete (before), run-a (while down)
            ("failed", "ReachedMaxRestarts"): 1,  # born-and-done
        }
        assert total(s, LIFETIME + "_count") == 3
        # Requested nodes observed once per created job: 4 x 2 before, then 4 and 1.
        assert total(s, NODES + "_count") == 6 and total(s, NODES + "_sum") == 4 * 2 + 4 + 1
        assert by_labels(s, JOBS, "namespace", "state") == {
            ("team1", "succeeded"): 1,  # run-a
            ("team1", "running"): 1,  # run-b
            ("team2", "pending"): 1,  # new-while-down
            ("team2", "failed"): 1,  # born-and-done
        }
        page = await terminal_page(r)
        assert sorted(e["name"] for e in page["items"]) == ["born-and-done", "run-a"]


# --- 4. runtimes -------------------------------------------------------------------------------------


def runtime_series(s: Samples, name: str) -> list[dict[str, str]]:
    return [
        dict(labels) for (n, labels), _ in s.items() if n == RUNTIME_INFO and dict(labels)["name"] == name
    ]


async def test_runtime_update_and_delete_reflected(sim: SimulatedCluster, kubeconfig: Path) -> None:
    sim.store.create(
        TRAINING_RUNTIMES,
        "team1",
        runtime_manifest("custom", namespace="team1", num_nodes=2, gpus_per_node=1),
    )
    ref = "trainer.kubeflow.org/TrainingRuntime/team1/custom"
    async with replica(kubeconfig, "a", leader_election=False, **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert runtime_series(s, "custom") == [
            {
                "namespace": "team1",
                "name": "custom",
                "api_group": "trainer.kubeflow.org",
                "kind": "TrainingRuntime",
                "ml_policy": "torch",
                "pod_group_policy": "none",
                "framework": "torch",
            }
        ]
        create_job(sim, "team1", "before-update", runtime="custom", kind="TrainingRuntime")
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert (
            total(s, NODES + "_count", runtime_ref=ref) == 1
            and total(s, NODES + "_sum", runtime_ref=ref) == 2
        )
        assert total(s, ACCELERATORS + "_sum", runtime_ref=ref, accelerator_class="nvidia.com/gpu") == 2

        # Update: other policies, framework label and default numNodes.
        obj = sim.store.get(TRAINING_RUNTIMES, "team1", "custom")
        obj["metadata"]["labels"]["trainer.kubeflow.org/framework"] = "deepspeed"
        obj["spec"]["mlPolicy"] = {"numNodes": 4, "mpi": {"numProcPerNode": 1}}
        obj["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 60}}
        updated_rv = sim.store.update(TRAINING_RUNTIMES, "team1", obj)["metadata"]["resourceVersion"]
        await wait_caught_up(r, sim.store)
        snap = (await r.http.get("/debug/snapshot")).json()
        entry = next(rt for rt in snap["runtimes"] if rt["runtime_ref"] == ref)
        assert entry["resource_version"] == updated_rv and entry["num_nodes"] == 4
        s = await r.samples()
        # The first scrape after the informer saw it shows only the new series.
        assert [
            (x["ml_policy"], x["pod_group_policy"], x["framework"]) for x in runtime_series(s, "custom")
        ] == [("mpi", "coscheduling", "deepspeed")]
        create_job(sim, "team1", "after-update", runtime="custom", kind="TrainingRuntime")
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert total(s, NODES + "_count", runtime_ref=ref) == 2
        assert total(s, NODES + "_sum", runtime_ref=ref) == 2 + 4  # resolved with the updated runtime
        assert total(s, ACCELERATORS + "_sum", runtime_ref=ref, accelerator_class="nvidia.com/gpu") == 2 + 4

        # Delete: the series disappears at once; a later job resolves without it (numNodes 1, no GPU).
        sim.store.delete(TRAINING_RUNTIMES, "team1", "custom")
        sim.store.delete(CLUSTER_TRAINING_RUNTIMES, None, "xgboost-distributed")
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert runtime_series(s, "custom") == [] and runtime_series(s, "xgboost-distributed") == []
        snap = (await r.http.get("/debug/snapshot")).json()
        assert ref not in {rt["runtime_ref"] for rt in snap["runtimes"]}
        create_job(sim, "team1", "after-delete", runtime="custom", kind="TrainingRuntime")
        # Its resolution may wait briefly for the runtime to (re)appear (product.md §3), then uses defaults.
        await wait_caught_up(r, sim.store, timeout=20)
        s = await scrape_counts(r)
        assert total(s, NODES + "_count", runtime_ref=ref) == 3
        assert total(s, NODES + "_sum", runtime_ref=ref) == 2 + 4 + 1
        assert total(s, ACCELERATORS + "_count", runtime_ref=ref, accelerator_class="none") == 1
        # Jobs that still reference the deleted runtime keep their label.
        assert total(s, JOBS, runtime_ref=ref) == 3


# --- 6. malformed objects ----------------------------------------------------------------------------


async def test_malformed_objects_skipped_with_a_log_line(
    sim: SimulatedCluster, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with replica(kubeconfig, "a", leader_election=False, **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        snap = (await r.http.get("/debug/snapshot")).json()
        torch_nodes = next(rt for rt in snap["runtimes"] if rt["runtime_ref"] == TORCH)["num_nodes"] or 1

        create_job(sim, "team1", "bad-nodes", num_nodes="abc")
        create_job(sim, "team1", "map-conditions", num_nodes=1)
        write_status(
            sim.store, "team1", "map-conditions", {"conditions": {"type": "Complete", "status": "True"}}
        )
        create_job(sim, "team1", "odd-conditions", num_nodes=1)
        create_job(sim, "team1", "huge", num_nodes=1, annotations={"example.com/blob": "x" * 1_000_000})
        create_job(sim, "team1", "foreign-kind", runtime="torch", api_group="kubeflow.org", kind="PyTorchJob")
        create_job(sim, "team1", "string-status", num_nodes=1)
        write_status(sim.store, "team1", "string-status", "garbage")  # type: ignore[arg-type]
        sim.store.create(CLUSTER_TRAINING_RUNTIMES, None, runtime_manifest("bad-runtime", num_nodes="abc"))
        # Several MODIFIED writes of a malformed job, one of them terminal with junk beside the condition.
        for i in range(3):
            write_status(sim.store, "team1", "bad-nodes", running_status() | {"trainerStatus": {"i": i}})
        odd = terminal_status("Failed", "FailedJobs")
        write_status(sim.store, "team1", "odd-conditions", {"conditions": ["junk", 42, *odd["conditions"]]})
        await wait_caught_up(r, sim.store, timeout=20)
        # ... and a relist that sees them all again.
        break_trainjob_watch(
            sim, lambda: write_status(sim.store, "team1", "bad-nodes", {"trainerStatus": {"i": 99}})
        )
        await eventually(lambda: _relisted(r), timeout=20, what="TrainJob relist after 410")
        await wait_caught_up(r, sim.store, timeout=20)

        # Still alive and serving; a well-formed job created now is counted as usual.
        create_job(sim, "team1", "canary", num_nodes=8)
        await wait_caught_up(r, sim.store)
        assert (await r.http.get("/livez")).status_code == 200
        assert (await r.http.get("/readyz")).status_code == 200
        s = await scrape_counts(r)
        assert total(s, "trainer_metrics_informer_relists_total", reason="internal") == 0
        assert total(s, "trainer_metrics_informer_skipped_objects_total", reason="handler_error") == 0
        assert r.service.liveness_problems() == []

        # Counted as best it can be.
        assert by_labels(s, CREATED, "runtime_ref") == {(TORCH,): 6, ("unknown",): 1}
        # numNodes "abc" falls back to the runtime's default; the canary asked for 8.
        assert total(s, NODES + "_bucket", runtime_ref=TORCH, le="+Inf") == 6
        assert total(s, NODES + "_sum", runtime_ref=TORCH) == torch_nodes + 1 + 1 + 1 + 1 + 8
        assert by_labels(s, FINISHED, "result", "reason") == {("failed", "FailedJobs"): 1}
        assert by_labels(s, JOBS, "runtime_ref", "state") == {
            (TORCH, "running"): 1,  # bad-nodes
            (TORCH, "pending"): 4,  # map-conditions, huge, string-status, canary
            (TORCH, "failed"): 1,  # odd-conditions
            ("unknown", "pending"): 1,  # foreign-kind
        }
        assert [x["ml_policy"] for x in runtime_series(s, "bad-runtime")] == ["torch"]

        # Logged once per object, however many times it was seen.
        def lines_about(needle: str) -> int:
            return sum(
                1 for rec in caplog.records if rec.levelno >= logging.WARNING and needle in rec.getMessage()
            )

        for key in ("bad-nodes", "map-conditions", "odd-conditions", "foreign-kind", "string-status"):
            assert lines_about(f"team1/{key}") == 1, key
        assert lines_about("bad-runtime") == 1
        assert lines_about("team1/canary") == 0 and lines_about("team1/huge") == 0


# --- 7. scrapes --------------------------------------------------------------------------------------


async def test_scrape_makes_no_api_call(sim: SimulatedCluster, kubeconfig: Path) -> None:
    WorkloadGenerator(sim.store, seed=7, namespaces=3).populate(300)
    async with replica(
        kubeconfig, "a", leader_election=False, watch_inactivity_timeout_seconds=120, **QUIET
    ) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        requests_before = sim.server.counters["requests"]
        # From here any API request hangs: a scrape that needed one would time out instead of answering.
        sim.faults.stall_requests()
        try:
            headers = (
                {},
                {"Accept": "application/openmetrics-text; version=1.0.0"},
                {"Accept-Encoding": "gzip"},
            )
            for i in range(150):
                resp = await asyncio.wait_for(r.http.get("/metrics", headers=headers[i % 3]), 10)
                assert resp.status_code == 200
                assert b"kubeflow_trainer_trainjobs{" in resp.content
            for path in ("/debug/snapshot", "/debug/terminal", "/debug/leadership", "/readyz", "/livez"):
                resp = await asyncio.wait_for(r.http.get(path), 10)
                assert resp.status_code == 200, path
            requests_after = sim.server.counters["requests"]
            stalled = sim.faults.counters["stalled_requests"]
        finally:
            sim.faults.release_requests()
        assert requests_after - requests_before == 0
        assert stalled == 0


# --- the cap on references to missing runtimes ------------------------------------------------------


async def test_junk_runtime_refs_capped(sim: SimulatedCluster, kubeconfig: Path) -> None:
    async with replica(kubeconfig, "a", leader_election=False, max_unknown_runtime_refs=3, **QUIET) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        # numNodes and resourcesPerNode given: nothing waits for the (missing) runtime.
        for i in range(6):
            create_job(sim, "team1", f"junk-{i}", runtime=f"missing-{i}", num_nodes=1, gpus_per_node=1)
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        kept = {(cluster_ref(f"missing-{i}"),): 1.0 for i in range(3)}
        assert by_labels(s, JOBS, "runtime_ref") == kept | {("unknown",): 3}
        assert by_labels(s, CREATED, "runtime_ref") == kept | {("unknown",): 3}
        assert (await r.http.get("/debug/snapshot")).json()["unknown_runtime_refs"] == 3
        # The self-telemetry shows the cap at work: one hit per ref refused its own label (at least).
        assert total(s, "trainer_metrics_limit_hits_total", limit="unknown_runtime_refs") >= 3

        # The runtime of a collapsed ref arrives: its jobs get their real label (no longer capped) ...
        sim.store.create(CLUSTER_TRAINING_RUNTIMES, None, runtime_manifest("missing-4"))
        # ... and a ref whose last job is deleted frees its slot for a new one.
        sim.store.delete(TRAINJOBS, "team1", "junk-0")
        await wait_caught_up(r, sim.store)
        create_job(sim, "team1", "junk-9", runtime="missing-9", num_nodes=1, gpus_per_node=1)
        await wait_caught_up(r, sim.store)
        s = await scrape_counts(r)
        assert by_labels(s, JOBS, "runtime_ref") == {
            (cluster_ref("missing-1"),): 1,
            (cluster_ref("missing-2"),): 1,
            (cluster_ref("missing-4"),): 1,
            (cluster_ref("missing-9"),): 1,
            ("unknown",): 2,  # missing-3, missing-5
        }
        assert (await r.http.get("/debug/snapshot")).json()["unknown_runtime_refs"] == 3
