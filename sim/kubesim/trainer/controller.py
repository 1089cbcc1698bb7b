"""The Kubeflow Trainer controller v2.3.0 as the simulated cluster runs it: what it writes to a TrainJob's
status, from the TrainJob and its JobSet (``jobset.py``), and when.

Each rule follows kubeflow/trainer v2.3.0 (tag commit 658725bd) ``pkg/controller/trainjob_controller.go``
Reconcile and the JobSet plugin's Status (``pkg/runtime/framework/plugins/jobset/jobset.go``), cited where it
is used. What users and Kueue do is elsewhere (``kueue.py``, ``gen_actions.py``); so is when the cluster moves
child Jobs on (``gen_cluster.py``). Times are the simulated cluster's: RFC 3339 strings stamped by the caller.

Two findings from the code that the model keeps:

- A TrainJob whose ``spec.managedBy`` is not the built-in controller is skipped entirely (no status at all):
  pkg/util/trainjob/trainjob.go IsManagedByExternalController.
- A runtime kind the controller has not registered: Reconcile sets ``Failed``/``TrainingRuntimeNotSupported``
  in memory, then calls setTrainJobStatus with the nil runtime it looked up, whose TrainJobStatus call
  panics before the status patch (controller-runtime v0.24 recovers the panic and requeues). So v2.3.0
  never stores that reason; such a TrainJob (the validating webhook refuses them, so only one created while
  the webhook was bypassed) keeps whatever status it had: none.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kubesim.trainer import jobset
from kubesim.trainer.jobset import JobSetRun, JobSetSpec

TRAINER_GROUP: Final = "trainer.kubeflow.org"
# pkg/runtime/core registers the two runtime kinds under RuntimeRefToRuntimeRegistryKey's GroupKind strings.
REGISTERED_RUNTIMES: Final = frozenset(
    {f"TrainingRuntime.{TRAINER_GROUP}", f"ClusterTrainingRuntime.{TRAINER_GROUP}"}
)
BUILT_IN_MANAGER: Final = (
    "trainer.kubeflow.org/trainjob-controller"  # pkg/util/trainjob TrainJobControllerName
)
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"

# Condition types, reasons and messages (pkg/apis/trainer/v1alpha1/trainjob_types.go, pkg/constants).
SUSPENDED: Final = "Suspended"
COMPLETE: Final = "Complete"
FAILED: Final = "Failed"
SUSPENDED_REASON: Final = "Suspended"
RESUMED_REASON: Final = "Resumed"
SUSPENDED_MESSAGE: Final = "TrainJob is suspended"
RESUMED_MESSAGE: Final = "TrainJob is resumed"
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
DEADLINE_EXCEEDED_MESSAGE: Final = "TrainJob exceeded its active deadline"
LAST_RFC3339_SECOND: Final = 253_402_300_799.0  # 9999-12-31T23:59:59Z: a big time warp stays parseable


def registry_key(ref: Mapping[str, Any]) -> str:
    """pkg/runtime/runtime.go RuntimeRefToRuntimeRegistryKey: schema.GroupKind{group, kind}.String(), i.e.
    "<kind>.<group>" (the API server defaulted both)."""
    kind, group = str(ref.get("kind") or ""), str(ref.get("apiGroup") or "")
    return f"{kind}.{group}" if group else kind


def runtime_registered(ref: Mapping[str, Any]) -> bool:
    return registry_key(ref) in REGISTERED_RUNTIMES


def managed_externally(spec: Mapping[str, Any]) -> bool:
    """pkg/util/trainjob/trainjob.go IsManagedByExternalController (nil counts as the built-in controller)."""
    return (spec.get("managedBy") or BUILT_IN_MANAGER) != BUILT_IN_MANAGER


def condition(cond_type: str, status: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "type": cond_type,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when,
    }


def set_condition(conditions: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """k8s.io/apimachinery meta.SetStatusCondition: a condition of a new type is appended; one of an existing
    type is updated in place, keeping its lastTransitionTime unless its status changes."""
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") == new["type"]:
            found = True
            when = (
                new["lastTransitionTime"]
                if cond.get("status") != new["status"]
                else cond["lastTransitionTime"]
            )
            out.append({**new, "lastTransitionTime": when})
        else:
            out.append(cond)
    if not found:
        out.append(new)
    return out


def find(conditions: list[dict[str, Any]], cond_type: str) -> dict[str, Any] | None:
    """meta.FindStatusCondition: the first condition of the type."""
    return next((c for c in conditions if c.get("type") == cond_type), None)


def finished(conditions: list[dict[str, Any]]) -> bool:
    """pkg/util/trainjob/trainjob.go IsTrainJobFinished: Complete or Failed is True."""
    return any(c.get("type") in (COMPLETE, FAILED) and c.get("status") == "True" for c in conditions)


def with_suspended_condition(
    conditions: list[dict[str, Any]], suspend: bool, when: str
) -> list[dict[str, Any]]:
    """trainjob_controller.go setSuspendedCondition: ``Suspended`` True while spec.suspend; once it goes off,
    status False with reason ``Resumed``, written only over a True condition (a job never suspended has no
    Suspended condition)."""
    if suspend:
        return set_condition(
            conditions, condition(SUSPENDED, "True", SUSPENDED_REASON, SUSPENDED_MESSAGE, when)
        )
    current = find(conditions, SUSPENDED)
    if current is not None and current.get("status") == "True":
        return set_condition(conditions, condition(SUSPENDED, "False", RESUMED_REASON, RESUMED_MESSAGE, when))
    return conditions


def with_jobset_status(
    conditions: list[dict[str, Any]], run: JobSetRun, when: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(conditions, jobsStatus) after the JobSet plugin's Status (plugins/jobset/jobset.go): the JobSet's
    ``Completed`` condition copied as ``Complete`` and its ``Failed`` as ``Failed``, reason and message kept,
    with the time the JobSet set it (``when``, for the reconcile that first sees it); ``jobsStatus`` is
    ``replicatedJobsStatus`` entry for entry (nil, so left out, before the JobSet first reports).
    removeFailedCondition drops a copied Failed condition before each copy, which the copy restores."""
    if run.condition is not None:
        kind, reason, message = run.condition
        cond_type = COMPLETE if kind == jobset.COMPLETED else FAILED
        copied = find(conditions, cond_type)
        stamp = (
            copied["lastTransitionTime"] if copied is not None and copied.get("status") == "True" else when
        )
        conditions = set_condition(conditions, condition(cond_type, "True", reason, message, stamp))
    return conditions, [dict(entry) for entry in run.status] or None


