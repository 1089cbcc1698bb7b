"""The pods of TrainJobs, projected: what the pods watch caches per pod, and its ``Projector``.

A pod's JSON is 5-20 KB; its projection keeps what the pod series read (app/metrics/pods.py): its JobSet
(hence TrainJob) name, replicated job and restart attempt from JobSet's labels, the node it is bound to, its
phase, the devices it holds as the scheduler counts them (app/trainer/rules/pods.py), and the reasons a
failed pod gives (its status' reason, its failed container's termination reason).

Two ways in, one result, as for the TrainJobs (app/trainer/informer_projectors.py): the typed path
(msgspec into app/trainer/pod_wire.py) and the tolerant ``from_json``, which salvages what it can of an
object the typed decoder rejects and returns None only without a name or uid. Both end in ``build_pod``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final, TypeVar

import msgspec

from app.kube.resources import ResourceKind
from app.trainer import rules
from app.trainer.field_builders import object_key, split_key
from app.trainer.pod_wire import PodContainer, PodLabels, PodWire
from app.trainer.projection_types import (
    BAD_NAMESPACE,
    TrainJobProjection,
    compact_rv,
    compact_uid,
    rv_text,
    uid_text,
)

PODS: Final = ResourceKind("", "v1", "pods", "Pod", namespaced=True)

# PodProjection.flags bits
MALFORMED: Final = 1  # some field was unusable and a default was taken instead
IMPLAUSIBLE: Final = 2  # a device count above rules.MAX_ACCELERATORS_PER_NODE: its devices are not believed

_MAX_TEXT: Final = rules.MAX_REASON_LABEL  # a reason longer than this is cut (it only feeds a bounded label)
_SIDECAR: Final = "Always"
# One tuple per distinct set of devices held (pods of one template hold the same: ~100 B a pod saved), at
# most this many kept; beyond them each pod keeps its own.
MAX_SHARED: Final = 4096
_SHARED_DEVICES: dict[rules.Devices, rules.Devices] = {}
# A pod's (replicated job, restart attempt, flags, phase, devices): one tuple per distinct value, as for
# the devices.
PodTraits = tuple[str, int | None, int, str, rules.Devices]
_SHARED_TRAITS: dict[PodTraits, PodTraits] = {}
_Value = TypeVar("_Value", bound=Hashable)


def shared(table: dict[_Value, _Value], value: _Value) -> _Value:
    """``value`` as one object per distinct value kept in ``table`` (at most ``MAX_SHARED``, then its own)."""
    kept = table.get(value)
    if kept is not None:
        return kept
    if len(table) < MAX_SHARED:
        table[value] = value
    return value


def _shared(devices: rules.Devices) -> rules.Devices:
    return shared(_SHARED_DEVICES, devices)


class PodFailure(msgspec.Struct, frozen=True, gc=False):
    """What only a Failed pod keeps: all the failure edge reads (app/trainer/pod_failures.py: once per uid,
    at the rv it failed at, with its reasons) and nothing else does. Any other pod keeps none (~110 B a pod
    less): the informer resumes from the stream's rv (``PodProjector.wire_rv``), and a pod deleted and
    created again under its name while the watch was down is told as an update, which the pod series take
    as they would a delete and an add (they are a function of the pods cached)."""

    uid: bytes | str  # metadata.uid as compact_uid stores it (16 bytes for a UUID)
    rv: int | str  # metadata.resourceVersion as compact_rv stores it (an int when decimal)
    status_reason: str  # status.reason (Evicted, DeadlineExceeded, ...), cut to 64 characters
    # state.terminated.reason of the first container that ended with a non-zero exit code (OOMKilled, Error)
    container_reason: str


class PodProjection(msgspec.Struct, frozen=True, gc=False):
    """What the pod series need of one pod (immutable; an update yields a new projection). Built by
    ``build_pod`` only. ``uid`` and ``resource_version`` read as strings (the informer's ``KubeObject``
    contract), "" but for a Failed pod (``failure``); ``uid_key`` and ``rv`` are the stored values (equal
    strings always give equal stored values, as a TrainJob's: app/trainer/projection_types.py)."""

    key: str  # "namespace/name"
    # The key of the TrainJob its jobset-name label names, "namespace/jobset" ("namespace/" without the
    # label): the cached TrainJob's own key string when there is one, else interned, so that a job's pods
    # and its join record share one string (~75 B a job) and the join needs no (namespace, name) tuple.
    trainjob_key: str
    # (replicatedjob-name label or "", restart-attempt label or None when absent or not JobSet's integer,
    # MALFORMED | IMPLAUSIBLE, status.phase, the devices held): the same for most pods of a job, so one
    # tuple per distinct value (``shared``): with the namespace and the JobSet name derived, six slots
    # (64 B), not eleven.
    traits: PodTraits
    node: str  # spec.nodeName ("" while unbound)
    created: float | None  # creationTimestamp, epoch seconds
    failure: PodFailure | None = None  # a Failed pod's (None otherwise)

    @property
    def replicated_job(self) -> str:
        """The replicatedjob-name label ("" when absent)."""
        return self.traits[0]

    @property
    def restart_attempt(self) -> int | None:
        """The restart-attempt label (None when absent or not JobSet's integer)."""
        return self.traits[1]

    @property
    def flags(self) -> int:
        """MALFORMED | IMPLAUSIBLE."""
        return self.traits[2]

    @property
    def phase(self) -> str:
        """status.phase ("Pending" when absent)."""
        return self.traits[3]

    @property
    def devices(self) -> rules.Devices:
        """Held while bound and not finished (rules.pod_devices), shared (``_shared``)."""
        return self.traits[4]

    @property
    def uid_key(self) -> bytes | str | None:
        failure = self.failure
        return None if failure is None else failure.uid

    @property
    def rv(self) -> int | str | None:
        failure = self.failure
        return None if failure is None else failure.rv

    @property
    def uid(self) -> str:
        failure = self.failure
        return "" if failure is None else uid_text(failure.uid)

    @property
    def resource_version(self) -> str:
        failure = self.failure
        return "" if failure is None else rv_text(failure.rv)

    @property
    def status_reason(self) -> str:
        failure = self.failure
        return "" if failure is None else failure.status_reason

    @property
    def container_reason(self) -> str:
        failure = self.failure
        return "" if failure is None else failure.container_reason

    @property
    def namespace(self) -> str:
        # Derived rather than stored, as the name: a slot and a string less per pod.
        return split_key(self.key)[0]

    @property
    def name(self) -> str:
        return split_key(self.key)[1]

    @property
    def jobset(self) -> str:
        """The jobset-name label: its TrainJob's name ("" when absent)."""
        return split_key(self.trainjob_key)[1]

    @property
    def holds_node(self) -> bool:
        return rules.holds_node(self.node, self.phase)

    @property
    def malformed(self) -> bool:
        return bool(self.flags & MALFORMED)

    @property
    def implausible(self) -> bool:
        return bool(self.flags & IMPLAUSIBLE)


# The cached TrainJob of a namespace and name, or None: the TrainJob informers' caches themselves
# (app/replica/pods.py). The pod series and the pod-failure edges read the TrainJobs there rather than keep a
# copy of each: a TrainJob, most of which never has a pod cached, costs them nothing.
TrainJobLookup = Callable[[str, str], TrainJobProjection | None]


def pod_trainjob(jobs: TrainJobLookup, namespace: str, jobset: str) -> TrainJobProjection | None:
    """The cached TrainJob named ``jobset`` (a pod's jobset-name label) in ``namespace``, if a pod can name
    it: its name is a DNS label, as a JobSet's is (the JobSet is named after its TrainJob), in a namespace a
    real API server would send. Whether the pod is not older than it is the caller's to check."""
    if not jobset:
        return None
    job = jobs(namespace, jobset)
    return job if job is not None and nameable_by_pods(job) else None


def nameable_by_pods(job: TrainJobProjection) -> bool:
    """A pod's labels can name ``job``: its name is a DNS label and its namespace one a real API server
    would send."""
    return not job.flags & BAD_NAMESPACE and rules.is_dns_label(job.name)


def _same_but_version(a: PodProjection, b: PodProjection) -> bool:
    fa, fb = a.failure, b.failure
    return (
        a.node == b.node
        and a.traits == b.traits
        and a.trainjob_key == b.trainjob_key
        and a.created == b.created
        and a.key == b.key
        and (
            fa is fb
            or (
                fa is not None
                and fb is not None
                and fa.uid == fb.uid
                and fa.status_reason == fb.status_reason
                and fa.container_reason == fb.container_reason
            )
        )
    )


def _text(value: object) -> tuple[str, bool]:
    """(the string, malformed): a non-string is "" and malformed, None "" and not."""
    if isinstance(value, str):
        return value, False
    return "", value is not None


def _intern(value: object, limit: int | None = None) -> tuple[str, bool]:
    """``_text``, interned; ``limit`` cuts a long one."""
    text, bad = _text(value)
    if limit is not None and len(text) > limit:
        text = text[:limit]
    return _interned(text), bad


def _interned(text: str) -> str:
    return sys.intern(text) if len(text) <= 253 else text


def _shared_job_key(text: str, namespace: str, jobset: str, jobs: TrainJobLookup | None) -> str:
    """``text`` (a pod's ``trainjob_key``) as the cached TrainJob's own key string, else interned."""
    if jobset and jobs is not None:
        job = jobs(namespace, jobset)
        if job is not None and job.key == text:
            return job.key
    return _interned(text)


# (requests, limits, sidecar) of one container, as found on either path
ContainerParts = tuple[object, object, bool]


def build_pod(
    *,
    matcher: rules.AcceleratorMatcher,
    name: str,
    uid: str,
    namespace: object,
    resource_version: object,
    creation_timestamp: object,
    labels: object,  # a Mapping (the tolerant path) or the wire's PodLabels
    node: object,
    phase: object,
    containers: Iterable[ContainerParts],
    init_containers: Iterable[ContainerParts],
    status_reason: object,
    container_reason: object,
    malformed: bool,
    previous: PodProjection | None = None,
    jobs: TrainJobLookup | None = None,
) -> PodProjection:
    """The projection of one pod from its field values, whichever path read them. ``previous``: the
    cached projection of the same key, whose key and uid objects the new one shares when equal (one
    string a pod, not one per version); returned itself when nothing read differs (a relist of an unchanged
    pod keeps the cached object, which the pod series hold too). ``jobs``: the cached TrainJobs, whose key
    string the pod's ``trainjob_key`` shares."""
    bad = malformed
    ns, b = _intern(namespace)
    bad |= b
    rv, b = _text(resource_version)  # unique to the object: not interned
    bad |= b
    jobset: object = None
    replicated: object = None
    attempt_text: object = None
    if isinstance(labels, PodLabels):
        jobset, replicated, attempt_text = labels.jobset_name, labels.replicated_job, labels.restart_attempt
    elif isinstance(labels, Mapping):
        jobset = labels.get(rules.JOBSET_NAME_LABEL)
        replicated = labels.get(rules.REPLICATED_JOB_LABEL)
        attempt_text = labels.get(rules.RESTART_ATTEMPT_LABEL)
    elif labels is not None:
        bad = True
    jobset_name, b = _text(jobset)
    bad |= b
    replicated_job, b = _intern(replicated)
    bad |= b
    attempt, b = rules.restart_attempt(attempt_text)
    bad |= b
    node_name, b = _intern(node)
    bad |= b
    phase_text, b = _intern(phase)
    bad |= b
    flags = 0
    app_devices: list[rules.Devices] = []
    init_devices: list[tuple[rules.Devices, bool]] = []
    for target, parts in ((app_devices, containers), (init_devices, init_containers)):
        for requests, limits, sidecar in parts:
            resources, b = rules.node_resources(requests, limits)
            bad |= b
            devices = matcher.per_node(resources)
            if any(count > rules.MAX_ACCELERATORS_PER_NODE for _, count in devices):
                flags |= IMPLAUSIBLE
            if target is app_devices:
                app_devices.append(devices)
            else:
                init_devices.append((devices, sidecar))
    devices = (
        _shared(rules.pod_devices(app_devices, init_devices))
        if app_devices or init_devices
        else rules.NO_DEVICES
    )
    reason, b = _intern(status_reason, _MAX_TEXT)
    bad |= b
    failed_container, b = _intern(container_reason, _MAX_TEXT)
    bad |= b
    if bad:
        flags |= MALFORMED
    key = object_key(ns, name)
    trainjob_key = object_key(ns, jobset_name) if jobset_name else (f"{ns}/" if ns else "")
    phase_text = phase_text or rules.PENDING_PHASE
    if previous is not None and previous.key == key:
        key = previous.key
    if previous is not None and previous.trainjob_key == trainjob_key:
        trainjob_key = previous.trainjob_key
    else:
        trainjob_key = _shared_job_key(trainjob_key, ns, jobset_name, jobs)
    failure = None
    if phase_text == rules.FAILED_PHASE:
        uid_key = compact_uid(uid)
        if previous is not None and previous.uid_key == uid_key:
            uid_key = previous.uid_key
        failure = PodFailure(uid_key, compact_rv(rv), reason, failed_container)
    pod = PodProjection(
        key=key,
        trainjob_key=trainjob_key,
        traits=shared(_SHARED_TRAITS, (replicated_job, attempt, flags, phase_text, devices)),
        node=node_name,
        created=rules.parse_time(creation_timestamp),
        failure=failure,
    )
    if previous is not None and _same_but_version(previous, pod):
        return previous
    return pod


# --- tolerant path helpers ----------------------------------------------------------------------------


def _get(obj: object, *path: str) -> object:
    """obj[path[0]][path[1]]...; None as soon as a step is not a JSON object or lacks the key."""
    for step in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(step)
    return obj


def _json_containers(value: object) -> tuple[list[ContainerParts], bool]:
    """(containers, malformed) of a JSON containers list."""
    if value is None:
        return [], False
    if not isinstance(value, list):
        return [], True
    bad = False
    parts: list[ContainerParts] = []
    for container in value:
        if not isinstance(container, Mapping):
            bad = True
            continue
        resources = container.get("resources")
        if resources is not None and not isinstance(resources, Mapping):
            bad = True
            resources = None
        policy = container.get("restartPolicy")
        parts.append((_get(resources, "requests"), _get(resources, "limits"), policy == _SIDECAR))
    return parts, bad


def _json_failed_container(statuses: object) -> object:
    for status in statuses if isinstance(statuses, list) else ():
        terminated = _get(status, "state", "terminated")
        code = _get(terminated, "exitCode")
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return _get(terminated, "reason")
    return None


def _wire_containers(containers: list[PodContainer] | None) -> Iterable[ContainerParts]:
    for c in containers or ():
        r = c.resources
        yield (
            (r.requests, r.limits, c.restartPolicy == _SIDECAR)
            if r is not None
            else (None, None, c.restartPolicy == _SIDECAR)
        )


class PodProjector:
    """``Projector[PodProjection]`` for the pods watch; ``matcher`` says which resources are devices
    (``accelerator_resource_patterns``, as for the requested accelerators); ``jobs``: the cached TrainJobs
    (``build_pod``)."""

    wire_type: type = PodWire

    def __init__(
        self, matcher: rules.AcceleratorMatcher | None = None, jobs: TrainJobLookup | None = None
    ) -> None:
        self.matcher = matcher if matcher is not None else rules.DEFAULT_ACCELERATORS
        self.jobs = jobs

    @staticmethod
    def unchanged(a: PodProjection, b: PodProjection) -> bool:
        """The pod series need not hear of ``b``: the same object, or a status write of something they do
        not read (conditions, container states of running containers, IPs). Not by resourceVersion: only a
        Failed pod keeps one."""
        return a is b or _same_but_version(a, b)

    @staticmethod
    def wire_rv(wire: Any) -> str:
        """The resourceVersion of ``wire`` as sent: where the informer resumes (the projection keeps it
        only for a Failed pod)."""
        rv = wire.metadata.resourceVersion
        return rv if isinstance(rv, str) else ""

    @staticmethod
    def wire_key(wire: Any) -> str:
        """The cache key the projection of ``wire`` will have (the informer looks ``previous`` up)."""
        meta = wire.metadata
        return object_key(meta.namespace, meta.name)

    def from_wire(self, wire: Any, previous: PodProjection | None = None) -> PodProjection:
        w: PodWire = wire
        meta, spec, status = w.metadata, w.spec, w.status
        failed = None
        if status is not None:
            for cs in status.containerStatuses or ():
                terminated = cs.state.terminated if cs.state is not None else None
                if terminated is not None and terminated.exitCode != 0:
                    failed = terminated.reason
                    break
        return build_pod(
            matcher=self.matcher,
            name=meta.name,
            uid=meta.uid,
            namespace=meta.namespace,
            resource_version=meta.resourceVersion,
            creation_timestamp=meta.creationTimestamp,
            labels=meta.labels,
            node=spec.nodeName if spec is not None else None,
            phase=status.phase if status is not None else None,
            containers=_wire_containers(spec.containers if spec is not None else None),
            init_containers=_wire_containers(spec.initContainers if spec is not None else None),
            status_reason=status.reason if status is not None else None,
            container_reason=failed,
            malformed=False,
            previous=previous,
            jobs=self.jobs,
        )

    def from_json(self, obj: Any) -> PodProjection | None:
        try:
            return self.salvage(obj)
        except Exception:  # never let one object break an informer; the caller counts the drop
            return None

    def salvage(self, obj: object) -> PodProjection | None:
        """``from_json`` without its safety net (tests check that it never raises either)."""
        name, uid = _get(obj, "metadata", "name"), _get(obj, "metadata", "uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            return None
        containers, bad_app = _json_containers(_get(obj, "spec", "containers"))
        init_containers, bad_init = _json_containers(_get(obj, "spec", "initContainers"))
        spec, status = _get(obj, "spec"), _get(obj, "status")
        bad = bad_app or bad_init
        bad |= spec is not None and not isinstance(spec, Mapping)
        bad |= status is not None and not isinstance(status, Mapping)
        return build_pod(
            matcher=self.matcher,
            name=name,
            uid=uid,
            namespace=_get(obj, "metadata", "namespace"),
            resource_version=_get(obj, "metadata", "resourceVersion"),
            creation_timestamp=_get(obj, "metadata", "creationTimestamp"),
            labels=_get(obj, "metadata", "labels"),
            node=_get(obj, "spec", "nodeName"),
            phase=_get(obj, "status", "phase"),
            containers=containers,
            init_containers=init_containers,
            status_reason=_get(obj, "status", "reason"),
            container_reason=_json_failed_container(_get(obj, "status", "containerStatuses")),
            malformed=bad,
            jobs=self.jobs,
        )
