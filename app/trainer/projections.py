"""Compact projections of TrainJobs and (Cluster)TrainingRuntimes: what an informer caches per object.

An informer keeps one projection per object instead of its JSON: a TrainJob's 2-5 KB (mostly
managedFields) shrinks to what the metrics read. The builders at the end of this module make them
from field values; the projectors (app/trainer/projectors.py) read those values off the wire
structs or the generic JSON.

Memory: projections are ``gc=False`` msgspec structs (no GC header; they only hold strings,
numbers and None, so they cannot be part of a cycle); repeated strings (namespace, runtime
ref label, condition reason) and resource lists are interned; the job's ``name`` is derived from
``key`` instead of stored, its booleans share one small int, and its uid and resourceVersion are
stored compactly. tests/trainer/test_memory.py measures the bytes per TrainJob.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from app.trainer import rules
from app.trainer.progress import TrainerProgress
from app.trainer.wire import Condition

# TrainJobProjection.flags bits (booleans in one small int: saves 24 B per job).
SUSPEND: Final = 1  # spec.suspend
SUSPENDED_CONDITION: Final = 2  # the Suspended condition is True (False/"Resumed" means resumed)
READY: Final = 4  # some status.jobsStatus[].ready > 0 (rules.job_state: running, not pending)
MALFORMED: Final = 8  # some field was unusable and a default was taken instead
BAD_NAMESPACE: Final = 16  # metadata.namespace is not a DNS-1123 label: labels say "unknown" instead
RESUMED: Final = 32  # the Suspended condition is False with reason Resumed (admitted; rules.job_conditions)

# rules.job_state(result="", ...) by flags & (SUSPEND | SUSPENDED_CONDITION | READY), built from the
# rule itself: the per-event paths look the state up instead of calling it.
STATE_BY_FLAGS: Final = tuple(
    rules.job_state("", bool(f & SUSPEND), bool(f & SUSPENDED_CONDITION), bool(f & READY)) for f in range(8)
)

_MAX_RV_DIGITS: Final = 18  # an int64 resourceVersion; longer ones stay strings
_MAX_REASON: Final = rules.MAX_REASON_LABEL  # never keep a long reason: see _reason

# (name, template labels, template spec parallelism, containers as (name, (requests, limits) or None))
# of a replicated job
ReplicatedJobParts = tuple[object, object, object, Iterable[tuple[object, object]]]


def compact_uid(uid: str) -> bytes | str:
    """A canonical UUID string ("8-4-4-4-12" lowercase hex, what the API server assigns) as its 16
    bytes (49 B instead of 85 B); any other uid is kept as the string. ``uid_text`` inverts it."""
    if len(uid) == 36 and uid[8:24:5] == "----":
        digits = uid.replace("-", "")
        try:
            raw = bytes.fromhex(digits)
        except ValueError:
            return uid
        if len(raw) == 16 and raw.hex() == digits:  # lowercase, no whitespace: round-trips exactly
            return raw
    return uid


def same_uid_text(stored: bytes | str, uid: str) -> bool:
    """``compact_uid(uid) == stored``, without building the bytes (checked on every watch event)."""
    if type(stored) is str:
        return stored == uid
    # exactly four dashes at the UUID positions and the rest the lowercase hex of the stored bytes
    return len(uid) == 36 and uid[8:24:5] == "----" and uid.replace("-", "") == stored.hex()  # type: ignore[union-attr]


def uid_text(uid: bytes | str) -> str:
    """The uid string for a ``compact_uid`` value."""
    if type(uid) is str:
        return uid
    h = uid.hex()  # type: ignore[union-attr]
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def compact_rv(resource_version: str) -> int | str:
    """A decimal resourceVersion as an int (28 B instead of ~56 B); anything else (opaque by contract,
    or not canonical such as "007") stays a string, so ``str()`` always gives back what was sent."""
    rv = resource_version
    if rv.isdigit() and rv.isascii() and len(rv) <= _MAX_RV_DIGITS and (rv[0] != "0" or len(rv) == 1):
        return int(rv)
    return rv


class JobExtra(msgspec.Struct, frozen=True, gc=False):
    """The parts of a TrainJob's status that few jobs have, kept off the projection itself.

    Why one optional pointer: a projection with one field more still fits CPython's 16-byte allocation
    class (120 -> 128 bytes), two more would not (136 -> 144), and every job pays for a field while few
    jobs have these (P3, bytes per TrainJob)."""

    # lastTransitionTime of the Suspended=False/Resumed condition: when the job was admitted (resumed).
    resumed_time: float | None = None
    # status.trainerStatus, projected only while the per-TrainJob series are on (app/trainer/progress.py).
    progress: TrainerProgress | None = None


class _TrainJobFields(msgspec.Struct, frozen=True, gc=False):
    key: str  # "namespace/name"
    # metadata.uid as compact_uid stores it (16 bytes for a UUID); ``uid`` gives the string.
    uid: bytes | str
    namespace: str  # interned, as written (``namespace_label`` is what labels use)
    # metadata.resourceVersion as compact_rv stores it (an int when decimal); ``resource_version`` gives
    # the string.
    resource_version: int | str
    created: float | None  # creationTimestamp, epoch seconds
    # spec.runtimeRef as its bounded label (rules.runtime_ref_label, interned and shared by all jobs
    # of a runtime); "unknown" when it cannot name a Trainer runtime. Before the state's cap.
    runtime_ref: str
    num_nodes: int | None  # spec.trainer.numNodes as given (0 is legal); None when unset or unusable
    # spec.trainer.resourcesPerNode as rules.node_resources keeps it (interned: jobs of one template share
    # it); None when the job sets none. Merged into the runtime's node container when the job is counted.
    resources: rules.NodeResources | None
    result: str  # "" while not terminal, else "succeeded" | "failed" (Failed True beats Complete True)
    reason: str  # raw reason of the terminal condition (interned, capped), "" when not terminal
    terminal_time: float | None  # lastTransitionTime of the terminal condition
    flags: int = 0  # SUSPEND | SUSPENDED_CONDITION | READY | MALFORMED | BAD_NAMESPACE
    # metadata.generation (bumped by the API server on every spec change; None when absent): the spec
    # part of the projection is reused from the cached one while (uid, generation) are unchanged.
    generation: int | None = None
    extra: JobExtra | None = None  # resumed time and trainer progress, when the job has either

    def __post_init__(self) -> None:
        # Whoever builds one (tests, the debug API...) gets the same compact representation as the
        # projector's, so equal objects compare equal and key the same dict entries. (The slots are set
        # through their member descriptors: the subclass shadows the names with str properties.)
        uid = _UID_SLOT.__get__(self)
        if type(uid) is str:
            _UID_SLOT.__set__(self, compact_uid(uid))
        rv = _RV_SLOT.__get__(self)
        if type(rv) is str:
            _RV_SLOT.__set__(self, compact_rv(rv))


_UID_SLOT: Final[Any] = _TrainJobFields.__dict__["uid"]
_RV_SLOT: Final[Any] = _TrainJobFields.__dict__["resource_version"]


class TrainJobProjection(_TrainJobFields, frozen=True, gc=False):
    """What the metrics need of one TrainJob (immutable; an update yields a new projection).

    ``uid`` and ``resource_version`` read as strings (the informer's ``KubeObject`` contract) but are
    stored compactly; ``uid_key`` / ``rv`` are the stored values (cheap identity for dict keys and
    comparisons: equal strings always give equal stored values).
    """

    uid_key = _UID_SLOT  # the stored uid: bytes (UUID) or str
    rv = _RV_SLOT  # the stored resourceVersion: int (decimal) or str

    @property  # type: ignore[misc]
    def uid(self) -> str:
        return uid_text(_UID_SLOT.__get__(self))

    @property  # type: ignore[misc]
    def resource_version(self) -> str:
        rv = _RV_SLOT.__get__(self)
        return rv if type(rv) is str else str(rv)

    @property
    def name(self) -> str:
        # Derived rather than stored: saves a string (~70 B) per job.
        return self.key[len(self.namespace) + 1 :] if self.namespace else self.key

    @property
    def namespace_label(self) -> str:
        """The namespace as a label value: "unknown" when it is not a DNS-1123 label."""
        return rules.UNKNOWN if self.flags & BAD_NAMESPACE else self.namespace

    @property
    def suspend(self) -> bool:
        return bool(self.flags & SUSPEND)

    @property
    def suspended_condition(self) -> bool:
        return bool(self.flags & SUSPENDED_CONDITION)

    @property
    def ready(self) -> bool:
        return bool(self.flags & READY)

    @property
    def malformed(self) -> bool:
        return bool(self.flags & MALFORMED)

    @property
    def terminal(self) -> bool:
        return bool(self.result)

    @property
    def resumed(self) -> bool:
        """The Suspended condition is False with reason Resumed: a queue (or a person) admitted the job."""
        return bool(self.flags & RESUMED)

    @property
    def resumed_time(self) -> float | None:
        extra = self.extra
        return extra.resumed_time if extra is not None else None

    @property
    def progress(self) -> TrainerProgress | None:
        extra = self.extra
        return extra.progress if extra is not None else None

    @property
    def state(self) -> str:
        """rules.job_state of this job (a table lookup)."""
        return self.result or STATE_BY_FLAGS[self.flags & 7]


class RuntimeProjection(msgspec.Struct, frozen=True, gc=False):
    """What the metrics need of one TrainingRuntime or ClusterTrainingRuntime."""

    key: str  # "namespace/name" for TrainingRuntime, "name" for ClusterTrainingRuntime
    uid: str
    namespace: str  # "" for ClusterTrainingRuntime
    name: str
    kind: str  # TrainingRuntime | ClusterTrainingRuntime
    resource_version: str
    ref: str  # runtime_ref label value that TrainJobs referencing this runtime get
    ml_policy: str  # rules.ML_POLICIES
    pod_group_policy: str  # rules.POD_GROUP_POLICIES
    framework: str  # trainer.kubeflow.org/framework label, "unknown" when missing
    num_nodes: int | None  # spec.mlPolicy.numNodes (no CRD default)
    run_launcher_as_node: bool  # spec.mlPolicy.mpi.runLauncherAsNode
    # The node count the controller gives the trainer job when the TrainJob sets none
    # (rules.runtime_default_nodes: mlPolicy.numNodes, else the template's parallelism, else 1).
    default_nodes: int
    # requests and limits of the trainer job's `node` container (runtime_trainer): the base a TrainJob's
    # resourcesPerNode merges into; rules.NO_RESOURCES when there is no such container.
    node_resources: rules.NodeResources
    merges_job_resources: bool  # the controller merges a TrainJob's resourcesPerNode into it
    malformed: bool = False


# --- builders: both decoding paths end here -----------------------------------------------------


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def object_key(namespace: str, name: str) -> str:
    """The informer's cache key: "namespace/name", or "name" for a cluster-scoped object."""
    return f"{namespace}/{name}" if namespace else name


def _generation(value: object) -> int | None:
    # what msgspec's typed decode of an ``int | None`` admits, and not negative
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


def job_with_status(  # noqa: PLR0917 - positional: keyword passing costs ~75 ns more per watch event
    key: str,
    uid: bytes | str,
    namespace: str,
    resource_version: int | str,
    created: float | None,
    runtime_ref: str,
    num_nodes: int | None,
    resources: rules.NodeResources | None,
    generation: int | None,
    flags: int,
    conditions: list[Condition] | None,
    ready: bool,
    progress: TrainerProgress | None = None,
) -> TrainJobProjection:
    """The projection of a job whose spec part is known (``flags``: its SUSPEND, BAD_NAMESPACE and
    MALFORMED bits), with the status part derived from ``conditions``, ``ready`` and ``progress`` (the
    trainerStatus, None unless the per-TrainJob series are on). An incremental update (nearly every watch
    event) comes straight here with the cached projection's spec part.
    """
    result, reason, terminal_time = "", "", None
    extra = None
    if conditions:
        result, terminal, suspended, resumed = rules.job_conditions(conditions)
        if suspended:
            flags |= SUSPENDED_CONDITION
        if terminal is not None:
            reason = _reason(terminal.reason)
            ltt = terminal.lastTransitionTime
            terminal_time = rules.parse_time(ltt)
            if terminal_time is None and ltt is not None:
                flags |= MALFORMED
        if resumed is not None:
            flags |= RESUMED
            ltt = resumed.lastTransitionTime
            resumed_time = rules.parse_time(ltt)
            if resumed_time is None and ltt is not None:
                flags |= MALFORMED
            extra = JobExtra(resumed_time, progress)
    if ready:
        flags |= READY
    if progress is not None and extra is None:
        extra = JobExtra(None, progress)
    return TrainJobProjection(
        key,
        uid,
        namespace,
        resource_version,
        created,
        runtime_ref,
        num_nodes,
        resources,
        result,
        reason,
        terminal_time,
        flags,
        generation,
        extra,
    )


def _reason(reason: str) -> str:
    """The terminal reason as kept (interned). One longer than rules.MAX_REASON_LABEL is cut, and marked
    with a trailing "…", which no well-formed reason has: cutting alone could leave a 64-character
    CamelCase prefix that would pass for a reason of its own (and a label value)."""
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 1] + "…"
    return sys.intern(reason)


