"""Pure Trainer rules: what a TrainJob / runtime means for the metrics. No I/O, no state.

Every rule follows upstream kubeflow/trainer PR #4190 (``pkg/metrics/metrics.go``) unless a comment
says otherwise; see /work/shared/design/trainer-domain.md §2-3 for the source of each rule.

Inputs are plain values (the projections' fields, or JSON fragments for the runtime policies) so
that the typed and the tolerant decoding paths share exactly the same rules.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Final

from app.kube.resources import CLUSTER_TRAINING_RUNTIMES, TRAINER_GROUP, TRAINING_RUNTIMES
from app.trainer.quantity import accelerator_count

# --- label vocabularies ------------------------------------------------------------------------

UNKNOWN: Final = "unknown"
NONE: Final = "none"

SUSPENDED: Final = "suspended"
PENDING: Final = "pending"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"

JOB_STATES: Final = (SUSPENDED, PENDING, RUNNING, SUCCEEDED, FAILED)
RESULTS: Final = (SUCCEEDED, FAILED)
# Failure reasons kept as label values; anything else is "other". The first two are set by the
# Trainer controller, the rest are copied from the JobSet Failed condition.
FAILURE_REASONS: Final = (
    "TrainingRuntimeNotSupported",
    "DeadlineExceeded",
    "FailedJobs",
    "ReachedMaxRestarts",
    "FailJobSetFailurePolicyAction",
)
OTHER_REASON: Final = "other"
REASONS: Final = (NONE, *FAILURE_REASONS, OTHER_REASON)

ML_POLICIES: Final = ("torch", "mpi", "flux", "jax", "xgboost", NONE, UNKNOWN)
POD_GROUP_POLICIES: Final = ("coscheduling", "volcano", NONE, UNKNOWN)

TRAINING_RUNTIME_KIND: Final = TRAINING_RUNTIMES.kind
CLUSTER_TRAINING_RUNTIME_KIND: Final = CLUSTER_TRAINING_RUNTIMES.kind
RUNTIME_KINDS: Final = (TRAINING_RUNTIME_KIND, CLUSTER_TRAINING_RUNTIME_KIND)
# CRD defaults of spec.runtimeRef (applied by the apiserver; we apply them again for nil values).
DEFAULT_RUNTIME_API_GROUP: Final = TRAINER_GROUP
DEFAULT_RUNTIME_KIND: Final = CLUSTER_TRAINING_RUNTIME_KIND

FRAMEWORK_LABEL: Final = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER: Final = "trainer"
NODE: Final = "node"  # the trainer replicated job and its container (pkg/constants)

# Label values are capped so that a hand-edited object can never put a huge string in a series.
MAX_LABEL_VALUE: Final = 63  # a Kubernetes label value's own limit
MAX_NUM_NODES: Final = 2**31 - 1  # numNodes is an int32

_ML_POLICY_ORDER: Final = ("torch", "mpi", "flux", "jax", "xgboost")
_POD_GROUP_POLICY_ORDER: Final = ("coscheduling", "volcano")
_FAILURE_REASON_SET: Final = frozenset(FAILURE_REASONS)
# A runtime name is a DNS-1123 subdomain: anything else cannot name a real runtime.
_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A namespace is a DNS-1123 label (<= 63 characters).
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A resource name (ResourceList key): [DNS-subdomain prefix "/"] qualified name (<= 63 characters).
_RESOURCE_NAME: Final = re.compile(
    r"(?:([a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*)/)?"
    r"([A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
)
MAX_RESOURCE_NAME: Final = 253 + 1 + 63
# Small per-process memo tables for derivations that repeat across jobs (a handful of runtime refs,
# a few accelerator resource lists, timestamps shared by jobs created in the same second). Bounded:
# cleared when full, so a flood of distinct hostile values costs at most one table of entries.
_MEMO_MAX: Final = 4096
_MAX_MEMO_KEY: Final = 320  # longer strings are never memoised (they are invalid anyway)


def is_dns_label(value: str) -> bool:
    """A DNS-1123 label: what a Kubernetes namespace name must be (lowercase, <= 63 characters)."""
    return len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def is_resource_name(value: str) -> bool:
    """A Kubernetes resource name: ``[prefix/]name``, prefix a DNS subdomain (<= 253), name a qualified
    name (<= 63). Anything else cannot be a real resource and must never become a label value."""
    if len(value) > MAX_RESOURCE_NAME:
        return False
    m = _RESOURCE_NAME.fullmatch(value)
    return m is not None and (m.group(1) is None or len(m.group(1)) <= 253)


# --- runtime references ------------------------------------------------------------------------


def runtime_ref_label(api_group: str | None, kind: str | None, name: str | None, job_namespace: str) -> str:
    """``<apiGroup>/<kind>/<namespace>/<name>`` (upstream format), or ``"unknown"``.

    ``None`` or empty group/kind take the CRD defaults (upstream uses ``ptr.Deref``; an empty string
    is treated like nil here because the apiserver would have defaulted it and nothing else is valid).
    The namespace is the job's for a TrainingRuntime and empty for a ClusterTrainingRuntime. A
    reference that cannot name a Trainer runtime (foreign group/kind, invalid name, or for a
    TrainingRuntime a job namespace that is not a DNS-1123 label) is "unknown", so junk never becomes
    a label value. The result is interned (many jobs share a handful of refs) and memoised.
    """
    memo_key = (api_group, kind, name, job_namespace)
    label = _REF_MEMO.get(memo_key)
    if label is not None:
        return label
    label = _runtime_ref_label(api_group, kind, name, job_namespace)
    if (name is None or len(name) <= _MAX_MEMO_KEY) and len(job_namespace) <= _MAX_MEMO_KEY:
        if len(_REF_MEMO) >= _MEMO_MAX:
            _REF_MEMO.clear()
        _REF_MEMO[memo_key] = label
    return label


_REF_MEMO: dict[tuple[str | None, str | None, str | None, str], str] = {}


def _runtime_ref_label(api_group: str | None, kind: str | None, name: str | None, job_namespace: str) -> str:
    group = api_group or DEFAULT_RUNTIME_API_GROUP
    kind = kind or DEFAULT_RUNTIME_KIND
    if group != TRAINER_GROUP or kind not in RUNTIME_KINDS:
        return UNKNOWN
    if not name or len(name) > 253 or _DNS_SUBDOMAIN.fullmatch(name) is None:
        return UNKNOWN
    if kind == TRAINING_RUNTIME_KIND:
        if not is_dns_label(job_namespace):
            return UNKNOWN  # the namespace is part of the label: it must be a real one
        namespace = job_namespace
    else:
        namespace = ""
    return sys.intern(f"{group}/{kind}/{namespace}/{name}")


# --- node count and accelerators ---------------------------------------------------------------


def requested_nodes(job_num_nodes: int | None, runtime_num_nodes: int | None) -> int:
    """``spec.trainer.numNodes ?? runtime.spec.mlPolicy.numNodes ?? 1`` (pass ``None`` when no runtime).

    0 is a legal request and stays 0. This is the *logical* node count, as in product.md and #4190:
    MPI's ``runLauncherAsNode`` only changes how many pods the ``node`` replicated job gets
    (``max(n-1, 1)``, the launcher being the n-th node), not the number of training nodes requested.
    """
    if job_num_nodes is not None:
        return job_num_nodes
    if runtime_num_nodes is not None:
        return runtime_num_nodes
    return 1


def requested_accelerators(
    job_class: str | None,
    job_per_node: int,
    runtime_class: str | None,
    runtime_per_node: int,
    nodes: int,
) -> tuple[str, int]:
    """(accelerator_class, per-node count x nodes) for a created TrainJob.

    ``job_class`` is ``None`` when the job sets no ``resourcesPerNode``: then the runtime's trainer
    container decides (``runtime_class`` ``None`` = no runtime known). A job that does set
    ``resourcesPerNode`` replaces the container's resources (as the Trainer does), even without GPUs.
    With no accelerator the class is "none" and the count 0; with 0 nodes the class is kept, count 0.
    """
    if job_class is not None:
        cls, per_node = job_class, job_per_node
    elif runtime_class is not None:
        cls, per_node = runtime_class, runtime_per_node
    else:
        return NONE, 0
    if cls == NONE:
        return NONE, 0
    return cls, max(per_node, 0) * max(nodes, 0)


def is_accelerator(resource_name: str) -> bool:
    """#4190: a resource whose lowercase name contains "gpu" (so ``google.com/tpu`` does not count)."""
    return "gpu" in resource_name.lower()


