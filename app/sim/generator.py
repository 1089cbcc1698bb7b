"""Workload generator for the simulated cluster: creates runtimes and TrainJobs in a Store and drives the
TrainJobs through suspend, admission, running, completion, failure and deletion with the status writes
the Trainer controller makes (docs/design/trainer-domain.md §1-§2), while keeping an independent ground truth
(``app/sim/truth.py``) of what the exporter's metrics should report.

Everything random comes from one ``random.Random(seed)``, so a seed replays the same sequence of writes
against an empty store. Timestamps come from ``clock`` (wall time unless a test injects one).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol

from app.kube.resources import ResourceKind
from app.sim import shapes
from app.sim.shapes import JobShape, RuntimeChoice, WeightedPicker
from app.sim.status import StoreError
from app.sim.store import Store
from app.sim.truth import Truth, TruthSnapshot, parse_time
from app.sim.validation import WriteOptions
from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINER_GROUP, TRAINING_RUNTIMES, TRAINJOBS

log = logging.getLogger(__name__)

# Generator-side phases (the truth derives the metric states itself from the stored objects).
SUSPENDED: Final = "suspended"
PENDING: Final = "pending"
RUNNING: Final = "running"
FINISHED: Final = "finished"
DELETING: Final = "deleting"  # deleted while our finalizer holds it
PHASES: Final = (SUSPENDED, PENDING, RUNNING, FINISHED, DELETING)
# Finished, but younger than ``min_delete_age``: terminal writes yes, deletion not yet (not in PHASES, so
# the default generator, min_delete_age 0, never uses it).
COOLING: Final = "cooling"

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
HUGE_ANNOTATION_BYTES: Final = 1_000_000
MAX_HUGE_JOBS: Final = 4  # bound the memory adversarial mode can pin in the store
LAST_RFC3339_SECOND: Final = 253_402_300_799.0  # 9999-12-31T23:59:59Z: a big time_warp stays parseable

Action = tuple[str, float, Callable[[], object]]
# The generator's writes are validated like a client's (schema, CEL rules, metadata; unknown fields refused),
# so what it stores is what a real cluster would; its namespaces are created when first used.
GENERATOR_WRITES: Final = WriteOptions(validate=True, field_validation="Strict", require_namespace=False)


class StoreLike(Protocol):
    """The subset of ``app.sim.store.Store`` the generator uses."""

    @property
    def resource_version(self) -> int: ...

    def create(
        self, resource: ResourceKind, namespace: str | None, obj: dict[str, Any], *, field_manager: str = ...
    ) -> dict[str, Any]: ...

    def get(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]: ...

    def list(self, resource: ResourceKind, namespace: str | None) -> tuple[list[dict[str, Any]], int]: ...

    def patch(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = ...,
        patch_type: str = ...,
        field_manager: str = ...,
    ) -> dict[str, Any]: ...

    def delete(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]: ...


@dataclass(slots=True, eq=False)
class JobRecord:
    """The generator's memory of one live TrainJob: enough to write its next status like the controller."""

    namespace: str
    name: str
    uid: str
    runtime: RuntimeChoice
    created_at: float
    deadline: bool
    phase: str = PENDING
    conditions: list[dict[str, Any]] = field(default_factory=list)
    stage: int = 0  # 0 = initializers running (if the runtime has any), 1 = trainer running
    slot: int = -1  # index in its phase bucket
    finished_at: float = 0.0  # clock() of its first terminal write (for min_delete_age)
    training: shapes.TrainingRun | None = None  # what its trainer reports (trainerStatus), once it runs


class _Bucket:
    """Jobs of one phase, with O(1) add, remove and uniform random pick."""

    def __init__(self) -> None:
        self.items: list[JobRecord] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, rec: JobRecord) -> None:
        rec.slot = len(self.items)
        self.items.append(rec)

    def remove(self, rec: JobRecord) -> None:
        last = self.items.pop()
        if last is not rec:
            self.items[rec.slot] = last
            last.slot = rec.slot
        rec.slot = -1

    def pick(self, rng: random.Random) -> JobRecord:
        return self.items[int(rng.random() * len(self.items))]


