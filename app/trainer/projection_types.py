"""Compact projections of TrainJobs and (Cluster)TrainingRuntimes: what an informer caches per object.

An informer keeps one projection per object instead of its JSON: a TrainJob's 2-5 KB (mostly
managedFields) shrinks to what the metrics read. The builders (app/trainer/field_builders.py) make
them from field values; the projectors (app/trainer/informer_projectors.py) read those values off the wire
structs or the generic JSON.

Memory: projections are ``gc=False`` msgspec structs (no GC header; they only hold strings,
numbers and None, so they cannot be part of a cycle); repeated strings (namespace, runtime
ref label, condition reason) and resource lists are interned; the job's ``name`` is derived from
``key`` instead of stored, its booleans share one small int, and its uid and resourceVersion are
stored compactly. tests/trainer/test_memory.py measures the bytes per TrainJob.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from app.trainer import rules
from app.trainer.progress import TrainerProgress

# TrainJobProjection.flags bits (booleans in one small int: saves 24 B per job).
SUSPEND: Final = 1  # spec.suspend
SUSPENDED_CONDITION: Final = 2  # the Suspended condition is True (False/"Resumed" means resumed)
# a status.jobsStatus[] entry of the training step has ready > 0 (rules.training_ready, with the runtime
# known when the projection was made): running, not pending (rules.job_state)
READY: Final = 4
MALFORMED: Final = 8  # some field was unusable and a default was taken instead
BAD_NAMESPACE: Final = 16  # metadata.namespace is not a DNS-1123 label: labels say "unknown" instead
RESUMED: Final = 32  # the Suspended condition is False with reason Resumed (admitted; rules.job_conditions)
# The bits above these: the id of the job's training step (rules.step_id), resolved once from its runtime as
# it was when the job was first projected with the runtime known (the controller's runtime snapshot), 0 while
# not resolved. Kept in the flags: a field more would cost 16 B per job (the allocation class above).
STEP_SHIFT: Final = 6
LOW_FLAGS: Final = (1 << STEP_SHIFT) - 1
_FLAG_VALUES: dict[int, int] = {}


def shared_flags(flags: int) -> int:
    """One int object per flags value: values above 256 (a step id set) are not cached by CPython, and one
    per projection would cost 28 B each."""
    if flags <= 256:
        return flags
    return _FLAG_VALUES.setdefault(flags, flags)


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


def rv_text(rv: int | str) -> str:
    """The resourceVersion string for a ``compact_rv`` value."""
    return rv if type(rv) is str else str(rv)


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
    flags: int = 0  # SUSPEND | SUSPENDED_CONDITION | READY | MALFORMED | BAD_NAMESPACE | RESUMED | step id
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
        return rv_text(_RV_SLOT.__get__(self))

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
    def step(self) -> int:
        """The id of the training step the job was resolved with (rules.STEP_SETS), 0 while not resolved."""
        return self.flags >> STEP_SHIFT

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


def same_but_version(a: TrainJobProjection, b: TrainJobProjection) -> bool:
    """Every field but the resourceVersion is equal (the fields most likely to differ first).

    Written out field by field for speed (it runs on every watch event);
    tests/trainer/test_projection_compare.py checks that it names every field of the struct."""
    return (
        a.flags == b.flags
        and a.result == b.result
        and a.extra == b.extra
        and a.terminal_time == b.terminal_time
        and a.reason == b.reason
        and a.generation == b.generation
        and a.runtime_ref == b.runtime_ref
        and a.num_nodes == b.num_nodes
        and a.resources == b.resources
        and a.created == b.created
        and a.uid_key == b.uid_key
        and a.key == b.key
        and a.namespace == b.namespace
    )


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
    # How the controller counts the training nodes (rules.node_rule): when the TrainJob sets no numNodes, and
    # what its numNodes does (ignored without a trainer PodSet; MPI runLauncherAsNode adds the launcher).
    nodes: rules.NodeRule
    # The names of the replicated jobs that are the training step (rules.training_jobs): a TrainJob of this
    # runtime runs when one of them is ready.
    training_jobs: frozenset[str]
    # requests and limits of the trainer job's `node` container (runtime_trainer): the base a TrainJob's
    # resourcesPerNode merges into; rules.NO_RESOURCES when there is no such container.
    node_resources: rules.NodeResources
    merges_job_resources: bool  # the controller merges a TrainJob's resourcesPerNode into it
    malformed: bool = False

    @property
    def default_nodes(self) -> int:
        """The training nodes of a TrainJob of this runtime that sets no numNodes."""
        return self.nodes.default
