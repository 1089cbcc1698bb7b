"""A job runs on its runtime's snapshot, not on the live runtime.

At a TrainJob's first reconcile the controller copies the runtime it uses into the
``<trainjob>-runtime-snapshot`` ConfigMap and builds from that copy ever after (kubeflow/trainer v2.3.0
``pkg/runtime/core/snapshot.go`` createRuntimeSnapshot; ``trainingruntime.go`` NewObjects calls
getRuntimeSnapshot before it reads the runtime). A runtime in use may be edited (``pkg/webhooks/
trainingruntime_webhook.go`` ValidateUpdate accepts any edit) or deleted (no finalizer), and the JobSet plugin
leaves an existing JobSet alone (``plugins/jobset/jobset.go`` Build). So the child Jobs a running job has, and
which of them is its training step, are those of its runtime as it was when the job was first reconciled: the
projector resolves a job's training step once, when its runtime is first known, and keeps it in the
projection (app/trainer/field_builders.py resolve_step). Before, the step was looked up in the live runtime
on every event, and editing a runtime's replicated-job names, or deleting it, turned its running jobs pending
at their next status write.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from app.trainer import rules
from app.trainer.events import JobStarted
from app.trainer.informer_projectors import CLUSTER_TRAINING_RUNTIME_PROJECTOR, TrainJobProjector
from app.trainer.projection_types import RuntimeProjection, TrainJobProjection
from app.trainer.state import TrainerState
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import Clock, G, runtime, runtime_doc
from tests.trainer.test_training_step import Wall, job_obj, rj

CUSTOM = f"{G}/ClusterTrainingRuntime//custom-steps"


def custom_runtime(trainer_name: str, *, rv: str = "1") -> RuntimeProjection:
    """torch-distributed-with-cache renamed: its trainer job is called ``trainer_name`` (labelled ancestor
    ``trainer``), a name the controller's fallback naming does not know."""
    obj = copy.deepcopy(runtime_doc("torch-distributed-with-cache"))
    obj["metadata"]["name"] = "custom-steps"
    obj["metadata"]["resourceVersion"] = rv
    prep, trainer = obj["spec"]["template"]["spec"]["replicatedJobs"]
    prep["name"], trainer["name"] = "prep", trainer_name
    trainer.pop("dependsOn", None)
    p = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    assert p is not None
    return p


def status_write(
    projector: TrainJobProjector, previous: TrainJobProjection | None, jobs: list[dict[str, Any]], rv: int
) -> TrainJobProjection:
    """A watch event of the job as the informer projects it: the status alone against the cached projection
    when the spec is unchanged, else the whole object with the cached projection (app/kube/ingest.py)."""
    line = msgspec.json.encode(job_obj("custom-steps", jobs, rv=rv))
    if previous is not None:
        status = msgspec.json.decode(line, type=projector.status_wire_type)
        updated = projector.from_status_wire(status, previous)
        if updated is not None:
            return updated
    result: TrainJobProjection = projector.from_wire(
        msgspec.json.decode(line, type=projector.wire_type), previous
    )
    return result


RUNNING = [rj("prep", succeeded=1), rj("trainer", ready=1, active=1)]


def _state() -> tuple[TrainerState, TrainJobProjector, RecordingSink, Wall]:
    sink, wall = RecordingSink(), Wall()
    state = TrainerState(sink, clock=Clock(), wall_clock=wall)
    return state, TrainJobProjector(runtimes=state.runtimes_by_ref), sink, wall


