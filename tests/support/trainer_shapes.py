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
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS

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
MPI_WORKERS_FIRST: Final = "MPI: the node workers ready while the launcher is not, then the launcher ready"
RUNTIME_EDITED: Final = "its runtime's replicated jobs edited while it ran, and a status write after"
RUNTIME_DELETED: Final = "its runtime deleted while it ran, and a status write after"
ADMITTED_RESUMED: Final = "admitted: Suspended=True, spec.suspend off, then Suspended=False/Resumed at once"
ADMITTED_BEFORE_CONTROLLER: Final = "admitted before the controller wrote any Suspended condition: none ever"
ADMITTED_CONTROLLER_DOWN: Final = "admitted while the controller was down: Resumed later than Kueue's write"
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
    MPI_WORKERS_FIRST,
    RUNTIME_EDITED,
    RUNTIME_DELETED,
    ADMITTED_RESUMED,
    ADMITTED_BEFORE_CONTROLLER,
    ADMITTED_CONTROLLER_DOWN,
)
# Shapes only the scenarios write (tests/support/trainer_scenarios.py), never the random workload: a runtime
# edit's effect on a job depends on which watch delivers first (settled by the scenario), and an admission no
# object records is timed by a clock, which exact comparisons (tests/e2e) cannot take.
SCENARIO_ONLY: Final = frozenset({RUNTIME_EDITED, RUNTIME_DELETED, ADMITTED_BEFORE_CONTROLLER})
KUEUE_MANAGER: Final = "kueue.x-k8s.io/manager"  # kueue trainjob_controller.go runtimePatchManagerName


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
    runtime: tuple[str, str, str] = ("", "", "")  # (kind, namespace, name) of the runtime it references
    running: bool = False  # its last write: not terminal, not suspended, a non-initializer Job ready
    runtime_changed: str = ""  # RUNTIME_EDITED / RUNTIME_DELETED while it ran: shown at its next write
    workers_first: bool = False  # MPI: seen with node ready and the launcher not
    created_suspended: bool = False
    left_suspended_without_condition: bool = False
    unsuspended_at: int = 0  # the census's event count at its write turning spec.suspend off
    shapes: set[str] = field(default_factory=set)


@dataclass
class ShapeCensus:
    shapes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    _jobs: dict[str, _Seen] = field(default_factory=dict)
    _runtimes: dict[tuple[str, str, str], Any] = field(default_factory=dict)  # key -> replicated jobs
    _events: int = 0

    def observe(self, event: WatchEvent) -> None:
        self._events += 1
        if event.resource in (TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES):
            self._runtime(event)
            return
        if event.resource != TRAINJOBS:
            return
        obj = event.entry.obj
        uid = str(obj["metadata"].get("uid"))
        seen = self._jobs.setdefault(uid, _Seen())
        if event.type == "ADDED":
            seen.created_suspended = (obj.get("spec") or {}).get("suspend") is True
        self._read(obj, seen)
        if event.type == "DELETED":
            self._closing(seen)
            del self._jobs[uid]

    def finish(self) -> None:
        """Count the silent jobs still alive at the end of the run."""
        for seen in self._jobs.values():
            self._closing(seen)
        self._jobs.clear()

    def _runtime(self, event: WatchEvent) -> None:
        """A runtime edited (its replicated jobs changed) or deleted while jobs of it run."""
        obj = event.entry.obj
        meta = obj.get("metadata") or {}
        kind = "TrainingRuntime" if event.resource == TRAINING_RUNTIMES else "ClusterTrainingRuntime"
        key = (
            kind,
            str(meta.get("namespace") or "") if kind == "TrainingRuntime" else "",
            str(meta.get("name")),
        )
        jobs = ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("replicatedJobs")
        before = self._runtimes.get(key)
        self._runtimes[key] = jobs
        if event.type == "DELETED":
            change = RUNTIME_DELETED
        elif event.type == "MODIFIED" and before is not None and before != jobs:
            change = RUNTIME_EDITED
        else:
            return
        for seen in self._jobs.values():
            if seen.runtime == key and seen.running:
                seen.runtime_changed = change

    # -- one write -------------------------------------------------------------------------------------
    def _read(self, obj: dict[str, Any], seen: _Seen) -> None:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        ref = spec.get("runtimeRef") or {}
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        namespace = str(obj["metadata"].get("namespace") or "") if kind == "TrainingRuntime" else ""
        seen.runtime = (str(kind), namespace, str(ref.get("name")))
        if seen.runtime_changed:
            self._shape(seen, seen.runtime_changed)
            seen.runtime_changed = ""
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
        self._admission(spec, suspended_cond, seen, bool(jobs))
        seen.running = False
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
        seen.running = ready
        if {"node", "launcher"} <= jobs.keys():
            launcher_ready = (jobs["launcher"].get("ready") or 0) > 0
            if (jobs["node"].get("ready") or 0) > 0 and not launcher_ready:
                seen.workers_first = True
            elif launcher_ready and seen.workers_first:
                self._shape(seen, MPI_WORKERS_FIRST)

    def _admission(
        self, spec: dict[str, Any], suspended_cond: dict[str, Any] | None, seen: _Seen, jobs: bool
    ) -> None:
        """How a job created suspended was admitted (kubeflow/trainer v2.3.0 setSuspendedCondition, Kueue
        v0.19.2 RunWithPodSetsInfo and Unsuspend): the controller's Resumed in the very next write of the
        cluster, or only after other writes and at a later time (it was down); or no condition at all."""
        if not seen.created_suspended or spec.get("suspend") is True:
            seen.unsuspended_at = 0
            return
        if suspended_cond is None:
            seen.left_suspended_without_condition = True
            if jobs:  # the controller reconciled since, and still wrote none
                self._shape(seen, ADMITTED_BEFORE_CONTROLLER)
            return
        if suspended_cond.get("status") == "True":
            seen.unsuspended_at = seen.unsuspended_at or self._events
            return
        if suspended_cond.get("reason") != "Resumed" or seen.left_suspended_without_condition:
            return
        if not seen.unsuspended_at:
            return
        if self._events == seen.unsuspended_at + 1:
            self._shape(seen, ADMITTED_RESUMED)
        else:
            kueue = _kueue_time(spec)
            if kueue and _epoch(suspended_cond.get("lastTransitionTime")) > _epoch(kueue):
                self._shape(seen, ADMITTED_CONTROLLER_DOWN)
        seen.unsuspended_at = 0

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


def _kueue_time(spec: dict[str, Any]) -> Any:
    """The time the Trainer's webhook stamped on Kueue's runtime patch at its last change (admission)."""
    for patch in spec.get("runtimePatches") or []:
        if isinstance(patch, dict) and patch.get("manager") == KUEUE_MANAGER:
            return patch.get("time")
    return None


def _epoch(value: Any) -> float:
    return float(calendar.timegm(time.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ")))
