"""When the workload generator makes which transition: weighted random steps over the live population,
paced runs, interleaved complete lifecycles, and bulk population of a large store.

Split from ``sim/kubesim/trainer/generator.py``: the rates and orderings here decide the mix of events a run
produces, independently of what each transition writes (``gen_actions``). Every choice draws from the
generator's ``rng`` in a fixed order, so a seed replays the same sequence.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Final

from kubesim.trainer.gen_actions import COMPLETE, FAILED, JobActions
from kubesim.trainer.gen_population import (
    COOLING,
    DELETING,
    FINISHED,
    ORPHANED,
    PENDING,
    REMOTE,
    RUNNING,
    SUSPENDED,
    JobRecord,
)
from kubesim.trainer.shapes import WeightedPicker

# One logger for the whole generator, whichever module writes: tests and operators filter on this name.
log = logging.getLogger("kubesim.trainer.generator")

Action = tuple[str, float, Callable[[], object]]
# Per job and step, how readily a job of each phase moves on (relative weights): a queued job's JobSet and
# Kueue take a few events, a pending one several (initializers, pods waiting for capacity, dependsOn), a
# running one trains a long while (its ``finish`` is a share of this), a MultiKueue one goes through all
# of that on its worker; nothing runs an orphaned one, whose user deletes it in the end.
RATES: Final = {SUSPENDED: 0.3, PENDING: 0.6, RUNNING: 0.1, REMOTE: 0.4, ORPHANED: 0.02}


class Drivers(JobActions):
    """step(), run(), lifecycles(), run_lifecycles() and populate() over the transitions."""

    max_jobs: int
    steps: int
    _populate_targets: WeightedPicker[str]

    # -- random steps ------------------------------------------------------------------------------
    def step(self) -> str:
        """Perform one random action on the population; returns its name ("idle" when none applied)."""
        if not self.catalog:
            self.load_runtimes()
        self.steps += 1
        self.expire_deadlines()  # the controller's requeued deadline checks come first
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

    def _safe_step(self) -> None:
        try:
            self.step()
        except Exception:
            # A long simulation must survive one refused write (a test deleting objects under us, a
            # store error); the truth only ever counts writes that succeeded.
            log.warning("workload step failed", exc_info=True)

    def _eligible_actions(self) -> list[Action]:
        population = self.population
        if population.cooling:
            population.promote_cooled()
        count = {phase: len(bucket) for phase, bucket in population.buckets.items()}
        live = len(population.jobs)
        active = live - count[FINISHED] - count[COOLING] - count[DELETING]
        pick = self._pick
        # Each job moves on at its own pace: a phase's weight grows with the jobs in it (RATES), so the share
        # of jobs in each phase follows how long a job stays there, not how many are queued behind it.
        rate = {phase: RATES[phase] * count[phase] for phase in RATES}
        candidates: list[Action] = [
            ("create", 4.0 if live < self.max_jobs else 0.0, self.create_job),
            # Kueue, the cluster and the trainer at work.
            ("admit", rate[SUSPENDED], lambda: self.queued(pick(SUSPENDED))),
            ("advance", rate[PENDING], lambda: self.advance(pick(PENDING))),
            ("fail-pending", 0.003 * count[PENDING], lambda: self.fail(pick(PENDING))),
            ("train", rate[RUNNING], lambda: self.train(pick(RUNNING))),
            ("finish", 0.6 * rate[RUNNING], lambda: self.finish(pick(RUNNING))),
            ("preempt", 0.004 * (count[RUNNING] + count[PENDING]), self._preempt_random),
            ("remote", rate[REMOTE], lambda: self.remote_step(pick(REMOTE))),
            (
                "duplicate-terminal",
                0.5 * bool(count[FINISHED] or count[COOLING]),
                lambda: self.duplicate_terminal(population.pick_terminal(self.rng)),
            ),
            # Deletion keeps pace with finishing, so the population settles below max_jobs.
            ("delete", 6.0 * count[FINISHED] / max(live, 1), lambda: self.delete(pick(FINISHED))),
            ("cancel", 0.05 * bool(active), self._cancel_random_active),
            # Jobs nothing will ever run: their users give up on them sooner or later.
            ("give-up", rate[ORPHANED], lambda: self._cancel(pick(ORPHANED))),
            ("remove-finalizer", 2.0 * bool(count[DELETING]), lambda: self.remove_finalizer(pick(DELETING))),
        ]
        return [candidate for candidate in candidates if candidate[1] > 0]

    def _pick(self, phase: str) -> JobRecord:
        return self.population.pick(self.rng, phase)

    def _preempt_random(self) -> None:
        """Kueue preempts an admitted job of its queues (a job without a queue label is not Kueue's)."""
        buckets = self.population.buckets
        phases = [p for p in (RUNNING, PENDING) if buckets[p]]
        rec = self._pick(phases[int(self.rng.random() * len(phases))])
        if rec.queued:
            self.preempt(rec)

    def _cancel_random_active(self) -> None:
        """A user deletes a job that has not finished."""
        buckets = self.population.buckets
        phases = [p for p in (SUSPENDED, PENDING, RUNNING, REMOTE, ORPHANED) if buckets[p]]
        self._cancel(self._pick(phases[int(self.rng.random() * len(phases))]))

    def _cancel(self, rec: JobRecord) -> None:
        """Delete an unfinished job, unless it is younger than ``min_delete_age``."""
        min_delete_age = self.population.min_delete_age
        if min_delete_age and self.clock() - rec.created_at < min_delete_age:
            return
        self.delete(rec)

    # -- bulk population ---------------------------------------------------------------------------
    def populate(self, n: int) -> None:
        """Create ``n`` TrainJobs quickly in assorted states (at most two writes each)."""
        if not self.catalog:
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
        if rec is None or rec.job is None:
            return
        if target == SUSPENDED:
            self.settle_suspended(rec)
        elif target == PENDING:
            self.start(rec, warm=self.rng.random() < 0.5, pending=True)
        elif target == RUNNING:
            self.start(rec, warm=True)
        else:
            self.conclude(rec, COMPLETE if target == COMPLETE else FAILED)

    # -- complete lifecycles -----------------------------------------------------------------------
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

    def _lifecycle_driver(self, n: int, concurrency: int, delete: bool) -> Iterator[None]:
        if not self.catalog:
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
        if rec.phase == ORPHANED:
            for _ in range(int(self.rng.random() * 4)):
                yield None  # its user waits a while for a status that never comes
        elif rec.phase == REMOTE:
            yield from self._remote_to_end(rec)
        else:
            yield from self._run_to_end(rec)
        if rec.phase in (FINISHED, COOLING) and self.rng.random() < 0.2:
            self.duplicate_terminal(rec)
            yield None
        if delete and rec.phase in (FINISHED, COOLING, ORPHANED, SUSPENDED, PENDING, RUNNING, REMOTE):
            self.delete(rec)
            yield None
        if rec.phase == DELETING:
            self.remove_finalizer(rec)
            yield None

    def _run_to_end(self, rec: JobRecord) -> Iterator[None]:
        """Admission, the JobSet's way to training (with the odd failure before it), some training and
        the end, or a preemption and another admission; deadlines may end it on the way. Bounded: a job
        still going after that many actions is finished by its trainer."""
        for _ in range(48):
            self.expire_deadlines()
            phase = rec.phase
            if phase in (FINISHED, COOLING) or rec.slot < 0:
                return
            roll = self.rng.random()
            if phase == SUSPENDED:
                self.queued(rec)
            elif phase == PENDING:
                if roll < 0.03:
                    self.fail(rec)
                elif roll < 0.05 and rec.queued:
                    self.preempt(rec)
                else:
                    self.advance(rec)
            elif roll < 0.05 and rec.queued:
                self.preempt(rec)
            elif roll < 0.55:
                self.train(rec)
            else:
                self.finish(rec)
            yield None
        # Still going: its trainer completes, after what it has left to get there.
        for _ in range(48):
            if rec.phase in (FINISHED, COOLING) or rec.slot < 0:
                return
            if rec.phase == SUSPENDED:
                self.queued(rec)
            else:
                self.finish(rec, COMPLETE)
            yield None

    def _remote_to_end(self, rec: JobRecord) -> Iterator[None]:
        """MultiKueue: the worker runs the job, its status comes back (the same bound as _run_to_end)."""
        for _ in range(96):
            self.expire_deadlines()
            if rec.phase != REMOTE or rec.slot < 0:
                return
            self.remote_step(rec)
            yield None
