"""The workload generator's memory of its live TrainJobs: one record per job, grouped by the generator's own
phase so that an action can pick a random job of a phase in O(1), and the queue of finished jobs that
must cool for ``min_delete_age`` before they may be deleted.

Split from ``sim/kubesim/trainer/generator.py``: this bookkeeping is the same whatever the actions write, and
the truth never reads it (it derives the metric states from the stored objects itself).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kubesim.trainer.controller import TrainJob
from kubesim.trainer.shapes_runtimes import RuntimeChoice
from kubesim.trainer.shapes_status import TrainingRun

# Generator-side phases: which transitions a job is ready for (the truth derives the metric states itself
# from the stored objects).
SUSPENDED: Final = "suspended"  # queued by Kueue, or preempted: waits for admission
PENDING: Final = "pending"  # its JobSet moves towards training (initializers, pods waiting for capacity)
RUNNING: Final = "running"  # a training-step child Job is ready
FINISHED: Final = "finished"
DELETING: Final = "deleting"  # deleted while our finalizer holds it
ORPHANED: Final = "orphaned"  # nothing will write its status: only its user may still delete it
REMOTE: Final = "remote"  # MultiKueue runs it on a worker cluster; Kueue copies the worker's status here
PHASES: Final = (SUSPENDED, PENDING, RUNNING, FINISHED, DELETING, ORPHANED, REMOTE)
# Finished, but younger than ``min_delete_age``: terminal writes yes, deletion not yet (not in PHASES, so
# the default generator, min_delete_age 0, never uses it).
COOLING: Final = "cooling"


@dataclass(slots=True, eq=False)
class JobRecord:
    """The generator's memory of one live TrainJob: enough to play its controllers."""

    namespace: str
    name: str
    uid: str
    runtime: RuntimeChoice
    created_at: float  # creationTimestamp (epoch seconds)
    phase: str = PENDING
    queued: bool = False  # Kueue manages it (queue label)
    # The built-in controller's view of it; None when that controller never writes its status (managedBy
    # MultiKueue, or a runtime kind it has not registered).
    job: TrainJob | None = None
    # MultiKueue: the copy on the worker cluster, which that cluster's Trainer controller runs; None until
    # MultiKueue dispatches the job.
    remote: TrainJob | None = None
    dispatch: bool = False  # MultiKueue will dispatch it (else no worker ever admits it)
    blueprint: TrainJob | None = None  # MultiKueue: what the worker's controller will run, before dispatch
    slot: int = -1  # index in its phase bucket
    finished_at: float = 0.0  # clock() of its first terminal write (for min_delete_age)
    training: TrainingRun | None = None  # what its trainer reports (trainerStatus), once it runs
    deadline_token: int = 0  # bumped whenever its deadline may have moved (the deadline queue's entries)
    # The Trainer controller has not reconciled the job since its last spec change: its queue has not reached
    # it (a burst) or it is down (a restart). Kueue does not wait for it (gen_actions.admit).
    controller_behind: bool = False

    @property
    def controlled(self) -> TrainJob | None:
        """The controller view whose status this job shows: the worker's copy under MultiKueue."""
        return self.remote if self.remote is not None else self.job


class PhaseBucket:
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


class Population:
    """The live TrainJob records by uid and by phase; ``clock`` times the cooling of finished jobs."""

    def __init__(self, clock: Callable[[], float], min_delete_age: float) -> None:
        self.clock = clock
        self.jobs: dict[str, JobRecord] = {}  # uid -> live record
        self.buckets: dict[str, PhaseBucket] = {phase: PhaseBucket() for phase in (*PHASES, COOLING)}
        self.min_delete_age = max(0.0, min_delete_age)
        self.cooling: deque[JobRecord] = deque()  # COOLING jobs, oldest first

    def add(self, rec: JobRecord) -> None:
        self.jobs[rec.uid] = rec
        self.buckets[rec.phase].add(rec)

    def discard(self, rec: JobRecord) -> None:
        if self.jobs.pop(rec.uid, None) is not None:
            self.buckets[rec.phase].remove(rec)

    def set_phase(self, rec: JobRecord, phase: str) -> None:
        """Move ``rec`` to ``phase`` after a successful write; a first terminal write parks it in COOLING
        when finished jobs must age before deletion."""
        if phase == FINISHED and self.min_delete_age:
            if rec.phase == COOLING:
                return  # a duplicate terminal write: still cooling
            if rec.phase != FINISHED and rec.slot >= 0:
                rec.finished_at = self.clock()
                self.cooling.append(rec)
                phase = COOLING
        self.move(rec, phase)

    def move(self, rec: JobRecord, phase: str) -> None:
        if rec.phase != phase and rec.slot >= 0:
            self.buckets[rec.phase].remove(rec)
            rec.phase = phase
            self.buckets[phase].add(rec)

    def pick(self, rng: random.Random, phase: str) -> JobRecord:
        return self.buckets[phase].pick(rng)

    def pick_terminal(self, rng: random.Random) -> JobRecord:
        """A finished job, deletable or still cooling (one draw: the same as pick(FINISHED) without any
        cooling job)."""
        finished, cooling = self.buckets[FINISHED].items, self.buckets[COOLING].items
        index = int(rng.random() * (len(finished) + len(cooling)))
        return finished[index] if index < len(finished) else cooling[index - len(finished)]

    def promote_cooled(self) -> None:
        """Cooling jobs finished at least ``min_delete_age`` ago become deletable (FIFO: finish order)."""
        horizon = self.clock() - self.min_delete_age
        cooling = self.cooling
        while cooling and cooling[0].finished_at <= horizon:
            rec = cooling.popleft()
            if rec.phase == COOLING and rec.slot >= 0:
                self.move(rec, FINISHED)
