"""TrainJobs driven on purpose through every shape of tests/support/trainer_shapes.py, and through the node
count and device edge cases, so that a test comparing the exporter with the ground truth covers each one
whatever its random workload drew. Waits only for deadlines to fall due (the generator's time warp makes
that milliseconds), never for a fixed time.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any, Final

from kubesim.trainer import jobset
from kubesim.trainer.gen_population import FINISHED, ORPHANED, RUNNING, SUSPENDED, JobRecord
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.jobset import BACKOFF_LIMIT_EXCEEDED, POD_FAILURE_POLICY
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.shapes_runtimes import cluster_runtimes
from tests.support.trainer_shapes import (
    ADMITTED_BEFORE_CONTROLLER,
    ADMITTED_CONTROLLER_DOWN,
    INITIALIZER_THEN_CAPACITY_WAIT,
    INITIALIZERS,
    JOBSET_FAILURE,
    MPI_WORKERS_FIRST,
    RESTARTED,
    RUNTIME_DELETED,
    RUNTIME_EDITED,
    ShapeCensus,
)
from tests.support.waiting import eventually

# resourcesPerNode of the device edge cases: Intel's non-device resources beside a device and alone,
# NVIDIA's time-sliced GPUs.
INTEL_WITH_SHARES: Final = {
    "limits": {"gpu.intel.com/i915": 1, "gpu.intel.com/millicores": 500, "gpu.intel.com/memory.max": "8G"}
}
INTEL_SHARES_ONLY: Final = {"limits": {"gpu.intel.com/millicores": "250", "gpu.intel.com/xe_monitoring": 1}}
SHARED_GPUS: Final = {"limits": {"nvidia.com/gpu.shared": 2}}
# What every scenario job is unless it says otherwise. One node: a trainer of 0 pods (numNodes 0, which the
# generator draws now and then) never runs and cannot fail, it completes (gen_cluster.finish), so a scenario
# that needs a running trainer would otherwise depend on the draw.
PLAIN: Final[dict[str, Any]] = {
    "num_nodes": 1,
    "deadline": None,
    "multikueue": False,
    "annotations": None,
    "finalizer": False,
}


Settle = Callable[[], Awaitable[None]]


async def play_every_shape(gen: WorkloadGenerator, census: ShapeCensus, settle: Settle | None = None) -> None:
    """Create and drive the jobs; the census (subscribed to the store) must see each shape afterwards.

    ``settle``: waits until a watcher of the store (the exporter under test) has seen every write so far.
    The runtime edits wait for it: which runtime version a job is first resolved with depends on which of
    the two watches, TrainJobs' or runtimes', delivers first, as it depends on the controller's first
    reconcile on a real cluster; settled, there is one answer."""
    await _initializers_then_capacity(gen)
    await _deadlines(gen)
    _jobset_failures(gen, census)
    _multikueue(gen)
    _edge_cases(gen)
    _mpi_workers_first(gen, census)
    await _admission_orders(gen, census)
    await _runtime_edited_and_deleted(gen, census, settle)


async def _initializers_then_capacity(gen: WorkloadGenerator) -> None:
    """torchtune: both initializers run (ready while they download) and finish, then the trainer's pods wait
    for capacity: pending all along, until they are ready."""
    rec = _create(gen, suspended=False, runtime="torchtune-llama3.2-1b", num_nodes=1)
    gen.progress(rec)
    assert rec.phase == RUNNING, INITIALIZER_THEN_CAPACITY_WAIT
    gen.finish(rec, "Complete")


async def _deadlines(gen: WorkloadGenerator) -> None:
    """One deadline counted from creation; one from the last of two admissions, the job preempted after it
    ran in between (its JobSet suspended: its Jobs counted suspended)."""
    from_creation = _create(gen, suspended=False, runtime="torch-distributed", deadline=600)
    gen.progress(from_creation)
    # 12 hours: seconds of a loaded machine's wall time at the ground-truth test's time warp, ample to run and
    # be preempted before the deadline counts again from the second admission.
    resumed = _create(gen, suspended=True, runtime="torch-distributed-with-cache", deadline=43_200)
    _admit(gen, resumed)
    gen.progress(resumed)
    gen.preempt(resumed)
    _admit(gen, resumed)
    gen.advance(resumed)

    def both_failed() -> bool:
        gen.expire_deadlines()
        return from_creation.phase == FINISHED and resumed.phase == FINISHED

    await eventually(both_failed, timeout=30, what="both deadlines fall due")


def _admit(gen: WorkloadGenerator, rec: JobRecord) -> None:
    """Kueue's queue: the JobSet's passes (its Jobs created and counted suspended), then the admission."""
    for _ in range(8):
        if rec.phase != SUSPENDED:
            return
        gen.queued(rec)
    raise AssertionError(f"{rec.name} was never admitted")


def _jobset_failures(gen: WorkloadGenerator, census: ShapeCensus) -> None:
    """A child Job fails: without a failure policy the JobSet fails (FailedJobs; a few tries, as now and then
    a failure comes with a reason JobSet v0.12 does not write); with one it restarts the JobSet (the job back
    to pending after it ran) until it gives up, or fails it at once by a rule."""
    for _ in range(12):
        if census.shapes[JOBSET_FAILURE]:
            break
        rec = _create(gen, suspended=False, runtime="torch-distributed")
        gen.finish(rec, "Failed")
    # Crashes past the backoffLimit, every time: restarted twice (maxRestarts), then ReachedMaxRestarts.
    rec = _create(gen, suspended=False, runtime="sim-torch-restartable")
    for _ in range(3):
        gen.finish(rec, "Failed", reason=BACKOFF_LIMIT_EXCEEDED)
    # The exit code its pod failure policy fails the Job on: FailJobSetFailurePolicyAction at once.
    rec = _create(gen, suspended=False, runtime="sim-torch-restartable")
    gen.finish(rec, "Failed", reason=POD_FAILURE_POLICY)
    assert census.shapes[JOBSET_FAILURE] and census.shapes[RESTARTED]


def _multikueue(gen: WorkloadGenerator) -> None:
    """A MultiKueue job a worker runs (its status copied back whole) and one no worker admits (none)."""
    copied = _create(gen, suspended=True, multikueue=True, dispatch=True)
    for _ in range(96):
        if copied.phase == FINISHED:
            break
        gen.remote_step(copied)
    assert copied.phase == FINISHED
    silent = _create(gen, suspended=True, multikueue=True, dispatch=False)
    assert silent.phase == ORPHANED
    ref = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntimes", "name": "torch-distributed"}
    unregistered = _create(gen, suspended=False, ref=ref)
    assert unregistered.phase == ORPHANED


def _edge_cases(gen: WorkloadGenerator) -> None:
    """Node counts and devices as the controller has them (their truth is checked by the caller)."""
    _create(gen, suspended=False, runtime="deepspeed-distributed", num_nodes=1)  # launcher + 1 worker: 2
    _create(gen, suspended=False, runtime="sim-unlabelled-node", num_nodes=8)  # numNodes ignored: 2
    _create(gen, suspended=False, runtime="torch-distributed", num_nodes=2, resources=INTEL_WITH_SHARES)
    _create(gen, suspended=False, runtime="torch-distributed", num_nodes=2, resources=INTEL_SHARES_ONLY)
    _create(gen, suspended=False, runtime="torch-distributed", num_nodes=2, resources=SHARED_GPUS)


def _mpi_workers_first(gen: WorkloadGenerator, census: ShapeCensus) -> None:
    """deepspeed with 3 nodes: two ``node`` workers (sshd) ready, then the launcher created (JobSet dependsOn
    node Ready: jobset v0.12.0 depends_on.go), its pod started, and only then ready (mpirun running)."""
    rec = _create(gen, suspended=False, runtime="deepspeed-distributed", num_nodes=3)
    gen.progress(rec, limit=48)
    assert rec.phase == RUNNING and census.shapes[MPI_WORKERS_FIRST], MPI_WORKERS_FIRST


async def _admission_orders(gen: WorkloadGenerator, census: ShapeCensus) -> None:
    """The orders of writes that admit a queued job besides the usual one (which the random workload plays):
    Kueue ahead of a controller whose queue has not reached the job (a burst: no Suspended condition, ever),
    and Kueue admitting while the controller is down (Resumed only when it is back, later)."""
    early = _create(gen, suspended=True, runtime="torch-distributed", controller_late=True)
    gen.admit(early)
    gen.controller_catches_up(early)
    gen.progress(early)
    assert early.phase == RUNNING and census.shapes[ADMITTED_BEFORE_CONTROLLER], ADMITTED_BEFORE_CONTROLLER
    down = _create(gen, suspended=True, runtime="torch-distributed")
    _settle_queued(gen, down)
    gen.admit(down, controller_down=True)
    admitted = gen.clock()
    other = _create(gen, suspended=False, runtime="torch-distributed")  # the cluster goes on meanwhile
    await eventually(lambda: (gen.clock() - admitted) * gen.time_warp > 2, timeout=30, what="time passes")
    gen.queued(down)  # the controller is back
    gen.progress(down)
    gen.progress(other)
    assert down.phase == RUNNING and census.shapes[ADMITTED_CONTROLLER_DOWN], ADMITTED_CONTROLLER_DOWN


def _settle_queued(gen: WorkloadGenerator, rec: JobRecord) -> None:
    """The JobSet passes of a queued job (its Jobs created suspended), without admitting it."""
    job = rec.job
    assert job is not None
    for _ in range(8):
        if job.jobset is None or not jobset.pass_due(job.jobset):
            return
        gen.queued(rec)


async def _runtime_edited_and_deleted(
    gen: WorkloadGenerator, census: ShapeCensus, settle: Settle | None
) -> None:
    """A runtime's trainer job renamed while two of its jobs run, a job created on the edited runtime, then
    the runtime deleted: the running jobs go on (their snapshots), and write their status after each."""

    async def settled() -> None:
        if settle is not None:
            await settle()

    doc = copy.deepcopy(next(d for d in cluster_runtimes() if d["metadata"]["name"] == "torch-distributed"))
    doc["metadata"] = {"name": "sim-edited-under-jobs", "labels": doc["metadata"].get("labels", {})}
    runtime = gen.add_runtime(doc)
    await settled()
    running = [_create(gen, suspended=False, runtime=runtime.name) for _ in range(2)]
    for rec in running:
        gen.progress(rec)
        assert rec.phase == RUNNING
    await settled()
    replicated = copy.deepcopy(doc["spec"]["template"]["spec"]["replicatedJobs"])
    for job in replicated:
        job["name"] = "trainer" if job["name"] == "node" else job["name"]
    runtime = gen.edit_runtime(runtime, replicated)
    for rec in running:
        gen.train(rec)
    await settled()
    edited = _create(gen, suspended=False, runtime=runtime.name)
    gen.progress(edited)
    await settled()
    gen.delete_runtime(runtime)
    for rec in running:
        gen.train(rec)
    assert census.shapes[RUNTIME_EDITED] and census.shapes[RUNTIME_DELETED]


def hold_initializers_downloading(gen: WorkloadGenerator) -> JobRecord:
    """A torchtune job left with its initializers ready (downloading) and no trainer pod ready: pending.
    Played last, so that the run ends with it in that state and the ``trainjobs`` gauge tells whether
    initializers make a job running (they must not: app/trainer/rules/steps.py). The other scenarios cannot
    show it: their writes follow each other at one wall instant, so time to running reads the same either
    way, and a job in that state at the end of the random workload is chance."""
    rec = _create(gen, suspended=False, runtime="torchtune-llama3.2-1b", num_nodes=1)
    for _ in range(24):
        jobs = {
            j.get("name"): j
            for j in (gen.store.get(TRAINJOBS, rec.namespace, rec.name).get("status") or {}).get("jobsStatus")
            or []
        }
        if any((jobs[n].get("ready") or 0) > 0 for n in INITIALIZERS & jobs.keys()):
            assert not any((j.get("ready") or 0) > 0 for n, j in jobs.items() if n not in INITIALIZERS), jobs
            return rec
        if not gen.advance(rec):
            break
    raise AssertionError(f"{rec.namespace}/{rec.name}: no initializer ever ready")


def _create(gen: WorkloadGenerator, **kw: Any) -> JobRecord:
    rec = gen.create_job(**{**PLAIN, **kw})
    assert rec is not None
    return rec