class WorkloadGenerator:
    """Creates and drives Trainer objects in ``store``; ``truth`` says what the metrics should show."""

    def __init__(
        self,
        store: StoreLike,
        *,
        seed: int | None = None,
        namespaces: int = 5,
        max_jobs: int = 1000,
        suspend_ratio: float = 0.2,
        finalizer_ratio: float = 0.15,
        malformed_ratio: float = 0.0,
        time_warp: float = 1.0,
        clock: Callable[[], float] = time.time,
        min_delete_age: float = 0.0,
    ) -> None:
        """``max_jobs`` bounds the live population step() keeps; ``time_warp`` stretches lifetimes
        (terminal lastTransitionTime = creation + elapsed * warp) so a short run fills minute-to-day
        histogram buckets; ``malformed_ratio`` is the share of creates and status writes made odd.

        ``min_delete_age`` (seconds of ``clock``): step() deletes a finished TrainJob only once it has been
        finished that long, and cancels (deletes) an unfinished one only once it exists that long, as on a
        real cluster where finished jobs stay for minutes to days (a TTL, a user, a pipeline cleaning up).
        0 (the default) deletes at once. A job created, finished and deleted within one relist gap of a
        list+watch client is invisible to it; this bounds how short-lived the generated jobs are.
        ``lifecycles()`` ignores it (its driver deletes when the lifecycle ends)."""
        self.store = store
        # The real Store can hand back its stored objects instead of copies: the generator and the truth
        # only read what a write returns (any other StoreLike is used through the protocol).
        self._direct: Store | None = store if isinstance(store, Store) else None
        self.rng = random.Random(seed)
        self.namespaces = shapes.namespace_names(max(1, namespaces))
        self.max_jobs = max_jobs
        self.suspend_ratio = suspend_ratio
        self.finalizer_ratio = finalizer_ratio
        self.malformed_ratio = malformed_ratio
        self.time_warp = time_warp
        self.clock = clock
        self.truth = Truth(clock=clock)
        self.runtimes: list[RuntimeChoice] = []
        self.jobs: dict[str, JobRecord] = {}  # uid -> live record
        self.buckets: dict[str, _Bucket] = {phase: _Bucket() for phase in (*PHASES, COOLING)}
        self.min_delete_age = max(0.0, min_delete_age)
        self._cooling: deque[JobRecord] = deque()  # COOLING jobs, oldest first
        self.steps = 0
        self._pickers: dict[str, WeightedPicker[RuntimeChoice]] = {}
        self._outcomes = WeightedPicker([o for o, _ in OUTCOMES], [w for _, w in OUTCOMES])
        failures = [(o, w) for o, w in OUTCOMES if o != COMPLETE]
        self._failures = WeightedPicker([o for o, _ in failures], [w for _, w in failures])
        self._populate_targets = WeightedPicker(
            [SUSPENDED, PENDING, RUNNING, COMPLETE, "failed"], [8.0, 12.0, 25.0, 45.0, 10.0]
        )
        self._salt = "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3))
        self._sequence = 0
        self._huge_jobs = 0

    # ------------------------------------------------------------------------------------------------
    # Runtimes
    # ------------------------------------------------------------------------------------------------
    def load_runtimes(self, extra: int = 0) -> list[str]:
        """Create the real ClusterTrainingRuntimes, two TrainingRuntimes per job namespace and ``extra``
        synthetic runtimes (a quarter cluster-scoped, the rest spread over the namespaces) for benchmarks.
        Runtimes that already exist are adopted. Returns the runtime_ref of every runtime known."""
        for doc in shapes.cluster_runtimes():
            self._add_runtime(CLUSTER_TRAINING_RUNTIMES, None, doc, weight=6.0)
        for doc in shapes.plain_runtimes():  # no mlPolicy: parallelism nodes, resourcesPerNode ignored
            self._add_runtime(CLUSTER_TRAINING_RUNTIMES, None, doc, weight=3.0)
        for namespace in self.namespaces:
            for doc in shapes.namespaced_runtimes(namespace):
                self._add_runtime(TRAINING_RUNTIMES, namespace, doc, weight=4.0)
        for index in range(extra):
            # A quarter cluster-scoped; synthetic runtimes share a small total weight, so jobs mostly
            # keep using the real ones.
            extra_ns = None if index % 4 == 0 else self.namespaces[index % len(self.namespaces)]
            resource = CLUSTER_TRAINING_RUNTIMES if extra_ns is None else TRAINING_RUNTIMES
            doc = shapes.synthetic_runtime(index, extra_ns)
            self._add_runtime(resource, extra_ns, doc, weight=20.0 / extra)
        self._pickers.clear()
        return [choice.ref_label for choice in self.runtimes]

    def _add_runtime(
        self, resource: ResourceKind, namespace: str | None, doc: dict[str, Any], *, weight: float
    ) -> None:
        try:
            stored = self._create(resource, namespace, doc)
        except StoreError as exc:
            if exc.code != 409:
                raise
            stored = self._get(resource, namespace, doc["metadata"]["name"])
        self.truth.runtime_written(stored)
        choice = shapes.runtime_choice(stored, weight)
        self.runtimes = [rt for rt in self.runtimes if rt.key != choice.key] + [choice]

    def _runtime_picker(self, namespace: str) -> WeightedPicker[RuntimeChoice]:
        picker = self._pickers.get(namespace)
        if picker is None:
            usable = [rt for rt in self.runtimes if rt.namespace in ("", namespace)]
            picker = WeightedPicker(usable, [rt.weight for rt in usable])
            self._pickers[namespace] = picker
        return picker

    # ------------------------------------------------------------------------------------------------
    # Public drivers
    # ------------------------------------------------------------------------------------------------
    def step(self) -> str:
        """Perform one random action on the population; returns its name ("idle" when none applied)."""
        if not self.runtimes:
            self.load_runtimes()
        self.steps += 1
        actions = self._eligible_actions()
        if not actions:
            return "idle"
        roll = self.rng.random() * sum(weight for _, weight, _ in actions)
        for name, weight, action in actions:
            roll -= weight
            if roll < 0:
                action()
                return name
        name, _, action = actions[-1]
        action()
        return name

    def populate(self, n: int) -> None:
        """Create ``n`` TrainJobs quickly in assorted states (at most two writes each)."""
        if not self.runtimes:
            self.load_runtimes()
        # Every object made here lives on: the cyclic GC would rescan the growing heap again and
        # again for nothing (~40% of the time at 100k jobs). Nothing else runs during this loop.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(n):
                self._populate_one()
        finally:
            if was_enabled:
                gc.enable()

    def _populate_one(self) -> None:
        target = self._populate_targets.pick(self.rng)
        rec = self.create_job(suspended=target == SUSPENDED, allow_huge=False)
        if rec is None or target in (SUSPENDED, PENDING):
            return
        if target == RUNNING:
            self.start(rec, warm=True)
        else:
            rec.stage = 1  # it ran: a failure shows failed trainer Jobs
            self.finish(rec, COMPLETE if target == COMPLETE else self._failures.pick(self.rng))

    async def run(self, rate: float, stop: asyncio.Event | None = None, max_steps: int | None = None) -> int:
        """Call step() ``rate`` times per second (in batches when the rate outruns the event loop) until
        ``stop`` is set or ``max_steps`` steps ran. Failed steps are logged, not raised. Returns the steps."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        loop = asyncio.get_running_loop()
        start, done = loop.time(), 0
        while (stop is None or not stop.is_set()) and (max_steps is None or done < max_steps):
            due = int((loop.time() - start) * rate) + 1
            if max_steps is not None:
                due = min(due, max_steps)
            while done < due:
                self._safe_step()
                done += 1
            await asyncio.sleep(max(0.0, start + done / rate - loop.time()))
        return done

    def lifecycles(self, n: int, *, concurrency: int = 8, delete: bool = True) -> int:
        """Run ``n`` complete TrainJob lifecycles, ``concurrency`` at a time and interleaved.
        Returns the number of actions performed."""
        return sum(1 for _ in self._lifecycle_driver(n, concurrency, delete))

    async def run_lifecycles(
        self, n: int, *, concurrency: int = 8, delete: bool = True, pause: float = 0.0
    ) -> int:
        """lifecycles(), yielding to the event loop (``pause`` seconds) after every action so that a
        server on the same loop streams the watch events as they happen."""
        actions = 0
        for _ in self._lifecycle_driver(n, concurrency, delete):
            actions += 1
            await asyncio.sleep(pause)
        return actions

    def reconcile(self) -> int:
        """Forget the jobs deleted behind the generator's back (by a test, or a client of the simulated
        API), so the truth matches the store again. Returns how many were forgotten."""
        live = {str(obj["metadata"].get("uid")) for obj in self.store.list(TRAINJOBS, None)[0]}
        gone = [rec for uid, rec in self.jobs.items() if uid not in live]
        for rec in gone:
            self._forget(rec)
        return len(gone)

    def snapshot(self) -> TruthSnapshot:
        """The truth now, stamped with the store's current resourceVersion."""
        return self.truth.snapshot(self.store.resource_version)

    # ------------------------------------------------------------------------------------------------
    # Action selection
    # ------------------------------------------------------------------------------------------------
    def _eligible_actions(self) -> list[Action]:
        if self._cooling:
            self._promote_cooled()
        count = {phase: len(bucket) for phase, bucket in self.buckets.items()}
        live = len(self.jobs)
        active = live - count[FINISHED] - count[COOLING] - count[DELETING]
        pick = self._pick
        candidates: list[Action] = [
            ("create", 4.0 if live < self.max_jobs else 0.0, self.create_job),
            ("admit", 2.0 * bool(count[SUSPENDED]), lambda: self.admit(pick(SUSPENDED))),
            ("start", 3.0 * bool(count[PENDING]), lambda: self.start(pick(PENDING))),
            ("progress", 1.5 * bool(count[RUNNING]), lambda: self.progress(pick(RUNNING))),
            ("train", 3.0 * bool(count[RUNNING]), lambda: self.train(pick(RUNNING))),
            ("finish", 3.0 * bool(count[RUNNING]), lambda: self.finish(pick(RUNNING))),
            ("fail-pending", 0.2 * bool(count[PENDING]), lambda: self.finish(pick(PENDING))),
            ("preempt", 0.2 * bool(count[RUNNING]), lambda: self.preempt(pick(RUNNING))),
            (
                "duplicate-terminal",
                0.5 * bool(count[FINISHED] or count[COOLING]),
                lambda: self.duplicate_terminal(self._pick_terminal()),
            ),
            # Deletion keeps pace with finishing, so the population settles below max_jobs.
            ("delete", 6.0 * count[FINISHED] / max(live, 1), lambda: self.delete(pick(FINISHED))),
            ("cancel", 0.05 * bool(active), self._cancel_random_active),
            ("remove-finalizer", 2.0 * bool(count[DELETING]), lambda: self.remove_finalizer(pick(DELETING))),
        ]
        return [candidate for candidate in candidates if candidate[1] > 0]

    def _pick(self, phase: str) -> JobRecord:
        return self.buckets[phase].pick(self.rng)

    def _pick_terminal(self) -> JobRecord:
        """A finished job, deletable or still cooling (one draw: the same as _pick(FINISHED) without any
        cooling job)."""
        finished, cooling = self.buckets[FINISHED].items, self.buckets[COOLING].items
        index = int(self.rng.random() * (len(finished) + len(cooling)))
        return finished[index] if index < len(finished) else cooling[index - len(finished)]

    def _promote_cooled(self) -> None:
        """Cooling jobs finished at least ``min_delete_age`` ago become deletable (FIFO: finish order)."""
        horizon = self.clock() - self.min_delete_age
        cooling = self._cooling
        while cooling and cooling[0].finished_at <= horizon:
            rec = cooling.popleft()
            if rec.phase == COOLING and rec.slot >= 0:
                self._move(rec, FINISHED)

    def _cancel_random_active(self) -> None:
        """A user deletes a job that has not finished (not one younger than ``min_delete_age``)."""
        phases = [p for p in (SUSPENDED, PENDING, RUNNING) if self.buckets[p]]
        rec = self._pick(phases[int(self.rng.random() * len(phases))])
        if self.min_delete_age and self.clock() - rec.created_at < self.min_delete_age:
            return
        self.delete(rec)

    def _safe_step(self) -> None:
        try:
            self.step()
        except Exception:
            # A long simulation must survive one refused write (a test deleting objects under us, a
            # store error); the truth only ever counts writes that succeeded.
            log.warning("workload step failed", exc_info=True)

    def _lifecycle_driver(self, n: int, concurrency: int, delete: bool) -> Iterator[None]:
        if not self.runtimes:
            self.load_runtimes()
        running: list[Iterator[None]] = []
        started = 0
        while started < n or running:
            while started < n and len(running) < max(1, concurrency):
                running.append(self._lifecycle(delete))
                started += 1
            index = int(self.rng.random() * len(running))
            try:
                next(running[index])
            except StopIteration:
                running[index] = running[-1]
                running.pop()
                continue
            yield None

    def _lifecycle(self, delete: bool) -> Iterator[None]:
        """One TrainJob from create to finished (and, with ``delete``, gone); yields after every action."""
        rec = self.create_job(suspended=self.rng.random() < self.suspend_ratio)
        if rec is None:
            return
        yield None
        if rec.phase == SUSPENDED:
            self.admit(rec)
            yield None
        if self.rng.random() < 0.05:  # never ran: deadline or unsupported runtime while pending
            self.finish(rec)
        else:
            yield from self._run_to_end(rec)
        yield None
        if rec.phase in (FINISHED, COOLING) and self.rng.random() < 0.2:
            self.duplicate_terminal(rec)
            yield None
        if delete and rec.phase in (FINISHED, COOLING):
            self.delete(rec)
            yield None
        if rec.phase == DELETING:
            self.remove_finalizer(rec)
            yield None

    def _run_to_end(self, rec: JobRecord) -> Iterator[None]:
        self.start(rec)
        if self.rng.random() < 0.05:  # preempted by Kueue, later readmitted
            yield None
            self.preempt(rec)
            yield None
            self.admit(rec)
            yield None
            self.start(rec)
        for _ in range(int(self.rng.random() * 3)):
            yield None
            self.progress(rec)
        yield None
        self.finish(rec)

    # ------------------------------------------------------------------------------------------------
    # Actions: each is one logical event (a user, Kueue or the controller), one or two writes
    # ------------------------------------------------------------------------------------------------
    def create_job(self, suspended: bool | None = None, *, allow_huge: bool = True) -> JobRecord | None:
        """Create a TrainJob (``suspended``: Kueue-style queue label + spec.suspend; None = random).
        A suspended job also gets the controller's Suspended=True status write. None when refused."""
        namespace = self.namespaces[int(self.rng.random() * len(self.namespaces))]
        runtime = self._runtime_picker(namespace).pick(self.rng)
        name = shapes.job_name(self.rng, self._next_suffix())
        ratio = self.suspend_ratio if suspended is None else float(suspended)
        shape = shapes.random_shape(self.rng, namespace, name, runtime, suspend_ratio=ratio)
        shape.finalizer = self.rng.random() < self.finalizer_ratio
        malformed = self.malformed_ratio > 0 and self.rng.random() < self.malformed_ratio
        if malformed:
            self._bend_shape(shape, allow_huge)
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
            stored = (
                self._direct.delete(TRAINJOBS, rec.namespace, rec.name, copy=False, opts=GENERATOR_WRITES)
                if self._direct is not None
                else self.store.delete(TRAINJOBS, rec.namespace, rec.name)
            )
        except StoreError as exc:
            self._write_failed(rec, exc)
            return
        meta = stored.get("metadata") or {}
        if meta.get("deletionTimestamp") and meta.get("finalizers"):
            self.truth.job_written(stored)
            self._set_phase(rec, DELETING)
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

    # ------------------------------------------------------------------------------------------------
    # Writes and bookkeeping
    # ------------------------------------------------------------------------------------------------
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
        self.jobs[rec.uid] = rec
        self.buckets[rec.phase].add(rec)
        return rec

    def _write_status(self, rec: JobRecord, status: dict[str, Any], phase: str) -> None:
        try:
            stored = self._store_patch(rec, {"status": status}, "status")
        except StoreError as exc:
            self._write_failed(rec, exc)
            return
        self.truth.job_written(stored)
        self._set_phase(rec, phase)

    def _patch(self, rec: JobRecord, patch: dict[str, Any]) -> dict[str, Any] | None:
        try:
            stored = self._store_patch(rec, patch, None)
        except StoreError as exc:
            self._write_failed(rec, exc)
            return None
        self.truth.job_written(stored)
        return stored

    def _create(self, resource: ResourceKind, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.create(resource, namespace, obj, copy=False, opts=GENERATOR_WRITES)
        return self.store.create(resource, namespace, obj)

    def _get(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.get(resource, namespace, name, copy=False)
        return self.store.get(resource, namespace, name)

    def _store_patch(self, rec: JobRecord, patch: dict[str, Any], subresource: str | None) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.patch(
                TRAINJOBS,
                rec.namespace,
                rec.name,
                patch,
                subresource=subresource,
                copy=False,
                opts=GENERATOR_WRITES,
            )
        if subresource is None:
            return self.store.patch(TRAINJOBS, rec.namespace, rec.name, patch)
        return self.store.patch(TRAINJOBS, rec.namespace, rec.name, patch, subresource=subresource)

    def _write_failed(self, rec: JobRecord, exc: StoreError) -> None:
        """404: someone else deleted the job, so forget it. Another 4xx: the store refused a deliberately
        odd write (a real apiserver rejects duplicate list-map keys), so nothing changed. Else raise."""
        if exc.code == 404:
            self._forget(rec)
        elif exc.code >= 500 or exc.code in (409, 410, 429):
            raise exc
        else:
            log.debug("store refused a write to %s/%s: %s", rec.namespace, rec.name, exc)

    def _set_phase(self, rec: JobRecord, phase: str) -> None:
        if phase == FINISHED and self.min_delete_age:
            if rec.phase == COOLING:
                return  # a duplicate terminal write: still cooling
            if rec.phase != FINISHED and rec.slot >= 0:
                rec.finished_at = self.clock()
                self._cooling.append(rec)
                phase = COOLING
        self._move(rec, phase)

    def _move(self, rec: JobRecord, phase: str) -> None:
        if rec.phase != phase and rec.slot >= 0:
            self.buckets[rec.phase].remove(rec)
            rec.phase = phase
            self.buckets[phase].add(rec)

    def _forget(self, rec: JobRecord) -> None:
        if self.jobs.pop(rec.uid, None) is not None:
            self.buckets[rec.phase].remove(rec)
        self.truth.job_deleted(rec.uid, self.store.resource_version)

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

    # ------------------------------------------------------------------------------------------------
    # Adversarial mode: odd but schema-valid objects (docs/design/product.md §6 invariant 6)
    # ------------------------------------------------------------------------------------------------
    def _bend_shape(self, shape: JobShape, allow_huge: bool) -> None:
        roll = self.rng.random()
        if roll < 0.05 and allow_huge and self._huge_jobs < MAX_HUGE_JOBS:
            self._huge_jobs += 1
            shape.annotations = {shapes.HUGE_ANNOTATION: "x" * HUGE_ANNOTATION_BYTES}
        elif roll < 0.40:
            # Valid quantities nobody writes for GPUs: fractional, suffixed, exponent form.
            gpu = ("500m", "1k", "1500m", "2e0", "0.5")[int(self.rng.random() * 5)]
            shape.resources = {"limits": {"nvidia.com/gpu": gpu}}
        elif roll < 0.55:
            # A group or kind that is not a Trainer runtime: the runtime_ref label must be "unknown".
            if self.rng.random() < 0.5:
                shape.ref = {"apiGroup": "kubeflow.org", "kind": "PyTorchJob", "name": shape.runtime.name}
            else:
                shape.ref = {"kind": "JobSet", "name": shape.runtime.name}
        elif roll < 0.75:
            # A runtime that does not exist; few distinct names, so it stays under the service's cap.
            missing = f"missing-runtime-{int(self.rng.random() * 3)}"
            shape.ref = {"apiGroup": TRAINER_GROUP, "kind": shapes.CLUSTER_KIND, "name": missing}
        else:
            shape.num_nodes = (256, 1024, 0)[int(self.rng.random() * 3)]

    def _maybe_bend_status(self, status: dict[str, Any]) -> dict[str, Any]:
        """Sometimes make a status write odd without changing what it means for the metrics."""
        if self.malformed_ratio <= 0 or self.rng.random() >= self.malformed_ratio:
            return status
        conditions = list(status.get("conditions") or [])
        terminal = any(c.get("type") in ("Complete", "Failed") for c in conditions)
        roll = self.rng.random()
        if roll < 0.3:
            # Removed in Trainer #2621 but still on old objects; and a foreign domain-prefixed type.
            when = self._now()
            conditions.append(shapes.condition("Created", "True", "JobsCreationSucceeded", "", when))
            conditions.append(shapes.condition("example.com/Checkpointed", "True", "Saved", "ok", when))
        elif roll < 0.5 and conditions:
            conditions.append(dict(conditions[-1]))  # an exact duplicate of a list-map key
        elif roll < 0.7 and not terminal:
            conditions.append(shapes.condition("Failed", "Unknown", "Pending", "", self._now()))
        elif not terminal:
            return {**status, "conditions": None}  # no conditions at all (never on a finished job)
        return {**status, "conditions": conditions}


@functools.lru_cache(maxsize=256)
def _parse_time(value: Any) -> datetime | None:
    # populate() creates thousands of jobs per second: they share a few creationTimestamps.
    return parse_time(value)
