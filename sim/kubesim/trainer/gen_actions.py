"""The TrainJob lifecycle transitions the workload generator can make: each public method is one logical
event (a user, Kueue or the Trainer controller) made of one or two writes, with the status the controller
would write (docs/design/trainer-domain.md §1-§2).

Split from ``sim/kubesim/trainer/generator.py``: what a transition writes is independent of when the drivers
decide to make it. Every draw comes from the generator's ``rng`` in a fixed order, so a seed replays the same
writes; the state this layer reads is set up by ``WorkloadGenerator.__init__``.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from kubesim.apiserver.status import StoreError
from kubesim.trainer import shapes
from kubesim.trainer.gen_adversarial import MAX_HUGE_JOBS, bend_shape, bend_status
from kubesim.trainer.gen_population import DELETING, FINISHED, PENDING, RUNNING, SUSPENDED, JobRecord
from kubesim.trainer.gen_writes import StoreWrites
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.shapes import JobShape, WeightedPicker
from kubesim.trainer.truth import parse_time

# One logger for the whole generator, whichever module writes: tests and operators filter on this name.
log = logging.getLogger("kubesim.trainer.generator")

COMPLETE: Final = "Complete"
COMPLETE_AND_FAILED: Final = "CompleteAndFailed"  # both True on one write: Failed must win
NOT_SUPPORTED: Final = "TrainingRuntimeNotSupported"
# Terminal outcomes of a running job: mostly success, the real failure reasons, rarely a reason upstream
# does not list (well-formed ones keep their name, the others count as "other": shapes.FAILURE_MESSAGES)
# and rarely Complete and Failed both True.
OUTCOMES: Final = (
    (COMPLETE, 70.0),
    ("FailedJobs", 12.0),
    ("DeadlineExceeded", 4.0),  # only for jobs with activeDeadlineSeconds; else FailedJobs
    ("ReachedMaxRestarts", 5.0),
    ("FailJobSetFailurePolicyAction", 3.0),
    ("PodFailurePolicyRuleMatched", 1.0),
    ("InPlaceRestartBudgetExhausted", 0.5),
    ("evicted_by_descheduler", 0.5),
    ("Preempted:HigherPriority", 0.5),
    ("FailedJobsBecauseTheNodePoolWasScaledDownWhileTheTrainerPodsWereStillRunning", 0.5),
    (COMPLETE_AND_FAILED, 2.0),
)
# Share of start() writes whose child Jobs are active but not ready: pods waiting for capacity (GPUs,
# quota) or still starting. The job is pending until progress() reports its pods ready.
WAITING_FOR_CAPACITY: Final = 0.5
LAST_RFC3339_SECOND: Final = 253_402_300_799.0  # 9999-12-31T23:59:59Z: a big time_warp stays parseable


class JobActions(StoreWrites):
    """create_job, admit, preempt, start, progress, train, finish, duplicate_terminal, delete and
    remove_finalizer, each on one ``JobRecord``."""

    rng: random.Random
    clock: Callable[[], float]
    suspend_ratio: float
    finalizer_ratio: float
    malformed_ratio: float
    time_warp: float
    _outcomes: WeightedPicker[str]
    _failures: WeightedPicker[str]
    _salt: str
    _sequence: int
    _huge_jobs: int

    def create_job(self, suspended: bool | None = None, *, allow_huge: bool = True) -> JobRecord | None:
        """Create a TrainJob (``suspended``: Kueue-style queue label + spec.suspend; None = random).
        A suspended job also gets the controller's Suspended=True status write. None when refused."""
        namespace = self.namespaces[int(self.rng.random() * len(self.namespaces))]
        runtime = self.catalog.picker(namespace).pick(self.rng)
        name = shapes.job_name(self.rng, self._next_suffix())
        ratio = self.suspend_ratio if suspended is None else float(suspended)
        shape = shapes.random_shape(self.rng, namespace, name, runtime, suspend_ratio=ratio)
        shape.finalizer = self.rng.random() < self.finalizer_ratio
        malformed = self.malformed_ratio > 0 and self.rng.random() < self.malformed_ratio
        if malformed and bend_shape(
            self.rng, shape, huge_allowed=allow_huge and self._huge_jobs < MAX_HUGE_JOBS
        ):
            self._huge_jobs += 1
        stored = self._create_stored(shape)
        if stored is None:
            return None
        self.truth.job_created(stored, malformed=malformed)
        rec = self._remember(stored, shape)
        if shape.queue is not None:
            rec.conditions = [shapes.suspended_condition(self._now())]
            self._write_status(rec, {"conditions": rec.conditions}, SUSPENDED)
        return rec

    def admit(self, rec: JobRecord) -> None:
        """Kueue admits: spec.suspend → false; the controller answers Suspended=False/Resumed."""
        if self._patch(rec, {"spec": {"suspend": False}}) is None:
            return
        rec.conditions = [c for c in rec.conditions if c["type"] != "Suspended"]
        rec.conditions.append(shapes.resumed_condition(self._now()))
        status = {"conditions": rec.conditions, "jobsStatus": shapes.jobs_status(rec.runtime.replicated_jobs)}
        self._write_status(rec, status, PENDING)

    def preempt(self, rec: JobRecord) -> None:
        """Kueue preempts: spec.suspend → true; the controller writes Suspended=True, child Jobs suspended."""
        if self._patch(rec, {"spec": {"suspend": True}}) is None:
            return
        rec.conditions = [c for c in rec.conditions if c["type"] != "Suspended"]
        rec.conditions.append(shapes.suspended_condition(self._now()))
        jobs = shapes.jobs_status(rec.runtime.replicated_jobs, suspended=True)
        rec.stage = 0
        self._write_status(rec, {"conditions": rec.conditions, "jobsStatus": jobs}, SUSPENDED)

    def start(self, rec: JobRecord, *, warm: bool = False) -> None:
        """Child Jobs become active: the initializers first when the runtime has them, else the trainer;
        their pods are ready (the job runs) or, WAITING_FOR_CAPACITY of the time, still pending. A trainer
        that runs reports its trainerStatus; ``warm``: it has trained for a while (populate())."""
        runtime = rec.runtime
        initializing = rec.stage == 0 and bool(runtime.initializers)
        rec.stage = 0 if initializing else 1
        active = runtime.initializers if initializing else runtime.trainers
        ready = self.rng.random() >= WAITING_FOR_CAPACITY
        jobs = shapes.jobs_status(runtime.replicated_jobs, active=active, ready=ready)
        status: dict[str, Any] = {"conditions": rec.conditions, "jobsStatus": jobs}
        if ready and not initializing:
            status["trainerStatus"] = self._trainer_status(rec, warm)
        self._write_status(rec, self._maybe_bend_status(status), RUNNING)

    def progress(self, rec: JobRecord) -> None:
        """Child Jobs move on: the initializers finish and the trainer runs with its pods ready."""
        runtime = rec.runtime
        rec.stage = 1
        jobs = shapes.jobs_status(
            runtime.replicated_jobs, active=runtime.trainers, succeeded=runtime.initializers, ready=True
        )
        status = {
            "conditions": rec.conditions,
            "jobsStatus": jobs,
            "trainerStatus": self._trainer_status(rec),
        }
        self._write_status(rec, self._maybe_bend_status(status), RUNNING)

    def train(self, rec: JobRecord) -> None:
        """The trainer reports (status.trainerStatus, KEP-2779): progress ticks, loss goes down, the ETA
        follows. A job whose trainer is not running yet gets there first (progress())."""
        if rec.training is None:
            self.progress(rec)
            return
        self._write_status(rec, {"trainerStatus": self._trainer_status(rec)}, RUNNING)

    def _trainer_status(self, rec: JobRecord, warm: bool = False) -> dict[str, Any]:
        """The next trainerStatus of ``rec``'s trainer (its first when it has not reported yet)."""
        if rec.training is None:
            rec.training = shapes.TrainingRun.begin(self.rng, self.clock(), warm=warm)
        else:
            rec.training.advance(self.rng)
        return rec.training.status(self.clock())

    def finish(self, rec: JobRecord, outcome: str | None = None) -> None:
        """Terminal status write. ``outcome`` is "Complete", "CompleteAndFailed" or a Failed reason;
        None picks one (a job that never ran can only fail by deadline or an unsupported runtime)."""
        outcome = outcome or self._pick_outcome(rec)
        when = self._terminal_time(rec)
        runtime = rec.runtime
        jobs: list[dict[str, Any]] | None
        if outcome == COMPLETE:
            terminal = [shapes.complete_condition(when)]
            jobs = shapes.jobs_status(runtime.replicated_jobs, succeeded=runtime.replicated_jobs)
        elif outcome == NOT_SUPPORTED:
            terminal = [shapes.failed_condition(outcome, when)]
            jobs = None  # the controller never built a JobSet
        else:
            terminal = [
                shapes.failed_condition("FailedJobs" if outcome == COMPLETE_AND_FAILED else outcome, when)
            ]
            if outcome == COMPLETE_AND_FAILED:
                terminal.insert(0, shapes.complete_condition(when))
            jobs = shapes.jobs_status(
                runtime.replicated_jobs, succeeded=runtime.initializers, failed=runtime.trainers
            )
        rec.conditions = [c for c in rec.conditions if c["type"] not in ("Complete", "Failed")] + terminal
        self._write_status(rec, {"conditions": rec.conditions, "jobsStatus": jobs}, FINISHED)

    def duplicate_terminal(self, rec: JobRecord) -> None:
        """The controller refreshes a finished job's status: same terminal condition, other fields change."""
        status: dict[str, Any] = {"conditions": rec.conditions}
        if self.rng.random() < 0.3:
            status["jobsStatus"] = None  # JobSet gone (TTL): the conditions stay
        metrics = [{"name": "loss", "value": f"{self.rng.random():.4f}"}]
        status["trainerStatus"] = {
            "progressPercentage": 100,
            "lastUpdatedTime": self._now(),
            "metrics": metrics,
        }
        self._write_status(rec, self._maybe_bend_status(status), FINISHED)

    def delete(self, rec: JobRecord) -> None:
        """Delete; a job carrying our finalizer stays (deletionTimestamp set) until remove_finalizer()."""
        try:
            stored = self._store_delete(rec)
        except StoreError as exc:
            self._write_failed(rec, exc)
            return
        meta = stored.get("metadata") or {}
        if meta.get("deletionTimestamp") and meta.get("finalizers"):
            self.truth.job_written(stored)
            self.population.set_phase(rec, DELETING)
        else:
            self._forget(rec)

    def remove_finalizer(self, rec: JobRecord) -> None:
        """Our finalizer's work is done: remove it, which lets the store delete the object."""
        if self._patch(rec, {"metadata": {"finalizers": None}}) is None:
            return
        try:
            still = self._get(TRAINJOBS, rec.namespace, rec.name)
        except StoreError as exc:
            if exc.code != 404:
                raise
            self._forget(rec)
            return
        self.truth.job_written(still)  # not deleted after all: keep the truth exact

    # -- helpers of the transitions ------------------------------------------------------------------
    def _next_suffix(self) -> str:
        # The salt comes from the seeded rng: two generators sharing a store rarely pick the same names.
        self._sequence += 1
        return f"{self._salt}{self._sequence:x}"

    def _create_stored(self, shape: JobShape) -> dict[str, Any] | None:
        """store.create, retrying a taken name with a fresh suffix and shrinking an annotation the
        store finds too large (a real apiserver caps annotations at 256 KiB in total)."""
        for _ in range(3):
            try:
                return self._create(TRAINJOBS, shape.namespace, shapes.trainjob(shape))
            except StoreError as exc:
                if exc.code == 409:
                    shape.name = shapes.job_name(self.rng, self._next_suffix())
                elif exc.code in (413, 422) and shape.annotations:
                    shape.annotations = {shapes.HUGE_ANNOTATION: "x" * 200_000}
                elif 400 <= exc.code < 500:
                    log.debug("store refused TrainJob %s/%s: %s", shape.namespace, shape.name, exc)
                    return None
                else:
                    raise
        return None

    def _remember(self, stored: dict[str, Any], shape: JobShape) -> JobRecord:
        meta = stored.get("metadata") or {}
        created = _parse_time(meta.get("creationTimestamp"))
        rec = JobRecord(
            namespace=shape.namespace,
            name=shape.name,
            uid=str(meta.get("uid", "")),
            runtime=shape.runtime,
            created_at=created.timestamp() if created else self.clock(),
            deadline=shape.deadline is not None,
            phase=SUSPENDED if shape.queue is not None else PENDING,
        )
        self.population.add(rec)
        return rec

    def _pick_outcome(self, rec: JobRecord) -> str:
        if rec.phase != RUNNING:
            return "DeadlineExceeded" if rec.deadline else NOT_SUPPORTED
        outcome = self._outcomes.pick(self.rng)
        if outcome == "DeadlineExceeded" and not rec.deadline:
            return "FailedJobs"
        return outcome

    def _now(self) -> str:
        return shapes.rfc3339(self.clock())

    def _terminal_time(self, rec: JobRecord) -> str:
        elapsed = max(0.0, self.clock() - rec.created_at)
        return shapes.rfc3339(min(rec.created_at + elapsed * self.time_warp, LAST_RFC3339_SECOND))

    def _maybe_bend_status(self, status: dict[str, Any]) -> dict[str, Any]:
        """Sometimes make a status write odd without changing what it means for the metrics."""
        if self.malformed_ratio <= 0 or self.rng.random() >= self.malformed_ratio:
            return status
        return bend_status(self.rng, status, self._now)


@functools.lru_cache(maxsize=256)
def _parse_time(value: Any) -> datetime | None:
    # populate() creates thousands of jobs per second: they share a few creationTimestamps.
    return parse_time(value)
