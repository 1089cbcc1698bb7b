"""Compact projections of TrainJobs and (Cluster)TrainingRuntimes, and their ``Projector``s.

An informer keeps one projection per object instead of its JSON: a TrainJob's 2-5 KB (mostly
managedFields) shrinks to what the metrics read. Two ways in, one result:

- typed (fast path): msgspec decodes the watch/list JSON straight into ``*Wire`` structs that name
  only the needed paths (unknown fields are skipped at C speed), then ``from_wire`` projects them;
- tolerant (``from_json``): for an object the typed decoder rejects (a string numNodes, a null
  quantity, a list where a map belongs...), it walks the generic JSON value and salvages what it
  can. It never raises; it returns ``None`` only when the key or uid cannot be determined.

Both paths feed the same builder and the same pure rules (app/trainer/rules.py), so they agree on
every well-formed object (tests check this over every manifest in app/sim/data).

Memory: projections are ``gc=False`` msgspec structs (no GC header; they only hold strings,
numbers and None, so they cannot be part of a cycle); repeated strings (namespace, runtime
ref label, accelerator class, condition reason) are interned; the job's ``name`` is derived from
``key`` instead of stored and its four booleans share one small int. tests/trainer/test_memory.py
measures the bytes per TrainJob.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final

import msgspec

from app.trainer import rules

_MAX_REASON: Final = 64  # a condition reason is a CamelCase word; never keep a long one

# A quantity in a ResourceList: a string ("500m"), or a number when the object was written as YAML.
Quantity = int | float | str


# --- wire types: only the JSON paths the metrics read ------------------------------------------


class _Resources(msgspec.Struct, forbid_unknown_fields=False):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


# name and uid have no default and must not be empty: an object without them fails typed decoding and
# goes through from_json, which drops it (no key / uid to track it by). The typed path admits only what
# from_json admits.
_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _JobMeta(msgspec.Struct, forbid_unknown_fields=False):
    name: _NonEmpty
    uid: _NonEmpty
    namespace: str = ""
    resourceVersion: str = ""
    generation: int | None = None
    creationTimestamp: str | None = None


class _RuntimeRef(msgspec.Struct, forbid_unknown_fields=False):
    name: str = ""
    apiGroup: str | None = None
    kind: str | None = None


class _Trainer(msgspec.Struct, forbid_unknown_fields=False):
    numNodes: int | None = None
    resourcesPerNode: _Resources | None = None


class _JobSpec(msgspec.Struct, forbid_unknown_fields=False):
    runtimeRef: _RuntimeRef | None = None
    trainer: _Trainer | None = None
    suspend: bool | None = None


class _Condition(msgspec.Struct, forbid_unknown_fields=False):
    type: str = ""
    status: str = ""
    reason: str = ""
    lastTransitionTime: str | None = None


class _ChildJobStatus(msgspec.Struct, forbid_unknown_fields=False):
    active: int | None = None


class _JobStatus(msgspec.Struct, forbid_unknown_fields=False):
    conditions: list[_Condition] | None = None
    jobsStatus: list[_ChildJobStatus] | None = None


class TrainJobWire(msgspec.Struct, forbid_unknown_fields=False):
    """The parts of a TrainJob that the metrics read."""

    metadata: _JobMeta
    spec: _JobSpec | None = None
    status: _JobStatus | None = None


class _RuntimeMeta(msgspec.Struct, forbid_unknown_fields=False):
    name: _NonEmpty
    uid: _NonEmpty
    namespace: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None


class _Container(msgspec.Struct, forbid_unknown_fields=False):
    name: str = ""
    resources: _Resources | None = None


class _PodSpec(msgspec.Struct, forbid_unknown_fields=False):
    containers: list[_Container] | None = None


class _PodTemplate(msgspec.Struct, forbid_unknown_fields=False):
    spec: _PodSpec | None = None


class _JobTemplateSpec(msgspec.Struct, forbid_unknown_fields=False):
    template: _PodTemplate | None = None


class _TemplateMeta(msgspec.Struct, forbid_unknown_fields=False):
    labels: dict[str, str] | None = None


class _JobTemplate(msgspec.Struct, forbid_unknown_fields=False):
    metadata: _TemplateMeta | None = None
    spec: _JobTemplateSpec | None = None


class _ReplicatedJob(msgspec.Struct, forbid_unknown_fields=False):
    name: str = ""
    template: _JobTemplate | None = None


class _JobSetSpec(msgspec.Struct, forbid_unknown_fields=False):
    replicatedJobs: list[_ReplicatedJob] | None = None


class _JobSetTemplate(msgspec.Struct, forbid_unknown_fields=False):
    spec: _JobSetSpec | None = None


class _RuntimeSpec(msgspec.Struct, forbid_unknown_fields=False):
    # The policies are small and their recognition needs the set of keys (an mlPolicy with only an
    # unknown policy is "unknown"), so they stay generic; the rules read both paths the same way.
    mlPolicy: Any = None
    podGroupPolicy: Any = None
    template: _JobSetTemplate | None = None


class RuntimeWire(msgspec.Struct, forbid_unknown_fields=False):
    """The parts of a TrainingRuntime / ClusterTrainingRuntime that the metrics read."""

    metadata: _RuntimeMeta
    spec: _RuntimeSpec | None = None


# --- projections -------------------------------------------------------------------------------


# TrainJobProjection.flags bits (booleans in one small int: saves 24 B per job).
SUSPEND: Final = 1  # spec.suspend
SUSPENDED_CONDITION: Final = 2  # the Suspended condition is True (False/"Resumed" means resumed)
ACTIVE: Final = 4  # some status.jobsStatus[].active > 0
MALFORMED: Final = 8  # some field was unusable and a default was taken instead
BAD_NAMESPACE: Final = 16  # metadata.namespace is not a DNS-1123 label: labels say "unknown" instead

# job_state(result="", ...) by flags & (SUSPEND | SUSPENDED_CONDITION | ACTIVE): no call per event.
STATE_BY_FLAGS: Final = tuple(
    rules.job_state("", bool(f & SUSPEND), bool(f & SUSPENDED_CONDITION), bool(f & ACTIVE)) for f in range(8)
)

_MAX_RV_DIGITS: Final = 18  # an int64 resourceVersion; longer ones stay strings


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


def _same_uid_text(stored: bytes | str, uid: str) -> bool:
    """``compact_uid(uid) == stored``, without building the bytes (the per-event check)."""
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
    # From spec.trainer.resourcesPerNode: None when the job sets no resourcesPerNode (the runtime's
    # trainer container decides), "none" when it sets some but no accelerator, else the resource name.
    accelerator_class: str | None
    accelerators_per_node: int
    result: str  # "" while not terminal, else "succeeded" | "failed" (Failed True beats Complete True)
    reason: str  # raw reason of the terminal condition (interned, capped), "" when not terminal
    terminal_time: float | None  # lastTransitionTime of the terminal condition
    flags: int = 0  # SUSPEND | SUSPENDED_CONDITION | ACTIVE | MALFORMED | BAD_NAMESPACE
    # metadata.generation (bumped by the API server on every spec change; None when absent): the spec
    # part of the projection is reused from the cached one while (uid, generation) are unchanged.
    generation: int | None = None

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
    def active(self) -> bool:
        return bool(self.flags & ACTIVE)

    @property
    def malformed(self) -> bool:
        return bool(self.flags & MALFORMED)

    @property
    def terminal(self) -> bool:
        return bool(self.result)

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
    accelerator_class: str  # from the trainer `node` container; "none" when it requests none
    accelerators_per_node: int
    malformed: bool = False


# --- shared builders ---------------------------------------------------------------------------


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _generation(value: object) -> int | None:
    # what msgspec's typed decode of an ``int | None`` admits, and not negative
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


def _status_part(conditions: list[rules.Condition], active: bool) -> tuple[str, str, float | None, int, bool]:
    """(result, reason, terminal_time, status flags, malformed) from the conditions and jobsStatus."""
    malformed = False
    terminal = rules.terminal_condition(conditions)
    if terminal is None:
        result, reason, terminal_time = "", "", None
    else:
        result, raw_reason, ltt = terminal
        reason = sys.intern(raw_reason[:_MAX_REASON])
        terminal_time = rules.parse_time(ltt)
        if terminal_time is None and ltt is not None:
            malformed = True
    flags = (SUSPENDED_CONDITION if rules.suspended_condition(conditions) else 0) | (ACTIVE if active else 0)
    return result, reason, terminal_time, flags, malformed


def _build_job(
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
    conditions: list[rules.Condition],
    active: bool,
    malformed: bool,
) -> TrainJobProjection:
    created = rules.parse_time(creation_timestamp)
    if created is None:
        malformed = True  # every stored object has a creationTimestamp
    nodes, bad = rules.coerce_count(num_nodes)
    malformed |= bad
    if resources is None:
        cls: str | None = None
        per_node = 0
    else:
        cls, per_node, bad = rules.select_accelerator(resources[0], resources[1])
        malformed |= bad
    if suspend is not None and not isinstance(suspend, bool):
        malformed = True
    result, reason, terminal_time, status_flags, bad = _status_part(conditions, active)
    malformed |= bad
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
        | status_flags
        | (BAD_NAMESPACE if bad_namespace else 0)
        | (MALFORMED if malformed or bad_namespace else 0)
    )
    return TrainJobProjection(
        key=_key(namespace, name),
        uid=compact_uid(uid),
        namespace=namespace,
        resource_version=compact_rv(rv),
        created=created,
        runtime_ref=runtime_ref,
        num_nodes=nodes,
        accelerator_class=cls,
        accelerators_per_node=per_node,
        result=result,
        reason=reason,
        terminal_time=terminal_time,
        flags=flags,
        generation=_generation(generation),
    )


def _trainer_container_resources(
    replicated_jobs: Iterable[tuple[object, object, Iterable[tuple[object, object]]]],
) -> tuple[object, object] | None:
    """(requests, limits) of the ``node`` container of the first trainer replicated job (#4190).

    ``replicated_jobs`` yields (name, template labels, containers as (name, resources)); resources
    is a (requests, limits) pair or None.
    """
    for job_name, labels, containers in replicated_jobs:
        if not rules.is_trainer_replicated_job(job_name, labels):
            continue
        for container_name, resources in containers:
            if container_name == rules.NODE:
                return resources if isinstance(resources, tuple) else None
    return None


def _build_runtime(
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
    container_resources: tuple[object, object] | None,
    malformed: bool,
) -> RuntimeProjection:
    ns = sys.intern(namespace) if namespaced and isinstance(namespace, str) else ""
    if namespaced and not ns:
        malformed = True
    num_nodes, bad = rules.runtime_num_nodes(ml_policy_obj)
    malformed |= bad
    if container_resources is None:
        cls, per_node = rules.NONE, 0
    else:
        cls, per_node, bad = rules.select_accelerator(container_resources[0], container_resources[1])
        malformed |= bad
    return RuntimeProjection(
        key=_key(ns, name),
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
        accelerator_class=cls,
        accelerators_per_node=per_node,
        malformed=malformed,
    )


# --- tolerant JSON walking ---------------------------------------------------------------------


def _get(obj: object, *path: str) -> object:
    """obj[path[0]][path[1]]...; None as soon as a step is not a JSON object or lacks the key."""
    for step in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(step)
    return obj


def _list(obj: object) -> list[Any]:
    return obj if isinstance(obj, list) else []


def _json_resources(obj: object) -> tuple[object, object] | None:
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        return obj, None  # select_accelerator flags a non-mapping as malformed, finds no accelerator
    return obj.get("requests"), obj.get("limits")


# --- projectors --------------------------------------------------------------------------------


class TrainJobProjector:
    """``Projector[TrainJobProjection]`` for the TrainJob informer.

    Incremental: ``from_wire(wire, previous)`` reuses the spec part of the cached projection of the
    same object (``previous``, found by ``wire_key``) when its uid and ``metadata.generation`` are
    unchanged (the API server bumps generation on every spec change; a status write, i.e. nearly
    every watch event, leaves it alone), so an update re-derives only the status part. The result
    equals a full projection whenever the spec is unchanged.
    """

    wire_type: type = TrainJobWire

    def wire_key(self, wire: Any) -> str:
        """The cache key the projection of ``wire`` will have (to look ``previous`` up)."""
        meta: _JobMeta = wire.metadata
        return _key(meta.namespace, meta.name)

    @staticmethod
    def same_uid(a: TrainJobProjection, b: TrainJobProjection) -> bool:
        """``a.uid == b.uid`` without rebuilding the strings."""
        same: bool = a.uid_key == b.uid_key
        return same

    def from_wire(self, wire: Any, previous: TrainJobProjection | None = None) -> TrainJobProjection:
        w: TrainJobWire = wire
        meta = w.metadata
        if previous is not None and not previous.flags & MALFORMED:
            generation = meta.generation
            if generation is not None and generation == previous.generation:
                key = _key(meta.namespace, meta.name)
                if key == previous.key:
                    uid = previous.uid_key
                    if _same_uid_text(uid, meta.uid):
                        return self._status_update(w, previous, uid, generation)
        spec = w.spec
        ref = spec.runtimeRef if spec is not None else None
        trainer = spec.trainer if spec is not None else None
        rpn = trainer.resourcesPerNode if trainer is not None else None
        status = w.status
        conditions: list[rules.Condition] = []
        active = False
        if status is not None:
            if status.conditions:
                conditions = [(c.type, c.status, c.reason, c.lastTransitionTime) for c in status.conditions]
            if status.jobsStatus:
                active = any((j.active or 0) > 0 for j in status.jobsStatus)
        return _build_job(
            name=meta.name,
            uid=meta.uid,
            namespace=meta.namespace,
            resource_version=meta.resourceVersion,
            generation=meta.generation,
            creation_timestamp=meta.creationTimestamp,
            ref_group=ref.apiGroup if ref is not None else None,
            ref_kind=ref.kind if ref is not None else None,
            ref_name=ref.name if ref is not None else None,
            num_nodes=trainer.numNodes if trainer is not None else None,
            resources=(rpn.requests, rpn.limits) if rpn is not None else None,
            suspend=spec.suspend if spec is not None else None,
            conditions=conditions,
            active=active,
            malformed=False,  # name and uid are non-empty (_JobMeta)
        )

    @staticmethod
    def _status_update(
        w: TrainJobWire, previous: TrainJobProjection, uid: bytes | str, generation: int
    ) -> TrainJobProjection:
        """A new projection with ``previous``'s spec part (a well-formed one) and ``w``'s status: the
        same rules as ``_status_part``, over the wire structs (no tuples per condition)."""
        result, reason, terminal_time = "", "", None
        flags = 0
        status = w.status
        if status is not None:
            conditions = status.conditions
            if conditions:
                failed = complete = None
                for c in conditions:
                    if c.status == "True":
                        ctype = c.type
                        if ctype == "Failed":
                            if failed is None:
                                failed = c
                        elif ctype == "Complete":
                            if complete is None:
                                complete = c
                        elif ctype == "Suspended":
                            flags = SUSPENDED_CONDITION
                terminal = failed if failed is not None else complete
                if terminal is not None:
                    result = rules.FAILED if failed is not None else rules.SUCCEEDED
                    reason = sys.intern(terminal.reason[:_MAX_REASON])
                    ltt = terminal.lastTransitionTime
                    terminal_time = rules.parse_time(ltt)
                    if terminal_time is None and ltt is not None:
                        flags |= MALFORMED
            jobs = status.jobsStatus
            if jobs:
                for j in jobs:
                    if (j.active or 0) > 0:
                        flags |= ACTIVE
                        break
        spec = w.spec
        if spec is not None and spec.suspend is True:
            flags |= SUSPEND
        return TrainJobProjection(
            previous.key,
            uid,
            previous.namespace,
            compact_rv(w.metadata.resourceVersion),
            previous.created,
            previous.runtime_ref,
            previous.num_nodes,
            previous.accelerator_class,
            previous.accelerators_per_node,
            result,
            reason,
            terminal_time,
            flags,
            generation,
        )

    def from_json(self, obj: Any) -> TrainJobProjection | None:
        try:
            return self._from_json(obj)
        except Exception:  # never let one object break an informer; the caller logs the drop
            return None

    def _from_json(self, obj: object) -> TrainJobProjection | None:
        name, uid = _get(obj, "metadata", "name"), _get(obj, "metadata", "uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            return None
        namespace = _get(obj, "metadata", "namespace")
        malformed = not isinstance(namespace, str)
        conditions: list[rules.Condition] = []
        status_conditions = _get(obj, "status", "conditions")
        if status_conditions is not None and not isinstance(status_conditions, list):
            malformed = True
        for cond in _list(status_conditions):
            if isinstance(cond, Mapping):
                conditions.append(
                    (cond.get("type"), cond.get("status"), cond.get("reason"), cond.get("lastTransitionTime"))
                )
            else:
                malformed = True
        status = _get(obj, "status")
        if status is not None and not isinstance(status, Mapping):
            malformed = True
        active = False
        for child in _list(_get(obj, "status", "jobsStatus")):
            count = _get(child, "active")
            if isinstance(count, int | float) and not isinstance(count, bool):
                active |= count > 0
            elif count is not None:
                malformed = True
        rv = _get(obj, "metadata", "resourceVersion")
        malformed |= not isinstance(rv, str)
        return _build_job(
            name=name,
            uid=uid,
            namespace=namespace if isinstance(namespace, str) else "",
            resource_version=rv,
            generation=_get(obj, "metadata", "generation"),
            creation_timestamp=_get(obj, "metadata", "creationTimestamp"),
            ref_group=_get(obj, "spec", "runtimeRef", "apiGroup"),
            ref_kind=_get(obj, "spec", "runtimeRef", "kind"),
            ref_name=_get(obj, "spec", "runtimeRef", "name"),
            num_nodes=_get(obj, "spec", "trainer", "numNodes"),
            resources=_json_resources(_get(obj, "spec", "trainer", "resourcesPerNode")),
            suspend=_get(obj, "spec", "suspend"),
            conditions=conditions,
            active=active,
            malformed=malformed,
        )


class RuntimeProjector:
    """``Projector[RuntimeProjection]`` for one runtime kind (the object's own ``kind`` field is
    not relied upon: list items may omit it)."""

    wire_type: type = RuntimeWire

    def __init__(self, kind: str) -> None:
        if kind not in rules.RUNTIME_KINDS:
            raise ValueError(f"not a Trainer runtime kind: {kind!r}")
        self.kind = kind
        self.namespaced = kind == rules.TRAINING_RUNTIME_KIND

    def from_wire(self, wire: Any) -> RuntimeProjection:
        w: RuntimeWire = wire
        meta = w.metadata
        spec = w.spec
        replicated: list[_ReplicatedJob] = []
        if spec is not None and spec.template is not None and spec.template.spec is not None:
            replicated = spec.template.spec.replicatedJobs or []
        return _build_runtime(
            kind=self.kind,
            namespaced=self.namespaced,
            name=meta.name,
            uid=meta.uid,
            namespace=meta.namespace,
            resource_version=meta.resourceVersion,
            labels=meta.labels,
            ml_policy_obj=spec.mlPolicy if spec is not None else None,
            pod_group_policy_obj=spec.podGroupPolicy if spec is not None else None,
            container_resources=_trainer_container_resources(_wire_replicated_jobs(replicated)),
            malformed=False,  # name and uid are non-empty (_RuntimeMeta)
        )

    def from_json(self, obj: Any) -> RuntimeProjection | None:
        try:
            return self._from_json(obj)
        except Exception:  # never let one object break an informer
            return None

    def _from_json(self, obj: object) -> RuntimeProjection | None:
        name, uid = _get(obj, "metadata", "name"), _get(obj, "metadata", "uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            return None
        return _build_runtime(
            kind=self.kind,
            namespaced=self.namespaced,
            name=name,
            uid=uid,
            namespace=_get(obj, "metadata", "namespace"),
            resource_version=_get(obj, "metadata", "resourceVersion"),
            labels=_get(obj, "metadata", "labels"),
            ml_policy_obj=_get(obj, "spec", "mlPolicy"),
            pod_group_policy_obj=_get(obj, "spec", "podGroupPolicy"),
            container_resources=_trainer_container_resources(
                _json_replicated_jobs(_get(obj, "spec", "template", "spec", "replicatedJobs"))
            ),
            malformed=False,
        )


def _wire_replicated_jobs(
    replicated: list[_ReplicatedJob],
) -> Iterable[tuple[object, object, Iterable[tuple[object, object]]]]:
    for rj in replicated:
        template = rj.template
        labels = template.metadata.labels if template is not None and template.metadata is not None else None
        containers: list[_Container] = []
        if template is not None and template.spec is not None and template.spec.template is not None:
            pod_spec = template.spec.template.spec
            containers = (pod_spec.containers or []) if pod_spec is not None else []
        yield (
            rj.name,
            labels,
            (
                (c.name, (c.resources.requests, c.resources.limits) if c.resources is not None else None)
                for c in containers
            ),
        )


def _json_replicated_jobs(
    replicated: object,
) -> Iterable[tuple[object, object, Iterable[tuple[object, object]]]]:
    for rj in _list(replicated):
        containers = _list(_get(rj, "template", "spec", "template", "spec", "containers"))
        yield (
            _get(rj, "name"),
            _get(rj, "template", "metadata", "labels"),
            ((_get(c, "name"), _json_resources(_get(c, "resources"))) for c in containers),
        )


TRAINJOB_PROJECTOR: Final = TrainJobProjector()
TRAINING_RUNTIME_PROJECTOR: Final = RuntimeProjector(rules.TRAINING_RUNTIME_KIND)
CLUSTER_TRAINING_RUNTIME_PROJECTOR: Final = RuntimeProjector(rules.CLUSTER_TRAINING_RUNTIME_KIND)
