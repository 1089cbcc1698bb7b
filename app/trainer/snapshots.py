"""StepSnapshots: the training steps of jobs whose runtime has changed since they were resolved, passed from
replica to replica in the Lease as the other per-job facts are (app/trainer/history.py).

A job's training step is resolved once and kept in its projection (app/trainer/field_builders.py
resolve_step), as the controller keeps a copy of the runtime per job (kubeflow/trainer v2.3.0
``pkg/runtime/core/snapshot.go``). A replica that lists the job after its runtime was edited or deleted would
resolve it from the runtime as it is now; the copy the controller runs from is in a ConfigMap this exporter
does not watch. So the leader publishes, for every live job whose step differs from what its runtime says now
(or whose runtime is gone), the step it resolved, and every replica merges what it reads: the projector
resolves a job it has not resolved yet from an inherited step first (``inherited``).

These are the few jobs that outlived an edit of their runtime, not the population. Which they are changes only
when a runtime changes (a job's own step never does), so it is recomputed from the cached jobs once per
runtime change, at the next publication (O(jobs) then, nothing per event).

Keys are ``TrainJobProjection.uid_key`` values; steps are rules.STEP_SETS ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from app.trainer import rules
from app.trainer.projection_types import RuntimeProjection, TrainJobProjection

__all__ = ["MAX_INHERITED_STEPS", "StepSnapshots", "UidKey"]

UidKey = bytes | str
MAX_INHERITED_STEPS = 2048  # as many as the Lease carries (app/handover/history.py MAX_PUBLISHED)


class StepSnapshots:
    def __init__(self, runtimes: Mapping[str, RuntimeProjection]) -> None:
        self._runtimes = runtimes  # by ref label, live (RuntimeRefs.by_ref)
        # uid -> step id read from the Lease: what the projector resolves a new job with, first
        self.inherited: dict[UidKey, int] = {}
        self._diverged: dict[UidKey, int] = {}  # this replica's jobs whose step differs from their runtime's
        self._stale = True
        self._jobs: Callable[[], Iterable[TrainJobProjection]] | None = None

    def watch_jobs(self, jobs: Callable[[], Iterable[TrainJobProjection]]) -> None:
        """The cached TrainJobs (every informer's), read when a runtime changed."""
        self._jobs = jobs
        self._stale = True

    def runtimes_changed(self) -> None:
        self._stale = True

    def job_deleted(self, uid: UidKey) -> None:
        self._diverged.pop(uid, None)
        self.inherited.pop(uid, None)

    def inherit(self, steps: Mapping[str, frozenset[str]], uid_key: Callable[[str], UidKey]) -> int:
        """Merge steps another replica published (uid -> replicated-job names); returns how many were new.
        Never more than MAX_INHERITED_STEPS are kept (they come from another process)."""
        new = 0
        for uid, names in steps.items():
            key = uid_key(uid)
            if key in self.inherited or len(self.inherited) >= MAX_INHERITED_STEPS:
                continue
            step = rules.step_id(names)
            if step:
                self.inherited[key] = step
                new += 1
        return new

    def forget_inherited_except(self, present: set[UidKey]) -> int:
        gone = [uid for uid in self.inherited if uid not in present]
        for uid in gone:
            del self.inherited[uid]
        return len(gone)

    def published(self) -> dict[UidKey, frozenset[str]]:
        """uid -> training step of every job whose step is not its runtime's now, inherited ones included."""
        if self._stale and self._jobs is not None:
            self._diverged = {
                job.uid_key: job.step
                for job in self._jobs()
                if job.step and self._differs(job.runtime_ref, job.step)
            }
            self._stale = False
        out = {uid: rules.STEP_SETS[step] for uid, step in self.inherited.items()}
        out.update((uid, rules.STEP_SETS[step]) for uid, step in self._diverged.items())
        return out

    def _differs(self, ref: str, step: int) -> bool:
        runtime = self._runtimes.get(ref)
        return runtime is None or rules.STEP_SETS[step] != runtime.training_jobs