def build_job(
    *,
    name: str,
    uid: str,
    namespace: str,
    resource_version: object,
    generation: object,
    creation_timestamp: object,
    ref_group: object,
    ref_kind: object,
    ref_name: object,
    num_nodes: object,
    resources: tuple[object, object] | None,
    suspend: object,
    conditions: list[Condition] | None,
    ready: bool,
    malformed: bool,
    progress: TrainerProgress | None = None,
) -> TrainJobProjection:
    """A TrainJob's projection from its fields as found (of any JSON type): an unusable value takes
    its default and sets MALFORMED, as does ``malformed`` (the caller's own findings)."""
    created = rules.parse_time(creation_timestamp)
    if created is None:
        malformed = True  # every stored object has a creationTimestamp
    nodes, bad = rules.coerce_count(num_nodes)
    malformed |= bad
    node_resources: rules.NodeResources | None = None
    if resources is not None:
        node_resources, bad = rules.node_resources(resources[0], resources[1])
        malformed |= bad
    if suspend is not None and not isinstance(suspend, bool):
        malformed = True
    group, kind, rname = _str(ref_group), _str(ref_kind), _str(ref_name)
    if rname is None or (ref_group is not None and group is None) or (ref_kind is not None and kind is None):
        malformed = True
    runtime_ref = rules.runtime_ref_label(group, kind, rname, namespace)
    if runtime_ref == rules.UNKNOWN:
        malformed = True  # not a Trainer runtime: the webhook would have refused it
    rv = resource_version if isinstance(resource_version, str) else ""
    namespace = sys.intern(namespace)
    bad_namespace = not rules.is_dns_label(namespace)  # a real API server only sends DNS labels
    flags = (
        (SUSPEND if suspend is True else 0)
        | (BAD_NAMESPACE if bad_namespace else 0)
        | (MALFORMED if malformed or bad_namespace else 0)
    )
    return job_with_status(
        object_key(namespace, name),
        compact_uid(uid),
        namespace,
        compact_rv(rv),
        created,
        runtime_ref,
        nodes,
        node_resources,
        _generation(generation),
        flags,
        conditions,
        ready,
        progress,
    )


