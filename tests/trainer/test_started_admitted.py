"""Time to running and admission wait at the TrainerState layer: each a countable edge observed at most once
per uid, with the initial-list rule of ``finished`` mirrored (app/trainer/state.py module docstring)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from app.handover.settle import counted_before
from app.metrics.counted import AT_FLOOR_RESUMED, AT_FLOOR_RUNNING, AT_FLOOR_TERMINAL
from app.trainer.events import JobAdmitted, JobCreated, JobFinished, JobStarted
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR, TrainJobProjector
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from app.trainer.wire import JobStatus, TrainJobWire
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import TORCH, Clock, runtime

CREATED = "2025-06-01T10:00:00Z"
CREATED_EPOCH = 1748772000.0
ADMITTED = "2025-06-01T10:07:30Z"  # 450 s after creation
WALL = CREATED_EPOCH + 1000.0


class Wall:
    def __init__(self) -> None:
        self.now = WALL

    def __call__(self) -> float:
        return self.now


def job(
    name: str = "j1",
    *,
    rv: int = 10,
    uid: str | None = None,
    runtime_name: str = "torch-distributed",
    suspend: bool = False,
    suspended: bool = False,  # the Suspended condition True
    resumed: str | None = None,  # lastTransitionTime of a Suspended=False/Resumed condition
    ready: bool = False,
    complete: bool = False,
) -> TrainJobProjection:
    conditions: list[dict[str, Any]] = []
    if suspended:
        conditions.append({"type": "Suspended", "status": "True", "reason": "Suspended"})
    elif resumed is not None:
        conditions.append(
            {"type": "Suspended", "status": "False", "reason": "Resumed", "lastTransitionTime": resumed}
        )
    if complete:
        conditions.append(
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "lastTransitionTime": ADMITTED,
            }
        )
    obj = {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
            "generation": 1,
            "creationTimestamp": CREATED,
        },
        "spec": {"runtimeRef": {"name": runtime_name}, "suspend": suspend},
        "status": {
            "conditions": conditions,
            "jobsStatus": [{"name": "node", "active": 1, "ready": int(ready)}],
        },
    }
    p = TRAINJOB_PROJECTOR.from_json(obj)
    assert p is not None
    # The typed path reads the same (both paths feed the same rules).
    typed = TRAINJOB_PROJECTOR.from_wire(
        msgspec.json.decode(msgspec.json.encode(obj), type=TRAINJOB_PROJECTOR.wire_type)
    )
    assert typed == p
    return p


def make() -> tuple[TrainerState, RecordingSink, Wall]:
    sink, wall = RecordingSink(), Wall()
    state = TrainerState(sink, clock=Clock(), wall_clock=wall)
    state.runtime_handler.on_added(runtime(), True)
    return state, sink, wall


def started(sink: RecordingSink) -> list[JobStarted]:
    return [e for e in sink.events if isinstance(e, JobStarted)]


def admitted(sink: RecordingSink) -> list[JobAdmitted]:
    return [e for e in sink.events if isinstance(e, JobAdmitted)]


class Driver:
    """Feeds successive states of one job as the informer would (add, then updates)."""

    def __init__(self, state: TrainerState, first: TrainJobProjection, *, initial: bool) -> None:
        self.state = state
        self.current = first
        state.job_handler.on_added(first, initial)

    def to(self, new: TrainJobProjection) -> None:
        self.state.job_handler.on_updated(self.current, new)
        self.current = new


def test_a_job_seen_running_for_the_first_time_is_observed_once() -> None:
    state, sink, wall = make()
    d = Driver(state, job(rv=10), initial=False)
    d.to(job(rv=11, ready=True))
    # at: when it was seen running (creation + startup), for the exemplar
    seen = CREATED_EPOCH + 1000.0
    assert started(sink) == [JobStarted(11, "uid-j1", TORCH, 1000.0, "team-a", key="team-a/j1", at=seen)]
    # Pods lost (pending again), then ready again; preempted and resumed; resyncs: never again.
    wall.now += 50
    d.to(job(rv=12))
    d.to(job(rv=13, ready=True))
    d.to(job(rv=14, ready=True))
    d.to(job(rv=15, suspend=True, suspended=True))
    d.to(job(rv=16, resumed=ADMITTED))
    d.to(job(rv=17, resumed=ADMITTED, ready=True))
    d.to(job(rv=18, complete=True))
    assert len(started(sink)) == 1
    # Resumed after it ran: a re-admission, not an admission wait.
    assert admitted(sink) == []
    assert not state.history.ran and not state.history.admitted  # the terminal set guards it now


def test_running_in_the_initial_list_is_never_observed() -> None:
    """As a job terminal in the initial list is never counted finished: it started before we looked."""
    state, sink, _ = make()
    d = Driver(state, job(rv=10, ready=True), initial=True)
    d.to(job(rv=11))  # pending again
    d.to(job(rv=12, ready=True))
    assert started(sink) == [] and sink.events == []


def test_pending_in_the_initial_list_is_observed_when_it_runs() -> None:
    state, sink, _ = make()
    d = Driver(state, job(rv=10), initial=True)
    d.to(job(rv=11, ready=True))
    assert [e.rv for e in started(sink)] == [11]
    assert [type(e) for e in sink.events] == [JobStarted]  # not created: it was in the initial list


def test_first_seen_after_the_initial_list_already_running_counts_created_and_started() -> None:
    """Created and started while the watch was down: a relist finds it running (``since`` tags both)."""
    state, sink, _ = make()
    state.job_handler.on_relist(7)
    state.job_handler.on_added(job(rv=20, ready=True), False)
    state.job_handler.on_relist(None)
    assert [(type(e), e.rv, e.since) for e in sink.events] == [(JobCreated, 20, 7), (JobStarted, 20, 7)]


def test_a_job_that_finishes_without_running_is_not_observed() -> None:
    state, sink, _ = make()
    d = Driver(state, job(rv=10), initial=False)
    d.to(job(rv=11, complete=True))
    assert started(sink) == []
    # ... and one first seen terminal (created, run and finished in a gap) neither: when it ran is unknown.
    state.job_handler.on_added(job("j2", rv=12, resumed=ADMITTED, complete=True), False)
    assert started(sink) == [] and admitted(sink) == []
    assert len([e for e in sink.events if isinstance(e, JobFinished)]) == 2


def test_admission_wait_of_a_job_created_suspended() -> None:
    state, sink, _ = make()
    d = Driver(state, job(rv=10, suspend=True), initial=False)  # Kueue creates it suspended
    d.to(job(rv=11, suspend=True, suspended=True))  # the controller's Suspended=True
    d.to(job(rv=12, suspended=True))  # Kueue admits: spec.suspend false; the condition still True
    assert admitted(sink) == []
    d.to(job(rv=13, resumed=ADMITTED))  # the controller: Suspended=False/Resumed
    # at: the Resumed condition's time
    resumed = CREATED_EPOCH + 450.0
    assert admitted(sink) == [JobAdmitted(13, "uid-j1", TORCH, 450.0, "team-a", key="team-a/j1", at=resumed)]
    d.to(job(rv=14, resumed=ADMITTED, ready=True))
    assert [e.rv for e in started(sink)] == [14]
    # Preempted and admitted again: neither edge again.
    d.to(job(rv=15, suspend=True, suspended=True))
    d.to(job(rv=16, resumed="2025-06-01T11:00:00Z"))
    d.to(job(rv=17, resumed="2025-06-01T11:00:00Z", ready=True))
    assert len(admitted(sink)) == 1 and len(started(sink)) == 1


def test_admission_rules_of_the_initial_list() -> None:
    state, sink, _ = make()
    # Already resumed in the initial list: admitted before we looked, never observed (also not after a
    # preemption and a second admission).
    a = Driver(state, job("a", rv=10, resumed=ADMITTED), initial=True)
    a.to(job("a", rv=11, suspend=True, suspended=True))
    a.to(job("a", rv=12, resumed="2025-06-01T12:00:00Z"))
    # Suspended in the initial list: its admission is observed.
    b = Driver(state, job("b", rv=13, suspend=True, suspended=True), initial=True)
    b.to(job("b", rv=14, resumed=ADMITTED))
    assert [(e.uid, e.rv) for e in admitted(sink)] == [("uid-b", 14)]


def test_a_job_resumed_after_it_ran_is_no_admission() -> None:
    """Suspended by hand (or preempted) after it ran: its Resumed condition is not an admission wait."""
    state, sink, _ = make()
    d = Driver(state, job(rv=10), initial=False)
    d.to(job(rv=11, ready=True))
    d.to(job(rv=12, suspend=True, suspended=True))
    d.to(job(rv=13, resumed=ADMITTED))
    assert admitted(sink) == [] and len(started(sink)) == 1


def test_edges_of_a_job_waiting_for_its_runtime_wait_behind_its_created_edge() -> None:
    """A hand-over watermark at a started edge must never cover its created edge uncounted."""
    state, sink, _ = make()
    later = "deepspeed-distributed"  # not known yet: its created edge waits for it (app/trainer/pending.py)
    d = Driver(state, job(rv=10, suspend=True, suspended=True, runtime_name=later), initial=False)
    d.to(job(rv=11, resumed=ADMITTED, runtime_name=later))
    d.to(job(rv=12, resumed=ADMITTED, ready=True, runtime_name=later))
    assert sink.events == []
    state.runtime_handler.on_added(runtime(later), False)
    assert [(type(e), e.rv) for e in sink.events] == [(JobCreated, 10), (JobAdmitted, 11), (JobStarted, 12)]


def test_a_spurious_delete_and_re_add_recounts_nothing() -> None:
    state, sink, _ = make()
    d = Driver(state, job(rv=10, suspend=True, suspended=True), initial=False)
    d.to(job(rv=11, resumed=ADMITTED))
    d.to(job(rv=12, resumed=ADMITTED, ready=True))
    state.job_handler.on_deleted(d.current)
    state.job_handler.on_added(job(rv=13, resumed=ADMITTED, ready=True), False)
    assert [type(e) for e in sink.events] == [JobCreated, JobAdmitted, JobStarted]
    # ... also when it was preempted (not running, not resumed) at the delete.
    d2 = Driver(state, job("b", rv=20), initial=False)
    d2.to(job("b", rv=21, ready=True))
    d2.to(job("b", rv=22, suspend=True, suspended=True))
    state.job_handler.on_deleted(d2.current)
    state.job_handler.on_added(job("b", rv=23, resumed=ADMITTED, ready=True), False)
    assert [type(e) for e in sink.events][3:] == [JobCreated, JobStarted]


def test_status_writes_that_change_nothing_cost_no_edge_work() -> None:
    """The per-event path: a job whose state and Resumed condition did not change keeps no entry and emits
    nothing, however many status writes come."""
    state, sink, _ = make()
    d = Driver(state, job(rv=10, ready=True), initial=False)
    for rv in range(11, 200):
        d.to(job(rv=rv, ready=True))
    assert [type(e) for e in sink.events] == [JobCreated, JobStarted]
    assert not state.history.ran and not state.history.admitted


def test_negative_startup_from_clock_skew_is_zero() -> None:
    state, sink, wall = make()
    wall.now = CREATED_EPOCH - 5  # this replica's clock behind the API server's
    d = Driver(state, job(rv=10), initial=False)
    d.to(job(rv=11, ready=True))
    assert started(sink)[0].startup_seconds == 0.0


@pytest.mark.parametrize(
    ("event", "bits", "counted"),
    [
        (JobStarted(5, "u", TORCH, 1.0), AT_FLOOR_RUNNING, True),
        (JobStarted(5, "u", TORCH, 1.0), 0, False),  # pending (or absent) at the floor
        (JobStarted(5, "u", TORCH, 1.0), AT_FLOOR_RESUMED, False),
        (JobAdmitted(5, "u", TORCH, 1.0), AT_FLOOR_RESUMED, True),
        (JobAdmitted(5, "u", TORCH, 1.0), AT_FLOOR_RESUMED | AT_FLOOR_RUNNING, True),
        (JobAdmitted(5, "u", TORCH, 1.0), 0, False),  # still suspended at the floor
        (JobFinished(5, "u", "succeeded", "none", TORCH, 1.0), AT_FLOOR_TERMINAL, True),
        (JobFinished(5, "u", "succeeded", "none", TORCH, 1.0), AT_FLOOR_RUNNING, False),
    ],
)
def test_an_uncertain_edge_is_settled_from_the_state_at_the_floor(
    event: JobStarted | JobAdmitted | JobFinished, bits: int, counted: bool
) -> None:
    assert counted_before(event, {"u": bits}) is counted


def test_resumed_condition_and_trainer_status_are_projected_alike_on_both_paths() -> None:
    projector = TrainJobProjector(trainer_status=True, max_trainer_metrics=2)
    obj = {
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "3",
            "creationTimestamp": CREATED,
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
        "status": {
            "conditions": [
                {"type": "Suspended", "status": "False", "reason": "Resumed", "lastTransitionTime": ADMITTED}
            ],
            "trainerStatus": {
                "progressPercentage": 40,
                "estimatedRemainingSeconds": 900,
                "lastUpdatedTime": ADMITTED,
                "metrics": [
                    {"name": "loss", "value": "0.2500"},
                    {"name": "checkpoint", "value": "s3://bucket/ckpt-300"},
                    {"name": "loss", "value": "0.1"},
                    {"name": "eval_accuracy", "value": "0.93"},
                    {"name": "lr", "value": "3e-05"},
                ],
            },
        },
    }
    tolerant = projector.from_json(obj)
    typed = projector.from_wire(msgspec.json.decode(msgspec.json.encode(obj), type=projector.wire_type))
    assert typed == tolerant and tolerant is not None
    assert tolerant.resumed and tolerant.resumed_time == CREATED_EPOCH + 450
    progress = tolerant.progress
    assert progress is not None
    assert progress.percent == 40.0 and progress.remaining_seconds == 900.0
    assert progress.updated == CREATED_EPOCH + 450
    assert progress.metrics == (("loss", 0.25), ("eval_accuracy", 0.93))
    assert (progress.skipped_unparsable, progress.skipped_invalid_name, progress.skipped_over_cap) == (
        1,
        1,
        1,
    )
    # Off (the default projector), trainerStatus is not read at all: only the resumed time is kept.
    plain = TRAINJOB_PROJECTOR.from_json(obj)
    assert plain is not None and plain.progress is None and plain.resumed_time == CREATED_EPOCH + 450
    assert TRAINJOB_PROJECTOR.wire_type is TrainJobWire and "trainerStatus" not in JobStatus.__struct_fields__


# --- jobs that ran before, known from another replica (app/trainer/history.py) --------------------------
# A preempted TrainJob and one waiting for its first admission look the same: the controller writes
# Suspended=True/"Suspended" for both (kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go,
# setSuspendedCondition), and JobSet suspends the child Jobs of both (kubernetes-sigs/jobset
# pkg/controllers/jobset_controller.go, suspendJobs). Only a replica that saw the job run knows.

PREEMPTED_UID = "0a1b2c3d-0000-4000-8000-00000000000a"


def _preempted(rv: int) -> TrainJobProjection:
    return job(rv=rv, uid=PREEMPTED_UID, suspend=True, suspended=True)


def test_a_replica_started_while_a_job_was_preempted_counts_its_next_run_without_the_fact() -> None:
    """The control: with no inherited fact, the next run after a preemption looks like the first."""
    state, sink, _ = make()
    d = Driver(state, _preempted(20), initial=True)
    d.to(job(rv=21, uid=PREEMPTED_UID, resumed=ADMITTED))
    d.to(job(rv=22, uid=PREEMPTED_UID, resumed=ADMITTED, ready=True))
    assert len(started(sink)) == 1 and len(admitted(sink)) == 1


def test_an_inherited_fact_keeps_the_next_run_and_readmission_of_a_preempted_job_uncounted() -> None:
    """The replica that saw the job run publishes it; the one that started while it was preempted merges it
    and counts neither the re-admission nor the next run, and keeps knowing it after that run."""
    leader, leader_sink, _ = make()
    d = Driver(leader, job(rv=10, uid=PREEMPTED_UID, suspend=True, suspended=True), initial=False)
    d.to(job(rv=11, uid=PREEMPTED_UID, resumed=ADMITTED))
    d.to(job(rv=12, uid=PREEMPTED_UID, resumed=ADMITTED, ready=True))
    d.to(_preempted(13))
    assert len(started(leader_sink)) == 1 and len(admitted(leader_sink)) == 1
    ran, was_admitted = leader.published_history()
    assert ran == [PREEMPTED_UID] and was_admitted == [PREEMPTED_UID]

    follower, sink, _ = make()
    f = Driver(follower, _preempted(13), initial=True)
    assert follower.inherit_history(ran, was_admitted) == 2
    assert follower.inherit_history(ran, was_admitted) == 0  # merged, not duplicated
    f.to(job(rv=14, uid=PREEMPTED_UID, resumed=ADMITTED))
    f.to(job(rv=15, uid=PREEMPTED_UID, resumed=ADMITTED, ready=True))
    f.to(_preempted(16))
    f.to(job(rv=17, uid=PREEMPTED_UID, resumed=ADMITTED, ready=True))
    assert started(sink) == [] and admitted(sink) == []
    # It publishes the fact on in its turn (it saw the job leave running, then run again).
    f.to(_preempted(18))
    assert follower.published_history() == ([PREEMPTED_UID], [PREEMPTED_UID])


def test_inherited_facts_end_with_the_job_and_skip_jobs_already_seen_deleted() -> None:
    state, _, _ = make()
    d = Driver(state, _preempted(20), initial=True)
    state.inherit_history([PREEMPTED_UID], [PREEMPTED_UID])
    d.to(job(rv=21, uid=PREEMPTED_UID, complete=True))
    assert state.published_history() == ([], [])  # the terminal set guards it now
    state.job_handler.on_deleted(d.current)
    assert state.inherit_history([PREEMPTED_UID], []) == 0  # a late publication of a deleted job
    assert state.history.inherited == 0


def test_inherited_facts_about_jobs_absent_from_the_synced_caches_are_forgotten() -> None:
    state, _, _ = make()
    gone = "0a1b2c3d-0000-4000-8000-00000000000b"
    p = _preempted(20)
    state.job_handler.on_added(p, True)
    state.inherit_history([PREEMPTED_UID, gone], [gone])
    assert state.forget_inherited_except([p.uid_key]) == 2
    assert state.published_history() == ([PREEMPTED_UID], [])


def test_a_re_added_job_with_an_inherited_fact_counts_created_but_not_its_run() -> None:
    """First seen after the initial list already running (a watch gap), but known to have run before."""
    state, sink, _ = make()
    state.inherit_history([PREEMPTED_UID], [PREEMPTED_UID])
    state.job_handler.on_added(job(rv=30, uid=PREEMPTED_UID, resumed=ADMITTED, ready=True), False)
    assert [type(e) for e in sink.events].count(JobCreated) == 1
    assert started(sink) == [] and admitted(sink) == []


# --- every order of writes that admits a queued job ----------------------------------------------------
# Kueue's webhook creates a queued TrainJob with spec.suspend true (kubernetes-sigs/kueue v0.19.2
# pkg/controller/jobs/trainjob/trainjob_webhook.go Default); admission is RunWithPodSetsInfo then Unsuspend,
# preemption Stop (spec.suspend true again) then RestorePodSetsInfo (pkg/controller/jobs/trainjob
# trainjob_controller.go). The Trainer controller answers each reconcile with setSuspendedCondition
# (kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go): Suspended=True while spec.suspend, then
# False/Resumed, but only over a True condition; with spec.suspend false and no True condition it writes none.
# Kueue does not wait for the controller (its getChildJobSet builds the JobSet spec from the runtime itself),
# so a burst the controller's queue has not reached, or a controller restart, admits a job the controller
# never saw suspended.


def test_admitted_before_the_controller_wrote_any_condition_is_timed_by_the_exporter_clock() -> None:
    """Burst / controller down: spec.suspend goes true -> false and the controller, when it gets to the job,
    writes no Suspended condition at all. No object records the admission: the exporter's clock when it saw
    the job leave suspended bounds it from above. Before: never observed."""
    state, sink, wall = make()
    d = Driver(state, job(rv=10, suspend=True), initial=False)
    wall.now = CREATED_EPOCH + 120.0
    d.to(job(rv=11))  # Kueue unsuspended it; no Suspended condition, now or later
    assert admitted(sink) == [
        JobAdmitted(11, "uid-j1", TORCH, 120.0, "team-a", key="team-a/j1", at=CREATED_EPOCH + 120.0)
    ]
    d.to(job(rv=12, ready=True))
    assert len(admitted(sink)) == 1 and len(started(sink)) == 1


def test_a_controller_late_to_a_burst_admission_does_not_count_it_twice() -> None:
    """The controller reconciled from a cache still showing spec.suspend true and wrote Suspended=True after
    Kueue's unsuspend (a status merge patch needs no resourceVersion), then Resumed at its next reconcile:
    the job went back to suspended and out again, one admission, the first."""
    state, sink, wall = make()
    d = Driver(state, job(rv=10, suspend=True), initial=False)
    wall.now = CREATED_EPOCH + 60.0
    d.to(job(rv=11))
    d.to(job(rv=12, suspended=True))
    d.to(job(rv=13, resumed=ADMITTED))
    assert [(e.rv, e.wait_seconds) for e in admitted(sink)] == [(11, 60.0)]


def test_admitted_while_the_controller_was_down_is_timed_by_its_resumed_condition() -> None:
    """Suspended=True written, then Kueue unsuspends while the controller is down: the job stays suspended
    (the controller has not resumed its JobSet) until the restarted controller writes Resumed, whose
    lastTransitionTime is when the job stopped waiting."""
    state, sink, wall = make()
    d = Driver(state, job(rv=10, suspend=True, suspended=True), initial=False)
    d.to(job(rv=11, suspended=True))  # spec.suspend false; no controller to answer
    wall.now = CREATED_EPOCH + 5000.0
    assert admitted(sink) == []
    d.to(job(rv=12, resumed="2025-06-01T10:30:00Z"))
    assert [(e.rv, e.wait_seconds) for e in admitted(sink)] == [(12, 1800.0)]


def test_a_burst_admission_preempted_before_the_controller_saw_it_counts_the_first_admission() -> None:
    """Admitted with no condition, preempted (the controller then writes Suspended=True), admitted again
    (Resumed): the Resumed condition is a re-admission. Before: the first admission was missed and the
    re-admission counted, with the whole time since creation."""
    state, sink, wall = make()
    d = Driver(state, job(rv=10, suspend=True), initial=False)
    wall.now = CREATED_EPOCH + 30.0
    d.to(job(rv=11))
    d.to(job(rv=12, suspend=True))
    d.to(job(rv=13, suspend=True, suspended=True))
    d.to(job(rv=14, suspended=True))
    d.to(job(rv=15, resumed=ADMITTED))
    assert [(e.rv, e.wait_seconds) for e in admitted(sink)] == [(11, 30.0)]


def test_a_job_created_unsuspended_never_waited_for_admission() -> None:
    """Not queued: suspended later by hand and resumed, it waited for no admission since its creation.
    Before: its Resumed condition counted as an admission wait."""
    state, sink, _ = make()
    d = Driver(state, job(rv=10), initial=False)
    d.to(job(rv=11, suspend=True))
    d.to(job(rv=12, suspend=True, suspended=True))
    d.to(job(rv=13, resumed=ADMITTED))
    assert admitted(sink) == []