def select_accelerator(requests: object, limits: object) -> tuple[str, int, bool]:
    """(class, per-node count, malformed) from a container's / resourcesPerNode's requests and limits.

    GPU resources are read from ``requests``, or from ``limits`` when requests name none (#4190).
    When several GPU resources are requested, the one with the largest count wins (ties: the
    lexicographically smallest name) so the class is deterministic; the event carries one class.
    Class "none" and 0 when there is no accelerator. ``malformed`` flags unparsable quantities,
    non-mapping resource lists and GPU names that are not Kubernetes resource names
    (``is_resource_name``), which are skipped: such a name can never be a label value.

    Memoised on the (name, quantity string) pairs: jobs of one template repeat the same lists.
    """
    request_items, limit_items = _memo_items(requests), _memo_items(limits)
    if request_items is not None and limit_items is not None:
        key = (request_items, limit_items)
        hit = _ACCEL_MEMO.get(key)
        if hit is None:
            hit = _select_accelerator(requests, limits)
            if len(_ACCEL_MEMO) >= _MEMO_MAX:
                _ACCEL_MEMO.clear()
            _ACCEL_MEMO[key] = hit
        return hit
    return _select_accelerator(requests, limits)


_ACCEL_MEMO: dict[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]], tuple[str, int, bool]] = {}
_NO_ITEMS: Final[tuple[tuple[str, str], ...]] = ()


