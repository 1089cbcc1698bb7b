"""The truth's reading of one TrainJob: which runtime it names, which state it is in, whether and how it
ended, and the times the metrics measure.

Split from ``sim/kubesim/trainer/truth.py`` so that the state and label rules (docs/design/product.md §3,
docs/design/trainer-domain.md §1-§2) read as one page. Deliberately written from the design documents, NOT
by importing ``app/trainer``: the tests compare two independent readings of the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

TRAINER_GROUP: Final = "trainer.kubeflow.org"
TRAINING_RUNTIME: Final = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME: Final = "ClusterTrainingRuntime"
RUNTIME_KINDS: Final = frozenset({TRAINING_RUNTIME, CLUSTER_TRAINING_RUNTIME})
UNKNOWN_REF: Final = "unknown"

JOB_STATES: Final = ("suspended", "pending", "running", "succeeded", "failed")
# docs/design/product.md §3: upstream's failure reasons are always label values; any other reason is one
# too when it is a well-formed condition reason (a CamelCase identifier of at most 64 characters), up to a
# cap of distinct values the generator stays far below (see MAX_REASON_NAMES); else "other".
FAILURE_REASONS: Final = frozenset(
    {
        "TrainingRuntimeNotSupported",
        "DeadlineExceeded",
        "FailedJobs",
        "ReachedMaxRestarts",
        "FailJobSetFailurePolicyAction",
    }
)
_CAMEL_CASE: Final = re.compile(r"[A-Z][a-zA-Z0-9]*")
MAX_REASON_LENGTH: Final = 64
# The service's default cap on distinct reason names beyond FAILURE_REASONS (the accelerator-class cap is in
# truth_resources). The truth does not model it: the generator writes fewer distinct values (a test checks).
MAX_REASON_NAMES: Final = 32

RuntimeKey = tuple[str, str, str]  # (kind, namespace or "", name)
# docs/design/trainer-domain.md §1: the jobs that train by the controller's own naming, for a runtime that
# labels no job ``trainer`` (and is not MPI) or is not known.
FALLBACK_TRAINING: Final = frozenset({"node", "launcher"})


def runtime_key_of(runtime: Mapping[str, Any]) -> RuntimeKey:
    meta = as_dict(runtime.get("metadata"))
    return str(runtime.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))


def runtime_ref_of(job: Mapping[str, Any]) -> tuple[str, RuntimeKey | None]:
    """(runtime_ref label, key of the runtime it names). A foreign group or kind gives ("unknown", None)."""
    spec = as_dict(job.get("spec"))
    ref = as_dict(spec.get("runtimeRef"))
    group = ref.get("apiGroup")
    kind = ref.get("kind")
    group = TRAINER_GROUP if group is None else group
    kind = CLUSTER_TRAINING_RUNTIME if kind is None else kind
    name = ref.get("name")
    if group != TRAINER_GROUP or kind not in RUNTIME_KINDS or not isinstance(name, str) or not name:
        return UNKNOWN_REF, None
    namespace = str(as_dict(job.get("metadata")).get("namespace") or "") if kind == TRAINING_RUNTIME else ""
    return f"{group}/{kind}/{namespace}/{name}", (kind, namespace, name)


def reason_label(reason: Any) -> str:
    """A failure's reason label: upstream's reasons, and any CamelCase reason of at most 64 characters, by
    name; anything else "other"."""
    if not isinstance(reason, str):
        return "other"
    if reason in FAILURE_REASONS:
        return reason
    if len(reason) <= MAX_REASON_LENGTH and _CAMEL_CASE.fullmatch(reason):
        return reason
    return "other"


def classify(
    job: Mapping[str, Any], training: frozenset[str] = FALLBACK_TRAINING
) -> tuple[str, tuple[str, str, dict[str, Any]] | None]:
    """(state, terminal) in one pass. state is one of JOB_STATES (docs/design/product.md §3,
    kubeflow_trainer_trainjobs); terminal is (result, reason bucket, deciding condition) when Complete or
    Failed is True, where Failed=True wins over Complete=True. ``training``: the names of the replicated
    jobs of the job's training step (``RuntimeFacts.training``). Written for speed: populate() classifies
    every write."""
    status = job.get("status")
    if not isinstance(status, dict):
        status = {}
    failed = complete = None
    suspended = False
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for condition in conditions:
            if isinstance(condition, dict) and condition.get("status") == "True":
                cond_type = condition.get("type")
                if cond_type == "Failed" and failed is None:
                    failed = condition
                elif cond_type == "Complete" and complete is None:
                    complete = condition
                elif cond_type == "Suspended":
                    suspended = True
    if failed is not None:
        return "failed", ("failed", reason_label(failed.get("reason")), failed)
    if complete is not None:
        return "succeeded", ("succeeded", "none", complete)
    spec = job.get("spec")
    # Suspended while the spec asks for it (Kueue creates jobs suspended before the controller says so)
    # or the controller still says so (a resume takes effect when the controller answers).
    if suspended or (isinstance(spec, dict) and spec.get("suspend") is True):
        return "suspended", None
    # Running once a child Job of the training step has all its pods ready (jobsStatus[].ready); ``active``
    # also counts child Jobs whose pods are still pending (waiting for capacity), and initializers are ready
    # while they download: both pending here.
    for entry in as_list(status.get("jobsStatus")):
        if not isinstance(entry, dict) or entry.get("name") not in training:
            continue
        ready = entry.get("ready")
        if isinstance(ready, int) and not isinstance(ready, bool) and ready > 0:
            return "running", None
    return "pending", None


def terminal_of(job: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """(result, reason bucket, the deciding condition) when terminal; Failed=True wins over Complete=True."""
    return classify(job)[1]


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def resumed_condition(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Suspended condition with status False and reason Resumed (the controller writes it when a job's
    spec.suspend goes off: Kueue admitted it), if the job has one (the first, if several)."""
    conditions = as_dict(job.get("status")).get("conditions")
    for condition in as_list(conditions):
        if (
            isinstance(condition, dict)
            and condition.get("type") == "Suspended"
            and condition.get("status") == "False"
            and condition.get("reason") == "Resumed"
        ):
            return condition
    return None


def since_creation(job: Mapping[str, Any], at: datetime | float | None) -> float | None:
    """``at`` (a timestamp, or epoch seconds) - creationTimestamp, never below 0; None when either is
    missing."""
    created = parse_time(as_dict(job.get("metadata")).get("creationTimestamp"))
    if created is None or at is None:
        return None
    end = at.timestamp() if isinstance(at, datetime) else at
    return max(end - created.timestamp(), 0.0)


def lifetime_of(job: Mapping[str, Any], condition: Mapping[str, Any]) -> float | None:
    """Terminal condition lastTransitionTime - creationTimestamp; None when either is missing."""
    created = parse_time(as_dict(job.get("metadata")).get("creationTimestamp"))
    ended = parse_time(condition.get("lastTransitionTime"))
    if created is None or ended is None:
        return None
    return (ended - created).total_seconds()


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: the truth tolerates any stored shape."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []
