"""TrainJob status rules: result, terminal / suspended / resumed conditions, job state, reason label, and
the timestamps (metav1.Time) and durations read from the status and creationTimestamp.

Its own module because these run on every watch event (``job_conditions``, ``parse_time``) and decide
the state and reason label values and the lifetime, time to running and admission wait; everything here
reads a TrainJob's metadata timestamps and status conditions and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final, Protocol, TypeVar

from app.trainer.rules.labels import (
    _MEMO_MAX,
    FAILED,
    NONE,
    PENDING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
)

# The Failed reasons upstream knows, always kept by name. The first two are set by the Trainer controller
# (kubeflow/trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go TrainJobRuntimeNotSupportedReason,
# TrainJobDeadlineExceededReason); the rest are copied from the JobSet Failed condition (kubernetes-sigs/
# jobset v0.12.0 pkg/constants/constants.go FailedJobsReason, ReachedMaxRestartsReason,
# FailJobSetActionReason, set by pkg/controllers/failure_policy.go setJobSetFailedCondition).
FAILURE_REASONS: Final = (
    "TrainingRuntimeNotSupported",
    "DeadlineExceeded",
    "FailedJobs",
    "ReachedMaxRestarts",
    "FailJobSetFailurePolicyAction",
)
OTHER_REASON: Final = "other"
# The fixed reason label values; any well-formed condition reason is a label value too (reason_bucket).
REASONS: Final = (NONE, *FAILURE_REASONS, OTHER_REASON)
MAX_REASON_LABEL: Final = 64
# A condition reason as Kubernetes conventions write one: a CamelCase identifier ("a programmatic
# identifier ... in CamelCase", metav1.Condition), here at most 64 characters. The CRD pattern is looser
# (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, 1024 characters); what it admits beyond this is kept out of
# the labels. An upper-case first letter also keeps a reason from ever reading as "none" or "other".
_CONDITION_REASON: Final = re.compile(rf"[A-Z][A-Za-z0-9]{{0,{MAX_REASON_LABEL - 1}}}")

_KNOWN_FAILURE_REASONS: Final = frozenset(FAILURE_REASONS)
_FIXED_REASONS: Final = frozenset(REASONS)


class ConditionLike(Protocol):
    """What the status rules read of a condition (app/trainer/wire.py ``Condition`` has it)."""

    @property
    def type(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def reason(self) -> str: ...


C = TypeVar("C", bound=ConditionLike)

# The Suspended condition's reason when status False (kubeflow/trainer v2.3.0 setSuspendedCondition).
RESUMED_REASON: Final = "Resumed"

# Returned as constants so that the per-event call allocates nothing unless the job is terminal or resumed.
_NOT_TERMINAL: Final = ("", None, False, None)
_NOT_TERMINAL_SUSPENDED: Final = ("", None, True, None)


def job_conditions(conditions: Iterable[C]) -> tuple[str, C | None, bool, C | None]:
    """(result, terminal condition, suspended, resumed condition) of a TrainJob's status conditions, in one
    pass.

    Terminal = Complete or Failed with status "True" (IsTrainJobFinished); Failed True beats Complete
    True (#4190 terminalCondition); of several conditions of one type the first counts. ``result`` is
    "" when not terminal, else SUCCEEDED or FAILED, and the terminal condition is the one whose
    reason and lastTransitionTime the metrics read. ``suspended``: the Suspended condition is True;
    status False (reason ``Resumed``) means resumed, and that condition is the fourth item (its
    lastTransitionTime is when the job was admitted: the admission wait), else None.

    The projectors call this on every watch event, so it is a single plain loop.
    """
    failed: C | None = None
    complete: C | None = None
    resumed: C | None = None
    suspended = False
    for c in conditions:
        status = c.status
        if status == "True":
            ctype = c.type
            if ctype == "Failed":
                if failed is None:
                    failed = c
            elif ctype == "Complete":
                if complete is None:
                    complete = c
            elif ctype == "Suspended":
                suspended = True
        elif status == "False" and resumed is None and c.type == "Suspended" and c.reason == RESUMED_REASON:
            resumed = c
    if failed is not None:
        return FAILED, failed, suspended, resumed
    if complete is not None:
        return SUCCEEDED, complete, suspended, resumed
    if resumed is not None:
        return "", None, suspended, resumed
    return _NOT_TERMINAL_SUSPENDED if suspended else _NOT_TERMINAL


def job_state(result: str, suspend: bool, suspended_cond: bool, ready: bool) -> str:
    """One of JOB_STATES.

    Terminal wins; then suspended when either the spec asks for it (Kueue creates jobs with
    ``suspend: true`` before the controller sets the condition) or the controller still reports the
    Suspended condition (a resume is not effective until the controller acts); then running when a child
    Job of the training step is ready (``ready``: steps.training_ready); else pending.

    There is no Running condition. ``jobsStatus`` is copied from the JobSet's ``replicatedJobsStatus``
    (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go`` Status), where ``active``
    counts child Jobs with a pod running *or pending* and ``ready`` those whose ready plus succeeded pods
    reach the Job's expected pod count (kubernetes-sigs/jobset v0.12.0
    ``pkg/controllers/jobset_controller.go`` calculateReplicatedJobStatuses). ``active`` alone would call
    a job whose pods wait for GPUs "running"; ``ready`` says its pods actually run. And only the training
    step's jobs count (steps.training_jobs): an initializer that downloads a model is ready long before the
    trainer's pods even have capacity. So pending covers "no JobSet or pods yet", "initializers at work",
    "pods waiting for capacity" and "pods starting" (image pulls, init containers), and running starts once
    one training-step child Job has all its pods ready.
    """
    if result:
        return result
    if suspend or suspended_cond:
        return SUSPENDED
    if ready:
        return RUNNING
    return PENDING


def is_condition_reason(reason: str) -> bool:
    """``reason`` is a well-formed condition reason: a CamelCase identifier of at most 64 characters."""
    return len(reason) <= MAX_REASON_LABEL and _CONDITION_REASON.fullmatch(reason) is not None


def reason_bucket(result: str, reason: str) -> str:
    """Reason label before the cap on distinct values: "none" on success; a failure's reason by name when
    upstream knows it or it is a well-formed condition reason (so a reason a new JobSet or Trainer release
    adds shows by name); else "other". TrainerState caps the distinct names beyond FAILURE_REASONS."""
    if result == SUCCEEDED:
        return NONE
    if reason in _KNOWN_FAILURE_REASONS or is_condition_reason(reason):
        return reason
    return OTHER_REASON  # also a failure whose reason is literally "none" or "other"


def is_reason_label(value: str) -> bool:
    """``value`` is a reason label value reason_bucket can produce."""
    return value in _FIXED_REASONS or is_condition_reason(value)


# --- timestamps ------------------------------------------------------------------------------------


def lifetime_seconds(created: float | None, terminal: float | None) -> float | None:
    """Terminal condition lastTransitionTime - creationTimestamp; ``None`` if either is unknown.

    A negative difference (clock skew between the apiserver that stamps creation and the controller
    that stamps the condition) is clamped to 0: the job did finish, and very quickly; dropping the
    observation would bias the histogram against short jobs.
    """
    if created is None or terminal is None:
        return None
    return max(terminal - created, 0.0)


def seconds_since_creation(created: float | None, at: float | None) -> float | None:
    """``at`` - creationTimestamp (time to running, admission wait); ``None`` if either is unknown. A
    negative difference (clock skew between the API server and whoever stamped ``at``) is 0, as for
    lifetimes."""
    if created is None or at is None:
        return None
    return max(at - created, 0.0)


def parse_time(value: object) -> float | None:
    """RFC 3339 timestamp (``metav1.Time``) → epoch seconds; ``None`` when missing or unparsable.

    Memoised (bounded): jobs created or finished in the same second share one float object.
    """
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        return _TIME_MEMO[value]
    except KeyError:
        pass
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:  # metav1.Time is always UTC; a zone-less value is read as UTC
        dt = dt.replace(tzinfo=UTC)
    seconds = dt.timestamp()
    if len(_TIME_MEMO) >= _MEMO_MAX:
        _TIME_MEMO.clear()
    _TIME_MEMO[value] = seconds
    return seconds


_TIME_MEMO: dict[str, float] = {}