def runtime_trainer(
    replicated_jobs: Iterable[ReplicatedJobParts], ml_policy_obj: object
) -> tuple[int, rules.NodeResources, bool, bool]:
    """(default node count, trainer ``node`` container resources, whether a TrainJob's resourcesPerNode
    merges into them, malformed) of a runtime's JobSet template, read as the controller reads it
    (kubeflow/trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo).

    - The node count comes from the controller's trainer PodSet: the first replicated job labelled
      ancestor ``trainer`` (else, for runtimes without the label, the one named ``node``):
      rules.runtime_default_nodes.
    - The resources come from the ``node`` container of the first replicated job named ``node`` or
      labelled ancestor ``trainer`` (the controller's own ``ExtractResourcePerNodeFromRuntime`` in
      ``pkg/runtime/runtime.go``, and #4190's choice; for MPI runtimes with ``runLauncherAsNode`` this
      is the ``node`` worker job, into which the controller merges resourcesPerNode as into the
      launcher). Runtime patches (``spec.runtimePatches``) are not applied.
    """
    malformed = False
    counted: tuple[bool, object] | None = None  # (ancestor-labelled, parallelism) of the trainer PodSet
    resources: tuple[rules.NodeResources, bool] | None = None  # (resources, merges)
    for job_name, labels, parallelism, containers in replicated_jobs:
        ancestor = rules.is_trainer_ancestor(labels)
        if ancestor and (counted is None or not counted[0]):
            counted = (True, parallelism)
        elif counted is None and job_name == rules.NODE:
            counted = (False, parallelism)
        if resources is None and (ancestor or job_name == rules.NODE):
            for container_name, container_resources in containers:
                if container_name != rules.NODE:
                    continue
                if isinstance(container_resources, tuple):
                    res, bad = rules.node_resources(container_resources[0], container_resources[1])
                    malformed |= bad
                else:
                    res = rules.NO_RESOURCES
                resources = (res, rules.merges_job_resources(ml_policy_obj, job_name, ancestor))
                break
    nodes = 1
    if counted is not None:
        count, bad = rules.coerce_count(counted[1])
        malformed |= bad
        nodes = rules.runtime_default_nodes(
            ml_policy_obj is not None, rules.runtime_num_nodes(ml_policy_obj)[0], counted[0], count
        )
    if resources is None:
        return nodes, rules.NO_RESOURCES, False, malformed
    return nodes, resources[0], resources[1], malformed


