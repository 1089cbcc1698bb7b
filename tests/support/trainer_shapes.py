"""A census of the TrainJob shapes a run wrote, read from the store's watch events alone (not from the
generator's bookkeeping): which of the shapes a real cluster produces the run exercised, and any write that
breaks a rule of the Trainer controller or JobSet (docs/design/trainer-domain.md §1-§2).

Subscribe it to a store (``store.subscribe(census.observe)``) before the writes; read ``shapes`` (how many
TrainJobs showed each shape) and ``violations`` afterwards.
"""

from __future__ import annotations

import calendar
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from kubesim.apiserver.storage.table import WatchEvent
from kubesim.trainer.kinds import TRAINJOBS

INITIALIZERS: Final = frozenset({"dataset-initializer", "model-initializer"})
JOBSET_FAILURES: Final = frozenset({"FailedJobs", "ReachedMaxRestarts", "FailJobSetFailurePolicyAction"})
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
REGISTERED: Final = frozenset(
    {("trainer.kubeflow.org", "TrainingRuntime"), ("trainer.kubeflow.org", "ClusterTrainingRuntime")}
)

# The shapes, each a TrainJob that showed it at least once.
INITIALIZER_THEN_CAPACITY_WAIT: Final = "initializers ready, then done while the trainer waits for capacity"
DEADLINE_FROM_CREATION: Final = "DeadlineExceeded at creation + activeDeadlineSeconds"
DEADLINE_AFTER_RESUME: Final = "DeadlineExceeded at the last resume + activeDeadlineSeconds"
DEADLINE_AFTER_READMISSION: Final = "DeadlineExceeded after a preemption and a second admission"
SUSPENDED_JOBSET: Final = "a suspended JobSet: Suspended=True, child Jobs counted suspended"
PREEMPTED_AFTER_RUNNING: Final = "preempted after it ran: its Jobs suspended"
RESTARTED: Final = "ran, then back to no training Job ready, not suspended (a JobSet restart)"
JOBSET_FAILURE: Final = "a JobSet failure copied, with the failed child Job counted"
MULTIKUEUE_COPIED: Final = "managedBy MultiKueue, status copied from the worker"
MULTIKUEUE_SILENT: Final = "managedBy MultiKueue, no status at all"
UNREGISTERED_KIND: Final = "a runtime kind the controller has not registered, no status at all"
SHAPES: Final = (
    INITIALIZER_THEN_CAPACITY_WAIT,
    DEADLINE_FROM_CREATION,
    DEADLINE_AFTER_RESUME,
    DEADLINE_AFTER_READMISSION,
    SUSPENDED_JOBSET,
    PREEMPTED_AFTER_RUNNING,
    RESTARTED,
    JOBSET_FAILURE,
    MULTIKUEUE_COPIED,
    MULTIKUEUE_SILENT,
    UNREGISTERED_KIND,
)


@dataclass(slots=True)
class _Seen:
    """What the census remembers of one TrainJob across its writes."""

    initializer_ready: bool = False
    ran: bool = False
    resumes: int = 0
    suspended_before: bool = False
    status_written: bool = False
    multikueue: bool = False
    unregistered: bool = False
    shapes: set[str] = field(default_factory=set)