def test_an_edited_runtime_leaves_its_running_jobs_running() -> None:
    state, projector, _, _ = _state()
    state.runtime_handler.on_added(custom_runtime("trainer"), True)
    job = status_write(projector, None, RUNNING, 10)
    state.job_handler.on_added(job, False)
    assert job.state == "running"
    # The runtime's trainer job is renamed under the running job (the webhook accepts the edit).
    state.runtime_handler.on_updated(custom_runtime("trainer"), custom_runtime("worker", rv="2"))
    later = status_write(projector, job, RUNNING, 11)
    state.job_handler.on_updated(job, later)
    assert later.state == "running"  # before: pending, "trainer" no longer being a training-step name
    assert state.jobs_gauge() == {("team-a", CUSTOM, "running"): 1}
    # A spec write (a new generation: the whole object is projected) keeps the snapshot too.
    obj = job_obj("custom-steps", RUNNING, rv=12)
    obj["metadata"]["generation"] = 2
    wire = msgspec.json.decode(msgspec.json.encode(obj), type=projector.wire_type)
    assert projector.from_wire(wire, later).state == "running"
    # A job first seen after the edit runs on the edited runtime.
    fresh = projector.from_wire(wire)
    assert fresh.state == "pending"
    assert rules.STEP_SETS[fresh.step] == frozenset({"worker"})


def test_a_deleted_runtime_leaves_its_running_jobs_running() -> None:
    state, projector, _, _ = _state()
    state.runtime_handler.on_added(custom_runtime("trainer"), True)
    job = status_write(projector, None, RUNNING, 10)
    state.job_handler.on_added(job, False)
    state.runtime_handler.on_deleted(custom_runtime("trainer"))
    later = status_write(projector, job, RUNNING, 11)
    assert later.state == "running"  # before: pending, read by the controller's naming (node, launcher)


def test_a_runtime_that_arrives_later_resolves_the_jobs_waiting_for_it() -> None:
    """Seen before its runtime (its watch lags), a job is read by the controller's naming and not resolved;
    its first event after the runtime arrived resolves it, once: a later edit does not move it."""
    state, projector, sink, wall = _state()
    job = status_write(projector, None, RUNNING, 10)
    state.job_handler.on_added(job, False)
    assert job.state == "pending" and job.step == 0
    state.runtime_handler.on_added(custom_runtime("trainer"), False)
    wall.now += 30.0
    later = status_write(projector, job, RUNNING, 11)
    state.job_handler.on_updated(job, later)
    assert later.state == "running" and rules.STEP_SETS[later.step] == frozenset({"trainer"})
    assert [e.startup_seconds for e in sink.events if isinstance(e, JobStarted)] == [90.0]
    state.runtime_handler.on_updated(custom_runtime("trainer"), custom_runtime("worker", rv="2"))
    assert status_write(projector, later, RUNNING, 12).state == "running"


def test_a_job_listed_before_its_runtime_is_first_read_when_resolved() -> None:
    """A replica's first TrainJob list can come before its runtime list: an MPI job whose ``node`` workers
    are ready reads running by the controller's naming (``node``, ``launcher``) until its runtime is known.
    Resolved at its next event it is pending (its launcher is not ready), which is its first reading, not a
    job that left running: its run, when the launcher is ready, is observed. Before: taken for a job that
    ran before the replica looked, and never observed."""
    sink, wall = RecordingSink(), Wall()
    state = TrainerState(sink, clock=Clock(), wall_clock=wall)
    projector = TrainJobProjector(runtimes=state.runtimes_by_ref)

    def mpi(jobs: list[dict[str, Any]], rv: int, previous: TrainJobProjection | None) -> TrainJobProjection:
        line = msgspec.json.encode(job_obj("deepspeed-distributed", jobs, rv=rv))
        return projector.from_wire(msgspec.json.decode(line, type=projector.wire_type), previous)

    workers = [rj("node", ready=1, active=1), rj("launcher")]
    listed = mpi(workers, 10, None)
    assert listed.state == "running" and listed.step == 0  # a guess: its runtime is not known yet
    state.job_handler.on_added(listed, True)
    state.runtime_handler.on_added(runtime("deepspeed-distributed"), True)
    resolved = mpi([*workers[:1], rj("launcher", active=1)], 11, listed)
    state.job_handler.on_updated(listed, resolved)
    assert resolved.state == "pending"
    wall.now += 60.0
    running = mpi([rj("node", ready=1, active=1), rj("launcher", ready=1, active=1)], 12, resolved)
    state.job_handler.on_updated(resolved, running)
    assert [e.startup_seconds for e in sink.events if isinstance(e, JobStarted)] == [120.0]