def build_runtime(
    *,
    kind: str,
    namespaced: bool,
    name: str,
    uid: str,
    namespace: object,
    resource_version: object,
    labels: object,
    ml_policy_obj: object,
    pod_group_policy_obj: object,
    replicated_jobs: Iterable[ReplicatedJobParts],
    malformed: bool,
) -> RuntimeProjection:
    """A runtime's projection from its fields as found (see ``build_job``)."""
    ns = sys.intern(namespace) if namespaced and isinstance(namespace, str) else ""
    if namespaced and not ns:
        malformed = True
    num_nodes, bad = rules.runtime_num_nodes(ml_policy_obj)
    malformed |= bad
    default_nodes, node_resources, merges, bad = runtime_trainer(replicated_jobs, ml_policy_obj)
    malformed |= bad
    return RuntimeProjection(
        key=object_key(ns, name),
        uid=uid,
        namespace=ns,
        name=name,
        kind=kind,
        resource_version=resource_version if isinstance(resource_version, str) else "",
        ref=rules.runtime_ref_label(rules.DEFAULT_RUNTIME_API_GROUP, kind, name, ns),
        ml_policy=rules.ml_policy(ml_policy_obj),
        pod_group_policy=rules.pod_group_policy(pod_group_policy_obj),
        framework=rules.framework(labels),
        num_nodes=num_nodes,
        run_launcher_as_node=rules.run_launcher_as_node(ml_policy_obj),
        default_nodes=default_nodes,
        node_resources=node_resources,
        merges_job_resources=merges,
        malformed=malformed,
    )
