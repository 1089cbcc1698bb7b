"""Pure Trainer rules: what a TrainJob / runtime means for the metrics. No I/O, no state.

Every rule follows upstream kubeflow/trainer PR #4190 (``pkg/metrics/metrics.go``) unless a comment
says otherwise; see docs/design/trainer-domain.md §2-3 for the source of each rule.

Inputs are plain values (the projections' fields, status conditions, or JSON fragments for the
runtime policies) so that the typed and the tolerant decoding paths share exactly the same rules.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Final, Protocol, TypeVar

from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINER_GROUP, TRAINING_RUNTIMES
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
_KNOWN_FAILURE_REASONS: Final = frozenset(FAILURE_REASONS)
_FIXED_REASONS: Final = frozenset(REASONS)
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


# --- node count ---------------------------------------------------------------------------------


def requested_nodes(job_num_nodes: int | None, runtime_nodes: int | None) -> int:
    """``spec.trainer.numNodes``, else the runtime's default node count (``runtime_default_nodes``),
    else 1 (pass ``None`` when the runtime is not known).

    Every ML-policy plugin replaces the trainer PodSet count with ``spec.trainer.numNodes`` when it is
    set (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/{torch,jax,xgboost,plainml}``
    EnforceMLPolicy; ``mpi/mpi.go`` EnforceMLPolicy; ``flux/flux.go`` reads it directly). 0 is a legal
    request and stays 0. This is the *logical* node count, as in docs/design/product.md and #4190: MPI's
    ``runLauncherAsNode`` only changes how many pods the ``node`` replicated job gets (``max(n-1, 1)``,
    the launcher being the n-th node), not the number of training nodes requested.
    """
    if job_num_nodes is not None:
        return job_num_nodes
    if runtime_nodes is not None:
        return runtime_nodes
    return 1


def runtime_default_nodes(
    has_ml_policy: bool, ml_policy_num_nodes: int | None, trainer_ancestor: bool, parallelism: int | None
) -> int:
    """The node count the controller gives a runtime's trainer replicated job before the TrainJob's own
    ``numNodes`` (kubeflow/trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo):
    ``ptr.Deref(template.spec.parallelism, 1)``, replaced by ``ptr.Deref(mlPolicy.numNodes, 1)`` for the
    job labelled ancestor-step ``trainer`` when the runtime has an mlPolicy. So a runtime without an
    mlPolicy (or whose trainer job lacks the ancestor label) runs ``parallelism`` nodes, not 1.
    """
    if has_ml_policy and trainer_ancestor:
        return 1 if ml_policy_num_nodes is None else ml_policy_num_nodes
    return 1 if parallelism is None else parallelism


# --- resources and accelerators -----------------------------------------------------------------

# A container's resource list as the rules keep it: (resource name, whole units rounded up) pairs sorted
# by name; only valid resource names with parsable quantities. Requests and limits of one container.
ResourceList = tuple[tuple[str, int], ...]
NodeResources = tuple[ResourceList, ResourceList]  # (requests, limits)
NO_RESOURCES: Final[NodeResources] = ((), ())
# Per accelerator class: (class, count). A job requesting none is observed once as ("none", 0).
Accelerators = tuple[tuple[str, int], ...]
NO_ACCELERATORS: Final[Accelerators] = ((NONE, 0),)

# A real container names a handful of resources; beyond this a list is hostile and the rest is dropped.
MAX_RESOURCE_ENTRIES: Final = 64

# Accelerator resource names, as glob patterns (`*` matches any run of characters, case-sensitive as
# Kubernetes resource names are). Upstream #4190 counts any name containing "gpu"; that misses TPUs,
# Gaudi, Neuron and MIG slices, and would take e.g. a "gpu-memory" resource for accelerators. This default
# covers the device plugins in wide use; the setting accelerator_resource_patterns replaces it.
DEFAULT_ACCELERATOR_PATTERNS: Final = (
    "nvidia.com/gpu",
    "nvidia.com/mig-*",  # MIG slices under the mixed strategy, e.g. nvidia.com/mig-1g.10gb
    "amd.com/gpu",
    "gpu.intel.com/*",  # gpu.intel.com/i915, gpu.intel.com/xe
    "google.com/tpu",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron*",  # neuron, neuroncore, neurondevice
)
MAX_ACCELERATOR_PATTERNS: Final = 64
# What a pattern may contain: the characters of a resource name, and `*`.
_PATTERN: Final = re.compile(r"[-A-Za-z0-9_.*/]+")


def accelerator_pattern_error(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable accelerator pattern, or None when it is."""
    if not pattern:
        return "empty pattern"
    if len(pattern) > MAX_RESOURCE_NAME:
        return f"longer than a resource name ({MAX_RESOURCE_NAME} characters)"
    if _PATTERN.fullmatch(pattern) is None:
        return "a resource name pattern has only letters, digits, '-', '_', '.', '/' and '*'"
    if pattern.count("/") > 1:
        return "a resource name has at most one '/'"
    return None