@dataclass
class ShapeCensus:
    shapes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    _jobs: dict[str, _Seen] = field(default_factory=dict)

    def observe(self, event: WatchEvent) -> None:
        if event.resource != TRAINJOBS:
            return
        obj = event.entry.obj
        uid = str(obj["metadata"].get("uid"))
        seen = self._jobs.setdefault(uid, _Seen())
        self._read(obj, seen)
        if event.type == "DELETED":
            self._closing(seen)
            del self._jobs[uid]

    def finish(self) -> None:
        """Count the silent jobs still alive at the end of the run."""
        for seen in self._jobs.values():
            self._closing(seen)
        self._jobs.clear()

    # -- one write -------------------------------------------------------------------------------------
    def _read(self, obj: dict[str, Any], seen: _Seen) -> None:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        ref = spec.get("runtimeRef") or {}
        seen.multikueue = spec.get("managedBy") == MULTIKUEUE
        seen.unregistered = (ref.get("apiGroup"), ref.get("kind")) not in REGISTERED
        conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
        jobs = {j.get("name"): j for j in status.get("jobsStatus") or [] if isinstance(j, dict)}
        if status:
            seen.status_written = True
            if seen.multikueue:
                self._shape(seen, MULTIKUEUE_COPIED)
        if seen.unregistered and status:
            self.violations.append(f"{_name(obj)}: status written for an unregistered runtime kind")
        terminal = [
            c for c in conditions if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        ]
        suspended_cond = next((c for c in conditions if c.get("type") == "Suspended"), None)
        suspended = spec.get("suspend") is True or (suspended_cond or {}).get("status") == "True"
        if suspended_cond is not None and suspended_cond.get("status") == "False":
            if seen.suspended_before:
                seen.resumes += 1
                seen.ran = False  # a new run: its Jobs start again
            seen.suspended_before = False
        if suspended_cond is not None and suspended_cond.get("status") == "True":
            seen.suspended_before = True
        for failed in (c for c in terminal if c.get("type") == "Failed"):
            self._failure(obj, seen, failed, jobs, suspended_cond)
        if any(c.get("reason") == "TrainingRuntimeNotSupported" for c in conditions):
            self.violations.append(f"{_name(obj)}: TrainingRuntimeNotSupported (v2.3.0 never stores it)")
        if terminal:
            return
        training = {n: j for n, j in jobs.items() if n not in INITIALIZERS}
        if spec.get("suspend") is True and any((j.get("suspended") or 0) > 0 for j in jobs.values()):
            self._shape(seen, SUSPENDED_JOBSET)
            if seen.ran:
                self._shape(seen, PREEMPTED_AFTER_RUNNING)
        if suspended:
            return
        if any((jobs[n].get("ready") or 0) > 0 for n in INITIALIZERS & jobs.keys()):
            seen.initializer_ready = True
        initializers = [jobs[n] for n in INITIALIZERS & jobs.keys()]
        waiting = any((j.get("active") or 0) > 0 and not j.get("ready") for j in training.values())
        if (
            seen.initializer_ready
            and initializers
            and all((j.get("succeeded") or 0) > 0 for j in initializers)
            and waiting
            and not any((j.get("ready") or 0) > 0 for j in training.values())
        ):
            self._shape(seen, INITIALIZER_THEN_CAPACITY_WAIT)
        ready = any((j.get("ready") or 0) > 0 for j in training.values())
        if seen.ran and not ready and jobs:
            self._shape(seen, RESTARTED)
        seen.ran = seen.ran or ready

    def _failure(
        self,
        obj: dict[str, Any],
        seen: _Seen,
        failed: dict[str, Any],
        jobs: dict[Any, dict[str, Any]],
        suspended_cond: dict[str, Any] | None,
    ) -> None:
        reason = failed.get("reason")
        if reason in JOBSET_FAILURES:
            if any((j.get("failed") or 0) > 0 for j in jobs.values()):
                self._shape(seen, JOBSET_FAILURE)
            else:
                self.violations.append(f"{_name(obj)}: {reason} without a failed child Job")
        if reason != "DeadlineExceeded":
            return
        deadline = (obj.get("spec") or {}).get("activeDeadlineSeconds")
        created = obj["metadata"].get("creationTimestamp")
        resumed = (
            suspended_cond if suspended_cond is not None and suspended_cond.get("status") == "False" else None
        )
        start = _epoch(resumed["lastTransitionTime"] if resumed is not None else created)
        if not isinstance(deadline, int) or _epoch(failed.get("lastTransitionTime")) != start + deadline:
            self.violations.append(f"{_name(obj)}: DeadlineExceeded not at its start + activeDeadlineSeconds")
            return
        if _epoch(failed.get("lastTransitionTime")) - _epoch(created) < deadline:
            self.violations.append(f"{_name(obj)}: lifetime shorter than activeDeadlineSeconds")
        if seen.multikueue:
            return  # the worker's creation and resume: not this object's
        if resumed is None:
            self._shape(seen, DEADLINE_FROM_CREATION)
        else:
            self._shape(seen, DEADLINE_AFTER_RESUME)
            if seen.resumes >= 2:
                self._shape(seen, DEADLINE_AFTER_READMISSION)

    def _closing(self, seen: _Seen) -> None:
        if seen.multikueue and not seen.status_written:
            self._shape(seen, MULTIKUEUE_SILENT)
        if seen.unregistered and not seen.status_written:
            self._shape(seen, UNREGISTERED_KIND)

    def _shape(self, seen: _Seen, shape: str) -> None:
        if shape not in seen.shapes:
            seen.shapes.add(shape)
            self.shapes[shape] += 1


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _epoch(value: Any) -> float:
    return float(calendar.timegm(time.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ")))