def _memo_items(source: object) -> tuple[tuple[str, str], ...] | None:
    """A memo key for a resource list: its items when all are short strings (type-exact, so "1" and
    1 or true never share an entry), else None (not memoised)."""
    if source is None:
        return _NO_ITEMS
    if type(source) is not dict or len(source) > 16:
        return None
    items = tuple(source.items())
    for name, quantity in items:
        if type(name) is not str or type(quantity) is not str or len(name) + len(quantity) > _MAX_MEMO_KEY:
            return None
    return items


def _select_accelerator(requests: object, limits: object) -> tuple[str, int, bool]:
    malformed = False
    for source in (requests, limits):
        if source is None:
            continue
        if not isinstance(source, Mapping):
            malformed = True
            continue
        best: tuple[str, int] | None = None
        for name, quantity in source.items():
            if not isinstance(name, str) or not is_accelerator(name):
                continue
            if not is_resource_name(name):
                malformed = True
                continue
            count = accelerator_count(quantity)
            if count is None:
                malformed = True
                continue
            if best is None or count > best[1] or (count == best[1] and name < best[0]):
                best = (name, count)
        if best is not None:
            return sys.intern(best[0]), best[1], malformed
    return NONE, 0, malformed


def coerce_count(value: object) -> tuple[int | None, bool]:
    """(count, malformed) for an int32 count such as numNodes; tolerant of what the schema forbids.

    An integral float or a decimal string is accepted but flagged malformed; negatives, non-numbers
    and fractions become ``None`` (so the next fallback applies) and are flagged; values beyond
    int32 are clamped.
    """
    if value is None:
        return None, False
    if isinstance(value, bool):
        return None, True
    if isinstance(value, int):
        if value < 0:
            return None, True
        return min(value, MAX_NUM_NODES), False
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return min(int(value), MAX_NUM_NODES), True
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        return min(int(value), MAX_NUM_NODES), True
    return None, True


# --- TrainJob status ---------------------------------------------------------------------------

Condition = tuple[object, object, object, object]  # (type, status, reason, lastTransitionTime)


def terminal_condition(conditions: Iterable[Condition]) -> tuple[str, str, object] | None:
    """(result, raw reason, lastTransitionTime) of the terminal condition, ``None`` if not terminal.

    Terminal = Complete or Failed with status "True" (IsTrainJobFinished); Failed True beats
    Complete True (#4190 terminalCondition).
    """
    complete: Condition | None = None
    for cond in conditions:
        ctype, status = cond[0], cond[1]
        if status != "True":
            continue
        if ctype == "Failed":
            return FAILED, cond[2] if isinstance(cond[2], str) else "", cond[3]
        if ctype == "Complete" and complete is None:
            complete = cond
    if complete is not None:
        return SUCCEEDED, complete[2] if isinstance(complete[2], str) else "", complete[3]
    return None