class AcceleratorMatcher:
    """Which resource names are accelerators (``accelerator_resource_patterns``), and the accelerators a
    node container's resources amount to. Both are memoised: the names and resource lists of a cluster
    repeat across thousands of TrainJobs, so a created TrainJob costs two dict lookups here."""

    __slots__ = ("_memo", "_per_node", "_regex", "patterns")

    def __init__(self, patterns: Iterable[str] = DEFAULT_ACCELERATOR_PATTERNS) -> None:
        self.patterns = tuple(dict.fromkeys(patterns))
        for pattern in self.patterns:
            error = accelerator_pattern_error(pattern)
            if error is not None:
                raise ValueError(f"accelerator pattern {pattern[:80]!r}: {error}")
        alternatives = ("".join(".*" if p == "*" else re.escape(p) for p in re.split(r"(\*)", pattern))
                        for pattern in self.patterns)  # fmt: skip
        self._regex = re.compile("|".join(alternatives)) if self.patterns else None
        self._memo: dict[str, bool] = {}
        self._per_node: dict[NodeResources, tuple[tuple[str, int], ...]] = {}

    def __call__(self, resource_name: str) -> bool:
        """``resource_name`` matches one of the patterns."""
        hit = self._memo.get(resource_name)
        if hit is None:
            hit = self._regex is not None and self._regex.fullmatch(resource_name) is not None
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[resource_name] = hit
        return hit

    def per_node(self, resources: NodeResources) -> tuple[tuple[str, int], ...]:
        """(class, count) for each accelerator a container with ``resources`` requests, sorted by name.

        A container's request for a resource is its ``requests`` entry, else its ``limits`` entry: the API
        server defaults each missing request to its limit (kubernetes ``pkg/apis/core/v1/defaults.go``
        SetDefaults_Pod), and the scheduler and device plugins allocate by request. Per resource, not per
        list: #4190 read limits only when requests named no GPU at all, which is the same for every valid
        pod. A count of 0 requests nothing (a TrainJob overriding a GPU runtime with ``gpu: 0``).
        """
        hit = self._per_node.get(resources)
        if hit is None:
            requests, limits = resources
            effective = dict(limits)
            effective.update(requests)
            hit = tuple(sorted((n, count) for n, count in effective.items() if count > 0 and self(n)))
            if len(self._per_node) >= _MEMO_MAX:
                self._per_node.clear()
            self._per_node[resources] = hit
        return hit


DEFAULT_ACCELERATORS: Final = AcceleratorMatcher()


def requested_accelerators(per_node: tuple[tuple[str, int], ...], nodes: int) -> Accelerators:
    """Per accelerator class, its per-node count x nodes; ``NO_ACCELERATORS`` when none is requested.

    Every class is observed, as upstream observes each (a job asking for GPUs and MIG slices counts both).
    With 0 nodes the classes are kept, with count 0.
    """
    if not per_node:
        return NO_ACCELERATORS
    n = max(nodes, 0)
    return tuple((cls, count * n) for cls, count in per_node)


# Ceilings on what one TrainJob may request, above which its request is not believed: the job is still
# counted (created, current state) but left out of the requested-nodes and requested-accelerators
# histograms, and counted as a limit hit. A single job asking for "1e300" GPUs on 1,000 nodes would
# otherwise add 9.2e21 to requested_accelerators_sum, and so to every mean computed from it. The numbers
# are far above any real job: the largest Kubernetes clusters have ~65,000 nodes, the largest nodes a few
# dozen accelerators (devices, MIG slices or NeuronCores), the largest training runs ~100,000 GPUs.
MAX_REQUESTED_NODES: Final = 100_000
MAX_ACCELERATORS_PER_NODE: Final = 1_024
MAX_ACCELERATORS_PER_JOB: Final = 1_048_576


