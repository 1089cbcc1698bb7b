"""The ``Projector``s the informers use: Trainer objects in, compact projections out.

Two ways in, one result:

- typed (fast path): msgspec decodes the watch/list JSON straight into the wire structs
  (app/trainer/wire.py), then ``from_wire`` projects them;
- tolerant (``from_json``): for an object the typed decoder rejects (a string numNodes, a null
  quantity, a list where a map belongs...), it walks the generic JSON value and salvages what it
  can. It never raises; it returns ``None`` only when the key or uid cannot be determined.

Both paths end in the same builders (app/trainer/field_builders.py) and the same pure rules
(app/trainer/rules/), so they agree on every well-formed object (tests check this over every
manifest in sim/kubesim/trainer/data).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, cast

from app.trainer import rules
from app.trainer.field_builders import build_job, build_runtime, job_with_status, object_key
from app.trainer.progress import DEFAULT_MAX_TRAINER_METRICS, TrainerProgress, json_metrics, trainer_progress
from app.trainer.projection_types import (
    MALFORMED,
    STEP_SHIFT,
    SUSPEND,
    ReplicatedJobParts,
    RuntimeProjection,
    TrainJobProjection,
    compact_rv,
    compact_uid,
    same_but_version,
    same_uid_text,
)
from app.trainer.wire import (
    ChildJobStatus,
    Condition,
    Container,
    JobMeta,
    JobStatus,
    JobStatusWithTrainer,
    ReplicatedJob,
    RuntimeWire,
    TrainerStatusWire,
    TrainJobStatusWire,
    TrainJobStatusWithTrainerWire,
    TrainJobWire,
    TrainJobWithTrainerWire,
)

# --- typed path: reading the wire structs ------------------------------------------------------


def _wire_replicated_jobs(replicated: list[ReplicatedJob]) -> Iterable[ReplicatedJobParts]:
    for rj in replicated:
        template = rj.template
        labels = template.metadata.labels if template is not None and template.metadata is not None else None
        containers: list[Container] = []
        parallelism = None
        if template is not None and template.spec is not None:
            parallelism = template.spec.parallelism
            if template.spec.template is not None:
                pod_spec = template.spec.template.spec
                containers = (pod_spec.containers or []) if pod_spec is not None else []
        yield (
            rj.name,
            labels,
            parallelism,
            (
                (c.name, (c.resources.requests, c.resources.limits) if c.resources is not None else None)
                for c in containers
            ),
        )


# --- tolerant path: walking the generic JSON ---------------------------------------------------


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


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _json_condition(cond: Mapping[Any, Any]) -> Condition:
    """The wire Condition the rules read, from any JSON object. A value of the wrong type becomes
    what it is equivalent to: a non-string type, status or reason matches no rule and reads as "";
    a non-string lastTransitionTime is unparsable, so it becomes "" (parsed as None, and flagged
    malformed if it is the terminal condition's, as an unparsable string is)."""
    ltt = cond.get("lastTransitionTime")
    return Condition(
        _text(cond.get("type")),
        _text(cond.get("status")),
        _text(cond.get("reason")),
        ltt if ltt is None or isinstance(ltt, str) else "",
    )


def _json_replicated_jobs(replicated: object) -> Iterable[ReplicatedJobParts]:
    for rj in _list(replicated):
        containers = _list(_get(rj, "template", "spec", "template", "spec", "containers"))
        yield (
            _get(rj, "name"),
            _get(rj, "template", "metadata", "labels"),
            _get(rj, "template", "spec", "parallelism"),
            ((_get(c, "name"), _json_resources(_get(c, "resources"))) for c in containers),
        )


# --- projectors --------------------------------------------------------------------------------

_NO_RUNTIMES: Final[Mapping[str, RuntimeProjection]] = MappingProxyType({})
_STEPS: Final = rules.STEP_SETS
_NO_STEPS: Final[Mapping[bytes | str, int]] = MappingProxyType({})


class TrainJobProjector:
    """``Projector[TrainJobProjection]`` for the TrainJob informer.

    Incremental: ``from_wire(wire, previous)`` reuses the spec part of the cached projection of the
    same object (``previous``, found by ``wire_key``) when its uid and ``metadata.generation`` are
    unchanged (the API server bumps generation on every spec change; a status write, i.e. nearly
    every watch event, leaves it alone), so an update re-derives only the status part. The result
    equals a full projection whenever the spec is unchanged. The informer decodes a watch line of a cached
    object into ``status_wire_type`` first (no spec at all) and calls ``from_status_wire``; only when that
    says the spec may have changed does it decode the whole object for ``from_wire``.

    ``trainer_status``: also project ``status.trainerStatus`` (for the per-TrainJob series, keeping at most
    ``max_trainer_metrics`` metrics per job). Off, the wire type does not even declare it, so msgspec skips
    it unread.

    ``runtimes``: the runtimes by ref label, live (``TrainerState.runtimes_by_ref``): a job is running when a
    child Job of its training step is ready (rules.training_ready). The step is resolved from the job's
    runtime the first time the runtime is known, then kept in the projection and carried from each projection
    of the job to the next (field_builders.resolve_step): a runtime edited or deleted later does not change
    it, as it does not change what the controller runs. Without ``runtimes`` every job is read by the
    controller's naming (rules.FALLBACK_TRAINING_JOBS). ``steps``: training steps by uid key read from the
    Lease (``TrainerState.inherited_steps``, app/trainer/snapshots.py), which resolve a job before its runtime
    does: the step another replica resolved before the runtime changed.
    """

    wire_type: type = TrainJobWire
    status_wire_type: type = TrainJobStatusWire

    def __init__(
        self,
        *,
        runtimes: Mapping[str, RuntimeProjection] | None = None,
        steps: Mapping[bytes | str, int] | None = None,
        trainer_status: bool = False,
        max_trainer_metrics: int = DEFAULT_MAX_TRAINER_METRICS,
    ) -> None:
        self.runtimes: Mapping[str, RuntimeProjection] = _NO_RUNTIMES if runtimes is None else runtimes
        self.steps: Mapping[bytes | str, int] = _NO_STEPS if steps is None else steps
        self.trainer_status = trainer_status
        self.max_trainer_metrics = max(0, max_trainer_metrics)
        if trainer_status:
            self.wire_type = TrainJobWithTrainerWire
            self.status_wire_type = TrainJobStatusWithTrainerWire

    def _wire_progress(self, status: object) -> TrainerProgress | None:
        """The trainerStatus of a typed status (only called with ``trainer_status`` on)."""
        ts: TrainerStatusWire | None = cast(JobStatusWithTrainer, status).trainerStatus
        if ts is None:
            return None
        return trainer_progress(
            ts.progressPercentage,
            ts.estimatedRemainingSeconds,
            ts.lastUpdatedTime,
            ((m.name, m.value) for m in ts.metrics or ()),
            self.max_trainer_metrics,
        )

    def _wire_status(
        self, status: JobStatus | None
    ) -> tuple[list[Condition] | None, list[ChildJobStatus] | None, TrainerProgress | None]:
        """The conditions, jobsStatus and (per-TrainJob series on) trainer progress of a typed status."""
        if status is None:
            return None, None, None
        progress = self._wire_progress(status) if self.trainer_status else None
        return status.conditions, status.jobsStatus, progress

    def wire_key(self, wire: Any) -> str:
        """The cache key the projection of ``wire`` will have (to look ``previous`` up)."""
        meta: JobMeta = wire.metadata
        return object_key(meta.namespace, meta.name)

    @staticmethod
    def wire_rv(wire: Any) -> str:
        """``metadata.resourceVersion`` as sent."""
        rv: str = wire.metadata.resourceVersion
        return rv

    @staticmethod
    def same_uid(a: TrainJobProjection, b: TrainJobProjection) -> bool:
        """``a.uid == b.uid`` without rebuilding the strings."""
        same: bool = a.uid_key == b.uid_key
        return same

    @staticmethod
    def unchanged(a: TrainJobProjection, b: TrainJobProjection) -> bool:
        """The TrainerState need not hear of ``b``: the same resourceVersion (compared as stored: equal
        strings are stored equal, compact_rv), or a new one whose projection is the same in every other
        field (a status write of something no rule reads: trainer progress while the per-TrainJob series are
        off, a heartbeat, a label). Nothing the rules read can differ then, so they are skipped."""
        return bool(a.rv == b.rv or same_but_version(a, b))

    def from_status_wire(self, wire: Any, previous: TrainJobProjection) -> TrainJobProjection | None:
        """The projection of an update of ``previous`` from its metadata and status alone (``wire``: a
        ``status_wire_type`` or a ``wire_type``), when the spec is the cached one: the same key, uid and
        generation (the API server bumps ``metadata.generation`` on every spec write). None when it may
        not be (the caller projects the whole object, ``from_wire``)."""
        if previous.flags & MALFORMED:
            return None
        meta = wire.metadata
        generation = meta.generation
        if generation is None or generation != previous.generation:
            return None
        ns = meta.namespace
        # _key inlined: this runs on nearly every watch event
        if (f"{ns}/{meta.name}" if ns else meta.name) != previous.key:
            return None
        uid = previous.uid_key
        if not same_uid_text(uid, meta.uid):
            return None
        conditions, jobs, progress = self._wire_status(wire.status)
        # rules.training_ready over the typed entries, inlined for the same reason: no pairs built, and the
        # step looked up only once an entry is ready (never for a job whose pods all wait).
        flags = previous.flags
        step = flags >> STEP_SHIFT
        if not step:  # not resolved yet: its runtime may have arrived since (field_builders.resolve_step)
            step = self.steps.get(uid, 0) if self.steps else 0
            runtime = self.runtimes.get(previous.runtime_ref) if not step else None
            if runtime is not None:
                step = rules.step_id(runtime.training_jobs)
        ready = False
        if jobs:
            training: frozenset[str] | None = None
            for j in jobs:
                count = j.ready
                if count is not None and count > 0:
                    if training is None:
                        training = _STEPS[step]
                    if j.name in training:
                        ready = True
                        break
        return job_with_status(
            previous.key,
            uid,
            previous.namespace,
            compact_rv(meta.resourceVersion),
            previous.created,
            previous.runtime_ref,
            previous.num_nodes,
            previous.resources,
            generation,
            (flags & SUSPEND) | step << STEP_SHIFT,  # spec.suspend, part of the unchanged spec; the step
            conditions,
            ready,
            progress,
        )

    def from_wire(self, wire: Any, previous: TrainJobProjection | None = None) -> TrainJobProjection:
        step = 0
        if previous is not None:
            updated = self.from_status_wire(wire, previous)
            if updated is not None:
                return updated
            if same_uid_text(previous.uid_key, wire.metadata.uid):
                step = previous.step  # the same job: resolved once (a new uid is a new job)
        if not step and self.steps:
            step = self.steps.get(compact_uid(wire.metadata.uid), 0)
        w: TrainJobWire = wire
        meta = w.metadata
        spec = w.spec
        conditions, jobs, progress = self._wire_status(w.status)
        ref = spec.runtimeRef if spec is not None else None
        trainer = spec.trainer if spec is not None else None
        rpn = trainer.resourcesPerNode if trainer is not None else None
        return build_job(
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
            jobs_status=[(j.name, j.ready) for j in jobs] if jobs else (),
            runtimes=self.runtimes,
            malformed=False,  # name and uid are non-empty (wire.JobMeta)
            progress=progress,
            step=step,
        )

    def from_json(self, obj: Any) -> TrainJobProjection | None:
        try:
            return self.salvage(obj)
        except Exception:  # never let one object break an informer; the caller logs the drop
            return None

    def salvage(self, obj: object) -> TrainJobProjection | None:
        """``from_json`` without its safety net: it should never raise either, and tests check that
        it does not (``from_json`` would turn a bug here into a silently dropped object)."""
        name, uid = _get(obj, "metadata", "name"), _get(obj, "metadata", "uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            return None
        namespace = _get(obj, "metadata", "namespace")
        malformed = not isinstance(namespace, str)
        conditions: list[Condition] = []
        status_conditions = _get(obj, "status", "conditions")
        if status_conditions is not None and not isinstance(status_conditions, list):
            malformed = True
        for cond in _list(status_conditions):
            if isinstance(cond, Mapping):
                conditions.append(_json_condition(cond))
            else:
                malformed = True
        status = _get(obj, "status")
        if status is not None and not isinstance(status, Mapping):
            malformed = True
        jobs_status: list[tuple[object, object]] = []
        for child in _list(_get(obj, "status", "jobsStatus")):
            child_name, count = _get(child, "name"), _get(child, "ready")
            if (count is not None and (not isinstance(count, int | float) or isinstance(count, bool))) or (
                child_name is not None and not isinstance(child_name, str)
            ):
                malformed = True  # rules.training_ready reads neither as ready
            jobs_status.append((child_name, count))
        rv = _get(obj, "metadata", "resourceVersion")
        malformed |= not isinstance(rv, str)
        progress = None
        if self.trainer_status:
            ts = _get(obj, "status", "trainerStatus")
            if isinstance(ts, Mapping):
                progress = trainer_progress(
                    ts.get("progressPercentage"),
                    ts.get("estimatedRemainingSeconds"),
                    ts.get("lastUpdatedTime"),
                    json_metrics(ts.get("metrics")),
                    self.max_trainer_metrics,
                )
        return build_job(
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
            jobs_status=jobs_status,
            runtimes=self.runtimes,
            malformed=malformed,
            progress=progress,
            step=self.steps.get(compact_uid(uid), 0) if self.steps else 0,
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
        replicated: list[ReplicatedJob] = []
        if spec is not None and spec.template is not None and spec.template.spec is not None:
            replicated = spec.template.spec.replicatedJobs or []
        return build_runtime(
            kind=self.kind,
            namespaced=self.namespaced,
            name=meta.name,
            uid=meta.uid,
            namespace=meta.namespace,
            resource_version=meta.resourceVersion,
            labels=meta.labels,
            ml_policy_obj=spec.mlPolicy if spec is not None else None,
            pod_group_policy_obj=spec.podGroupPolicy if spec is not None else None,
            replicated_jobs=_wire_replicated_jobs(replicated),
            malformed=False,  # name and uid are non-empty (wire.RuntimeMeta)
        )

    def from_json(self, obj: Any) -> RuntimeProjection | None:
        try:
            return self.salvage(obj)
        except Exception:  # never let one object break an informer
            return None

    def salvage(self, obj: object) -> RuntimeProjection | None:
        """``from_json`` without its safety net (see ``TrainJobProjector.salvage``)."""
        name, uid = _get(obj, "metadata", "name"), _get(obj, "metadata", "uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            return None
        return build_runtime(
            kind=self.kind,
            namespaced=self.namespaced,
            name=name,
            uid=uid,
            namespace=_get(obj, "metadata", "namespace"),
            resource_version=_get(obj, "metadata", "resourceVersion"),
            labels=_get(obj, "metadata", "labels"),
            ml_policy_obj=_get(obj, "spec", "mlPolicy"),
            pod_group_policy_obj=_get(obj, "spec", "podGroupPolicy"),
            replicated_jobs=_json_replicated_jobs(_get(obj, "spec", "template", "spec", "replicatedJobs")),
            malformed=False,
        )


TRAINJOB_PROJECTOR: Final = TrainJobProjector()
TRAINING_RUNTIME_PROJECTOR: Final = RuntimeProjector(rules.TRAINING_RUNTIME_KIND)
CLUSTER_TRAINING_RUNTIME_PROJECTOR: Final = RuntimeProjector(rules.CLUSTER_TRAINING_RUNTIME_KIND)