def deadline_start(created: str, conditions: list[dict[str, Any]]) -> str:
    """trainjob_controller.go reconcileDeadline: the deadline counts from creationTimestamp, or from the
    Suspended condition's lastTransitionTime while it is False (the last resume)."""
    current = find(conditions, SUSPENDED)
    if current is not None and current.get("status") == "False":
        return str(current.get("lastTransitionTime") or created)
    return created


def deadline_exceeded(conditions: list[dict[str, Any]], when: str) -> list[dict[str, Any]]:
    """trainjob_controller.go reconcileDeadline past the deadline: setFailedCondition(DeadlineExceeded) at
    ``when`` (the deadline itself: the controller requeued for it), after which the controller deletes the
    JobSet. setTrainJobStatus and removeFailedCondition keep this condition on every later reconcile, and
    the JobSet plugin's Status leaves the status alone once the JobSet is gone and the job finished."""
    return set_condition(
        conditions, condition(FAILED, "True", DEADLINE_EXCEEDED, DEADLINE_EXCEEDED_MESSAGE, when)
    )


def timed(spec_suspend: bool, active_deadline: int | None, conditions: list[dict[str, Any]]) -> bool:
    """reconcileDeadline checks a deadline only with activeDeadlineSeconds set, the job not finished and not
    suspended."""
    return bool(active_deadline) and not spec_suspend and not finished(conditions)


@dataclass(slots=True)
class TrainJob:
    """What the controller reads of one TrainJob it manages (spec, status as stored) and its JobSet.

    Times are epoch seconds of the simulated cluster's clock; ``created`` is creationTimestamp."""

    name: str
    created: float
    template: JobSetSpec  # the JobSet the runtime's template makes (Build)
    no_pods: frozenset[str]  # replicated jobs scaled to 0 pods (a trainer with numNodes 0)
    suspend: bool
    active_deadline: int | None
    conditions: list[dict[str, Any]] = field(default_factory=list)
    jobs_status: list[dict[str, Any]] | None = None
    trainer_status: dict[str, Any] | None = None
    jobset: JobSetRun | None = None
    jobset_deleted: bool = False  # by the deadline: never built again (the job is finished)

    def status(self) -> dict[str, Any]:
        """The status as the controller last patched it (empty parts left out)."""
        out: dict[str, Any] = {}
        if self.conditions:
            out["conditions"] = self.conditions
        if self.jobs_status is not None:
            out["jobsStatus"] = self.jobs_status
        if self.trainer_status is not None:
            out["trainerStatus"] = self.trainer_status
        return out

    def deadline(self) -> float | None:
        """When reconcileDeadline fails the job, if it is timed now (epoch seconds)."""
        if not timed(self.suspend, self.active_deadline, self.conditions):
            return None
        start = parse_rfc3339(deadline_start(rfc3339(self.created), self.conditions))
        return start + float(self.active_deadline or 0)


def reconcile(job: TrainJob, now: float) -> bool:
    """One Reconcile of ``job`` at ``now``; True when its status changed (the controller patches it then).

    trainjob_controller.go Reconcile, for a job it manages with a registered runtime kind: unless finished,
    apply the JobSet (jobset.go Build: created at the first reconcile with the TrainJob's suspend; updated
    afterwards only while either of them is suspended, which is how suspend and resume reach it); then
    setSuspendedCondition, setTrainJobStatus (the JobSet's status as it last wrote it; nothing once the
    JobSet is gone and the job finished) and reconcileDeadline (the deadline fails the job at the deadline
    itself and deletes the JobSet)."""
    before = (list(job.conditions), job.jobs_status)
    when = rfc3339(now)
    if not finished(job.conditions) and not job.jobset_deleted:
        if job.jobset is None:
            job.jobset = JobSetRun(job.template, job.name, suspended=job.suspend, no_pods=job.no_pods)
        elif job.suspend or job.jobset.suspended:
            job.jobset.suspended = job.suspend
    job.conditions = with_suspended_condition(job.conditions, job.suspend, when)
    if job.jobset is not None:
        job.conditions, job.jobs_status = with_jobset_status(job.conditions, job.jobset, when)
    due = job.deadline()
    if due is not None and now >= due:
        job.conditions = deadline_exceeded(job.conditions, rfc3339(due))
        job.jobset, job.jobset_deleted = None, True
    return (job.conditions, job.jobs_status) != before


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(min(epoch, LAST_RFC3339_SECOND)))


def parse_rfc3339(value: str) -> float:
    return calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ"))