def suspended_condition(conditions: Iterable[Condition]) -> bool:
    """The ``Suspended`` condition is True. Status False (reason ``Resumed``) means resumed."""
    return any(cond[0] == "Suspended" and cond[1] == "True" for cond in conditions)


def job_state(result: str, suspend: bool, suspended_cond: bool, active: bool) -> str:
    """One of JOB_STATES.

    Terminal wins; then suspended when either the spec asks for it (Kueue creates jobs with
    ``suspend: true`` before the controller sets the condition) or the controller still reports the
    Suspended condition (a resume is not effective until the controller acts); then running when a
    child Job has active pods (there is no Running condition); else pending.
    """
    if result:
        return result
    if suspend or suspended_cond:
        return SUSPENDED
    if active:
        return RUNNING
    return PENDING


def reason_bucket(result: str, reason: str) -> str:
    """Reason label: "none" on success; a failure reason from the fixed list, else "other"."""
    if result == SUCCEEDED:
        return NONE
    return reason if reason in _FAILURE_REASON_SET else OTHER_REASON


def lifetime_seconds(created: float | None, terminal: float | None) -> float | None:
    """Terminal condition lastTransitionTime - creationTimestamp; ``None`` if either is unknown.

    A negative difference (clock skew between the apiserver that stamps creation and the controller
    that stamps the condition) is clamped to 0: the job did finish, and very quickly; dropping the
    observation would bias the histogram against short jobs.
    """
    if created is None or terminal is None:
        return None
    return max(terminal - created, 0.0)


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


# --- runtimes ----------------------------------------------------------------------------------


def _policy_name(policy: object, order: tuple[str, ...]) -> str:
    if policy is None:
        return NONE
    if not isinstance(policy, Mapping):
        return UNKNOWN
    for name in order:
        if policy.get(name) is not None:  # first non-nil policy wins, in upstream's order
            return name
    return UNKNOWN  # set, but none of the policies we know (upstream: "unknown")


def ml_policy(ml_policy_obj: object) -> str:
    """``spec.mlPolicy`` → torch | mpi | flux | jax | xgboost; "none" when absent; else "unknown".

    As upstream, an mlPolicy carrying only ``numNodes`` (no policy source) is "unknown".
    """
    return _policy_name(ml_policy_obj, _ML_POLICY_ORDER)


def pod_group_policy(pod_group_policy_obj: object) -> str:
    """``spec.podGroupPolicy`` → coscheduling | volcano; "none" when absent; else "unknown"."""
    return _policy_name(pod_group_policy_obj, _POD_GROUP_POLICY_ORDER)


def runtime_num_nodes(ml_policy_obj: object) -> tuple[int | None, bool]:
    """(``spec.mlPolicy.numNodes``, malformed). No CRD default: ``None`` when unset."""
    if not isinstance(ml_policy_obj, Mapping):
        return None, ml_policy_obj is not None
    return coerce_count(ml_policy_obj.get("numNodes"))


def run_launcher_as_node(ml_policy_obj: object) -> bool:
    """``spec.mlPolicy.mpi.runLauncherAsNode`` (default false). Informational: see requested_nodes."""
    if not isinstance(ml_policy_obj, Mapping):
        return False
    mpi = ml_policy_obj.get("mpi")
    return isinstance(mpi, Mapping) and mpi.get("runLauncherAsNode") is True


def framework(labels: object) -> str:
    """The ``trainer.kubeflow.org/framework`` label, or "unknown" when missing or empty.

    Every runtime must carry it (docs/operator-guides/runtime.md), so a missing one is an anomaly
    worth seeing; "unknown" rather than "" because Prometheus treats an empty label as absent. The
    value is operator-chosen but runtimes are operator-controlled and Kubernetes caps label values
    at 63 characters; we cap again for objects that bypassed validation.
    """
    if not isinstance(labels, Mapping):
        return UNKNOWN
    value = labels.get(FRAMEWORK_LABEL)
    if not isinstance(value, str) or not value:
        return UNKNOWN
    return sys.intern(value[:MAX_LABEL_VALUE])


def is_trainer_replicated_job(name: object, labels: object) -> bool:
    """#4190: the replicated job named ``node`` or labelled ancestor-step ``trainer``."""
    if name == NODE:
        return True
    return isinstance(labels, Mapping) and labels.get(ANCESTOR_LABEL) == ANCESTOR_TRAINER
