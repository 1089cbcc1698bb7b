"""Builders of the compact projections (app/trainer/projection_types.py) from field values: both decoding
paths (the typed wire structs and the tolerant JSON path, app/trainer/informer_projectors.py) end here, so
they agree on every well-formed object. The Trainer rules they apply live in app/trainer/rules/.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from app.trainer import rules
from app.trainer.progress import TrainerProgress
from app.trainer.projection_types import (
    _MAX_REASON,
    BAD_NAMESPACE,
    MALFORMED,
    READY,
    RESUMED,
    STEP_SHIFT,
    SUSPEND,
    SUSPENDED_CONDITION,
    JobExtra,
    ReplicatedJobParts,
    RuntimeProjection,
    TrainJobProjection,
    compact_rv,
    compact_uid,
    shared_flags,
)
from app.trainer.wire import Condition

__all__ = [
    "RuntimeTrainer",
    "build_job",
    "build_runtime",
    "job_with_status",
    "object_key",
    "resolve_step",
    "runtime_trainer",
]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def object_key(namespace: str, name: str) -> str:
    """The informer's cache key: "namespace/name", or "name" for a cluster-scoped object."""
    return f"{namespace}/{name}" if namespace else name


def split_key(key: str) -> tuple[str, str]:
    """(namespace, name) of an ``object_key`` (names and namespaces have no "/")."""
    namespace, cut, name = key.partition("/")
    return (namespace, name) if cut else ("", key)


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
    MALFORMED bits, and its training step's id above STEP_SHIFT), with the status part derived from
    ``conditions``, ``ready`` and ``progress`` (the trainerStatus, None unless the per-TrainJob series are
    on). An incremental update (nearly every watch event) comes straight here with the cached projection's
    spec part.
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
    if flags > 256:
        flags = shared_flags(flags)
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


def resolve_step(runtimes: Mapping[str, RuntimeProjection], runtime_ref: str, step: int) -> int:
    """The id of a job's training step (rules.STEP_SETS): ``step``, the one it was resolved with, once it
    was; else that of the runtime ``runtime_ref`` names (``runtimes``: by ref label) now; else 0, not
    resolved (the runtime not listed yet, deleted before the job was seen, or a reference to nothing),
    which reads by the controller's naming (rules.FALLBACK_TRAINING_JOBS: ``node`` and ``launcher``).

    Resolved once, as the controller does: at a TrainJob's first reconcile it copies the runtime into the
    ``<trainjob>-runtime-snapshot`` ConfigMap and builds from that copy ever after (kubeflow/trainer v2.3.0
    ``pkg/runtime/core/snapshot.go``; ``trainingruntime.go`` and ``clustertrainingruntime.go`` NewObjects read
    the snapshot before the live runtime), while the runtime itself may be edited or deleted under the job
    (``pkg/webhooks/trainingruntime_webhook.go`` ValidateUpdate accepts any edit; no finalizer). A job whose
    runtime was not known is resolved at its first event after the runtime arrives."""
    if step:
        return step
    runtime = runtimes.get(runtime_ref)
    return rules.step_id(runtime.training_jobs) if runtime is not None else 0


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
    jobs_status: Iterable[tuple[object, object]],
    runtimes: Mapping[str, RuntimeProjection],
    malformed: bool,
    progress: TrainerProgress | None = None,
    step: int = 0,
) -> TrainJobProjection:
    """A TrainJob's projection from its fields as found (of any JSON type): an unusable value takes
    its default and sets MALFORMED, as does ``malformed`` (the caller's own findings).

    ``jobs_status``: (name, ready) of each ``status.jobsStatus`` entry; the job is running when one of its
    training-step jobs is ready: ``step``, the step it was resolved with (its previous projection's), or
    else its runtime's as ``runtimes`` has it now (``resolve_step``)."""
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
    step = resolve_step(runtimes, runtime_ref, step)
    ready = rules.training_ready(jobs_status, rules.STEP_SETS[step])
    rv = resource_version if isinstance(resource_version, str) else ""
    namespace = sys.intern(namespace)
    bad_namespace = not rules.is_dns_label(namespace)  # a real API server only sends DNS labels
    flags = (
        (SUSPEND if suspend is True else 0)
        | (BAD_NAMESPACE if bad_namespace else 0)
        | (MALFORMED if malformed or bad_namespace else 0)
        | step << STEP_SHIFT
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


class RuntimeTrainer(NamedTuple):
    """What a runtime's JobSet template says of its training step (``runtime_trainer``)."""

    nodes: rules.NodeRule
    resources: rules.NodeResources  # the trainer ``node`` container's requests and limits
    merges: bool  # a TrainJob's resourcesPerNode merges into them
    training_jobs: frozenset[str]
    malformed: bool


def runtime_trainer(replicated_jobs: Iterable[ReplicatedJobParts], ml_policy_obj: object) -> RuntimeTrainer:
    """The training step of a runtime's JobSet template, read as the controller reads it (kubeflow/trainer
    v2.3.0 ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo and the EnforceMLPolicy plugins).

    - How many nodes train: rules.node_rule over every replicated job's PodSet count.
    - The resources come from the ``node`` container of the first replicated job named ``node`` or
      labelled ancestor ``trainer`` (the controller's own ``ExtractResourcePerNodeFromRuntime`` in
      ``pkg/runtime/runtime.go``, and #4190's choice; for MPI runtimes with ``runLauncherAsNode`` this
      is the ``node`` worker job, into which the controller merges resourcesPerNode as into the
      launcher). Runtime patches (``spec.runtimePatches``) are not applied.
    - Which jobs are the training step: rules.training_jobs.
    """
    malformed = False
    pod_sets: list[rules.PodSetParts] = []
    labelled: list[tuple[object, object]] = []
    resources: tuple[rules.NodeResources, bool] | None = None  # (resources, merges)
    for job_name, labels, parallelism, containers in replicated_jobs:
        ancestor = rules.is_trainer_ancestor(labels)
        count, bad = rules.coerce_count(parallelism)
        malformed |= bad
        pod_sets.append((job_name, ancestor, count))
        labelled.append((job_name, labels))
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
    mpi = rules.is_mpi(ml_policy_obj)
    nodes = rules.node_rule(
        pod_sets,
        has_ml_policy=ml_policy_obj is not None,
        ml_policy_num_nodes=rules.runtime_num_nodes(ml_policy_obj)[0],
        mpi=mpi,
        launcher_as_node=rules.run_launcher_as_node(ml_policy_obj),
    )
    res, merges = resources if resources is not None else (rules.NO_RESOURCES, False)
    return RuntimeTrainer(nodes, res, merges, rules.training_jobs(labelled, mpi), malformed)


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
    trainer = runtime_trainer(replicated_jobs, ml_policy_obj)
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
        nodes=trainer.nodes,
        training_jobs=trainer.training_jobs,
        node_resources=trainer.resources,
        merges_job_resources=trainer.merges,
        malformed=malformed or trainer.malformed,
    )
