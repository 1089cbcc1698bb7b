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

from kubesim.trainer.gen_actions import COMPLETE, JobActions
from kubesim.trainer.gen_population import COOLING, DELETING, FINISHED, PENDING, RUNNING, SUSPENDED, JobRecord
from kubesim.trainer.shapes import WeightedPicker

# One logger for the whole generator, whichever module writes: tests and operators filter on this name.
log = logging.getLogger("kubesim.trainer.generator")

Action = tuple[str, float, Callable[[], object]]


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
                lambda: self.duplicate_terminal(population.pick_terminal(self.rng)),
            ),
            # Deletion keeps pace with finishing, so the population settles below max_jobs.
            ("delete", 6.0 * count[FINISHED] / max(live, 1), lambda: self.delete(pick(FINISHED))),
            ("cancel", 0.05 * bool(active), self._cancel_random_active),
            ("remove-finalizer", 2.0 * bool(count[DELETING]), lambda: self.remove_finalizer(pick(DELETING))),
        ]
        return [candidate for candidate in candidates if candidate[1] > 0]

    def _pick(self, phase: str) -> JobRecord:
        return self.population.pick(self.rng, phase)

    def _cancel_random_active(self) -> None:
        """A user deletes a job that has not finished (not one younger than ``min_delete_age``)."""
        buckets = self.population.buckets
        phases = [p for p in (SUSPENDED, PENDING, RUNNING) if buckets[p]]
        rec = self._pick(phases[int(self.rng.random() * len(phases))])
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
        if rec is None or target in (SUSPENDED, PENDING):
            return
        if target == RUNNING:
            self.start(rec, warm=True)
        else:
            rec.stage = 1  # it ran: a failure shows failed trainer Jobs
            self.finish(rec, COMPLETE if target == COMPLETE else self._failures.pick(self.rng))

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
