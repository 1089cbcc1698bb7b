"""The training steps of jobs whose runtime changed since they were resolved, carried in the Lease
(app/handover/history.py, app/trainer/snapshots.py), as the jobs that ran before are.

The controller runs every TrainJob from the copy of its runtime taken at the job's first reconcile
(kubeflow/trainer v2.3.0 pkg/runtime/core/snapshot.go; trainingruntime.go NewObjects reads the
``<trainjob>-runtime-snapshot`` ConfigMap first), whatever happened to the runtime since. A replica that lists
such a job after its runtime was edited would read it by the edited runtime: the leader publishes the step it
resolved, and the new replica resolves the job from it.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from app.handover.history import TRAINING_STEPS_ANNOTATION, format_training_steps, parse_training_steps
from app.handover.lease_payload import LeasePayload
from app.handover.watermarks import LeaseWatermarks
from app.kube.lease import LeaseRecord
from app.trainer.informer_projectors import TrainJobProjector
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import Clock
from tests.trainer.test_runtime_snapshot import RUNNING, custom_runtime
from tests.trainer.test_training_step import job_obj

UID = "0a1b2c3d-0000-4000-8000-0000000000aa"


def _job(projector: TrainJobProjector, rv: int) -> TrainJobProjection:
    obj: dict[str, Any] = job_obj("custom-steps", RUNNING, rv=rv)
    obj["metadata"]["uid"] = UID
    result: TrainJobProjection = projector.from_wire(
        msgspec.json.decode(msgspec.json.encode(obj), type=projector.wire_type)
    )
    return result


def _replica() -> tuple[TrainerState, TrainJobProjector, LeasePayload]:
    state = TrainerState(RecordingSink(), clock=Clock())
    projector = TrainJobProjector(runtimes=state.runtimes_by_ref, steps=state.inherited_steps)
    return state, projector, LeasePayload(LeaseWatermarks("r"), state)


def test_round_trip_and_malformed_entries() -> None:
    uids = [str(uuid.UUID(int=i + 1)) for i in range(3)]
    steps = {
        uids[0]: frozenset({"trainer"}),
        uids[1]: frozenset({"node", "launcher"}),
        uids[2]: frozenset({"trainer"}),
    }
    annotations = format_training_steps(steps)
    assert parse_training_steps(annotations) == steps
    assert parse_training_steps({}) == {}
    assert parse_training_steps({TRAINING_STEPS_ANNOTATION: "[1]"}) == {}
    assert parse_training_steps({TRAINING_STEPS_ANNOTATION: '{"Bad Name": "", "ok": 7}'}) == {}


def test_a_replica_that_lists_a_job_after_its_runtime_changed_reads_it_as_the_leader_resolved_it() -> None:
    leader, leader_projector, leader_payload = _replica()
    leader.runtime_handler.on_added(custom_runtime("trainer"), True)
    job = _job(leader_projector, 10)
    leader.job_handler.on_added(job, True)
    leader.watch_jobs(lambda: [job])
    assert leader.published_snapshots() == {}  # nothing changed: nothing to say
    leader.runtime_handler.on_updated(custom_runtime("trainer"), custom_runtime("worker", rv="2"))
    assert leader.published_snapshots() == {UID: frozenset({"trainer"})}
    annotations = leader_payload.annotations({})

    # A replica started after the edit: without the Lease it reads the job by the edited runtime.
    alone, alone_projector, _ = _replica()
    alone.runtime_handler.on_added(custom_runtime("worker", rv="2"), True)
    assert _job(alone_projector, 11).state == "pending"
    # With it (read before its first list), as the leader did: running.
    new, new_projector, new_payload = _replica()
    new_payload.observe(LeaseRecord("leader", 15, None, None, 0, annotations, "1"))
    new.runtime_handler.on_added(custom_runtime("worker", rv="2"), True)
    listed = _job(new_projector, 11)
    assert listed.state == "running"
    new.job_handler.on_added(listed, True)
    # It publishes the fact on in its turn, and forgets it with the job.
    assert new.published_snapshots() == {UID: frozenset({"trainer"})}
    new.job_handler.on_deleted(listed)
    assert new.published_snapshots() == {}