def requests_within_ceilings(per_node: tuple[tuple[str, int], ...], nodes: int) -> tuple[bool, bool]:
    """(nodes believable, accelerators believable) against the ceilings above.

    The accelerators are believable only if the nodes are (the per-job count is per-node x nodes) and,
    for every class, the per-node count and the per-job count are within their ceilings.
    """
    if nodes > MAX_REQUESTED_NODES:
        return False, False
    n = max(nodes, 0)
    return True, all(
        count <= MAX_ACCELERATORS_PER_NODE and count * n <= MAX_ACCELERATORS_PER_JOB for _, count in per_node
    )


def merge_resources(base: NodeResources, override: NodeResources) -> NodeResources:
    """``override`` (a TrainJob's ``resourcesPerNode``) merged into ``base`` (the runtime's container).

    kubeflow/trainer v2.3.0 ``pkg/util/trainingruntime/trainingruntime.go`` MergeResourceRequirements
    (since trainer #3602): a strategic merge patch, so requests merge with requests and limits with limits,
    per resource name, the override winning; a resource the override does not name keeps the runtime's
    value (a CPU-only ``resourcesPerNode`` keeps the runtime's GPUs). Memoised: one entry per (runtime
    version, distinct override) pair.
    """
    if not override[0] and not override[1]:
        return base
    key = (base, override)
    hit = _MERGE_MEMO.get(key)
    if hit is None:
        hit = _intern_resources((_merge_list(base[0], override[0]), _merge_list(base[1], override[1])))
        if len(_MERGE_MEMO) >= _MEMO_MAX:
            _MERGE_MEMO.clear()
        _MERGE_MEMO[key] = hit
    return hit


_MERGE_MEMO: dict[tuple[NodeResources, NodeResources], NodeResources] = {}


def _merge_list(base: ResourceList, override: ResourceList) -> ResourceList:
    if not override:
        return base
    if not base:
        return override
    merged = dict(base)
    merged.update(override)
    return tuple(sorted(merged.items()))


def node_resources(requests: object, limits: object) -> tuple[NodeResources, bool]:
    """(canonical resources, malformed) of a container's or ``resourcesPerNode``'s requests and limits.

    Entries whose name is not a Kubernetes resource name (``is_resource_name``: it could never be a label
    value) or whose quantity does not parse are dropped and flag ``malformed``, as do a non-mapping list
    and entries beyond MAX_RESOURCE_ENTRIES; the API server accepts none of these. Interned and memoised:
    TrainJobs of one template share one value, so a projection holds a pointer, not a copy.
    """
    req, bad_req = _resource_list(requests)
    lim, bad_lim = _resource_list(limits)
    return _intern_resources((req, lim)), bad_req or bad_lim


def _intern_resources(resources: NodeResources) -> NodeResources:
    shared = _RESOURCES_INTERN.get(resources)
    if shared is None:
        if len(_RESOURCES_INTERN) >= _MEMO_MAX:
            _RESOURCES_INTERN.clear()
        _RESOURCES_INTERN[resources] = shared = resources
    return shared


_RESOURCES_INTERN: dict[NodeResources, NodeResources] = {NO_RESOURCES: NO_RESOURCES}


def _resource_list(source: object) -> tuple[ResourceList, bool]:
    items = _memo_items(source)
    if items is None:
        return _parse_resource_list(source)
    hit = _LIST_MEMO.get(items)
    if hit is None:
        hit = _parse_resource_list(source)
        if len(_LIST_MEMO) >= _MEMO_MAX:
            _LIST_MEMO.clear()
        _LIST_MEMO[items] = hit
    return hit


_LIST_MEMO: dict[tuple[tuple[str, object], ...], tuple[ResourceList, bool]] = {}
_NO_ITEMS: Final[tuple[tuple[str, object], ...]] = ()


def _memo_items(source: object) -> tuple[tuple[str, object], ...] | None:
    """A memo key for a resource list: its items when all names are short strings and all quantities
    short strings or ints (type-exact, so "1" and 1 or true never share an entry), else None (not
    memoised)."""
    if source is None:
        return _NO_ITEMS
    if type(source) is not dict or len(source) > 16:
        return None
    items = tuple(source.items())
    for name, quantity in items:
        if type(name) is not str or len(name) > _MAX_MEMO_KEY:
            return None
        # int too (YAML-written objects carry `nvidia.com/gpu: 2`); never bool or float, which compare
        # equal to ints (True == 1, 2.0 == 2) while they are not the same quantity to the parser.
        if type(quantity) is int:
            continue
        if type(quantity) is not str or len(quantity) > _MAX_MEMO_KEY:
            return None
    return items


def _parse_resource_list(source: object) -> tuple[ResourceList, bool]:
    if source is None:
        return (), False
    if not isinstance(source, Mapping):
        return (), True
    malformed = False
    entries: dict[str, int] = {}
    for name, quantity in source.items():
        if len(entries) >= MAX_RESOURCE_ENTRIES:
            malformed = True
            break
        if not isinstance(name, str) or not is_resource_name(name):
            malformed = True
            continue
        count = accelerator_count(quantity)
        if count is None:
            malformed = True
            continue
        entries[sys.intern(name)] = count
    return tuple(sorted(entries.items())), malformed


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
    Suspended condition (a resume is not effective until the controller acts); then running when some
    child Job is ready (``status.jobsStatus[].ready > 0``); else pending.

    There is no Running condition. ``jobsStatus`` is copied from the JobSet's ``replicatedJobsStatus``
    (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go`` Status), where ``active``
    counts child Jobs with a pod running *or pending* and ``ready`` those whose ready plus succeeded pods
    reach the Job's expected pod count (kubernetes-sigs/jobset v0.12.0
    ``pkg/controllers/jobset_controller.go`` calculateReplicatedJobStatuses). ``active`` alone would call
    a job whose pods wait for GPUs "running"; ``ready`` says its pods actually run. So pending covers
    "no JobSet or pods yet", "pods waiting for capacity" and "pods starting" (image pulls, init containers),
    and running starts once one child Job, an initializer's or the trainer's, has all its pods ready.
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
    """``spec.mlPolicy.mpi.runLauncherAsNode`` (default false). It does not change the logical node count
    (see requested_nodes) but does decide whether a TrainJob's resourcesPerNode reaches the ``node`` job
    (see merges_job_resources)."""
    if not isinstance(ml_policy_obj, Mapping):
        return False
    mpi = ml_policy_obj.get("mpi")
    return isinstance(mpi, Mapping) and mpi.get("runLauncherAsNode") is True


def framework(labels: object) -> str:
    """The ``trainer.kubeflow.org/framework`` label, or "unknown" when missing or empty.

    Every runtime must carry it (kubeflow/trainer docs/operator-guides/runtime.md), so a missing one
    is an anomaly worth seeing; "unknown" rather than "" because Prometheus treats an empty label as
    absent. The value is operator-chosen but runtimes are operator-controlled and Kubernetes caps
    label values at 63 characters; we cap again for objects that bypassed validation.
    """
    if not isinstance(labels, Mapping):
        return UNKNOWN
    value = labels.get(FRAMEWORK_LABEL)
    if not isinstance(value, str) or not value:
        return UNKNOWN
    return sys.intern(value[:MAX_LABEL_VALUE])


def is_trainer_ancestor(labels: object) -> bool:
    """The replicated job's template is labelled ancestor-step ``trainer``: the controller's trainer PodSet
    (``FindPodSetByAncestor(constants.AncestorTrainer)``), the one whose count the ML policy sets."""
    return isinstance(labels, Mapping) and labels.get(ANCESTOR_LABEL) == ANCESTOR_TRAINER


def merges_job_resources(ml_policy_obj: object, job_name: object, trainer_ancestor: bool) -> bool:
    """The controller merges a TrainJob's ``resourcesPerNode`` into this replicated job's ``node``
    container (kubeflow/trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo):
    ``isTrainerAncestor`` (labelled ancestor ``trainer`` and the runtime has an mlPolicy) or
    ``isMPILauncherAsNode`` (MPI with ``runLauncherAsNode``, and the job is named ``node``). Otherwise the
    job's resourcesPerNode never reaches that container: a runtime without an mlPolicy ignores it.
    """
    if ml_policy_obj is None:
        return False
    return trainer_ancestor or (job_name == NODE and run_launcher_as_node(ml_policy_obj))
