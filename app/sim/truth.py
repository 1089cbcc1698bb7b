"""Ground truth for the workload generator: what the exporter's Trainer metrics should say.

Deliberately written from the design documents (product.md §3, trainer-domain.md §1-§3), NOT by importing
``app/trainer``: a test that compares the service against this module then checks two independent readings
of the same rules instead of the service's code against itself.

The generator feeds every object the store returns from its writes into ``Truth``; the truth then derives
everything from those stored objects, so what it counts is exactly what a watcher of the store can see.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final

TRAINER_GROUP: Final = "trainer.kubeflow.org"
TRAINING_RUNTIME: Final = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME: Final = "ClusterTrainingRuntime"
RUNTIME_KINDS: Final = frozenset({TRAINING_RUNTIME, CLUSTER_TRAINING_RUNTIME})
UNKNOWN_REF: Final = "unknown"

JOB_STATES: Final = ("suspended", "pending", "running", "succeeded", "failed")
# product.md §3: failure reasons kept as label values; every other reason becomes "other".
FAILURE_REASONS: Final = frozenset(
    {
        "TrainingRuntimeNotSupported",
        "DeadlineExceeded",
        "FailedJobs",
        "ReachedMaxRestarts",
        "FailJobSetFailurePolicyAction",
    }
)
NO_ACCELERATOR: Final = "none"

CreatedKey = tuple[str, str]  # (namespace, runtime_ref)
FinishedKey = tuple[str, str, str]  # (result, reason bucket, runtime_ref)
JobsKey = tuple[str, str, str]  # (namespace, runtime_ref, state)


# ---------------------------------------------------------------------------------------------------------
# Pure rules over plain JSON objects
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuntimeFacts:
    """What the rules need from one runtime: its default node count and its trainer's accelerators."""

    num_nodes: int | None  # spec.mlPolicy.numNodes, None when absent
    accelerator_class: str  # resource name containing "gpu", or "none"
    accelerators_per_node: int


RuntimeKey = tuple[str, str, str]  # (kind, namespace or "", name)

_BINARY_SUFFIXES: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes resource.Quantity as an exact fraction; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value) if math.isfinite(value) else None
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    for suffix, factor in _BINARY_SUFFIXES.items():
        if text.endswith(suffix):
            number = _parse_decimal(text[: -len(suffix)])
            return None if number is None else number * factor
    if text[-1] in _DECIMAL_SUFFIXES:
        number = _parse_decimal(text[:-1])
        return None if number is None else number * _DECIMAL_SUFFIXES[text[-1]]
    return _parse_decimal(text)  # plain number, possibly with an e/E exponent


def _parse_decimal(text: str) -> Fraction | None:
    if not text or text[-1] in "eE+-":
        return None
    try:
        return Fraction(text)  # accepts "1.5", "1e3", "+2", ".5"
    except (ValueError, ZeroDivisionError):
        return None


def quantity_value(value: Any) -> int | None:
    """Integer value of a quantity, rounded up like Go's ``Quantity.Value()``; None when unparsable."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit():  # the common case, without Fraction
        return int(value)
    parsed = parse_quantity(value)
    return None if parsed is None else math.ceil(parsed)


def accelerators_of(resources: Any) -> tuple[str, int] | None:
    """(class, per-node count) from a ResourceRequirements; None when it names no GPU resource.

    GPU resources are names whose lower-case form contains "gpu", read from ``requests``, or from
    ``limits`` when ``requests`` has none (extended-resource requests default to their limits).
    """
    if not isinstance(resources, dict):
        return None
    for section in ("requests", "limits"):
        found = _gpu_in(resources.get(section))
        if found is not None:
            return found
    return None


def _gpu_in(section: Any) -> tuple[str, int] | None:
    if not isinstance(section, dict):
        return None
    names = [name for name in section if isinstance(name, str) and "gpu" in name.lower()]
    if not names:
        return None
    name = min(names)  # two GPU kinds on one job: pick one deterministically (the generator never does)
    count = quantity_value(section[name])
    return name, max(count or 0, 0)


def runtime_facts(runtime: Mapping[str, Any]) -> RuntimeFacts:
    """Default node count and trainer accelerators of a (Cluster)TrainingRuntime object."""
    spec = _dict(runtime.get("spec"))
    ml_policy = spec.get("mlPolicy")
    num_nodes = ml_policy.get("numNodes") if isinstance(ml_policy, dict) else None
    found = _runtime_trainer_accelerators(spec)
    return RuntimeFacts(
        num_nodes=num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else None,
        accelerator_class=found[0] if found else NO_ACCELERATOR,
        accelerators_per_node=found[1] if found else 0,
    )


def _runtime_trainer_accelerators(spec: Mapping[str, Any]) -> tuple[str, int] | None:
    """GPUs of the trainer container: the ``node`` container of a replicated job named ``node`` or
    labelled ancestor ``trainer`` (trainer-domain.md §3, requested_accelerators details)."""
    jobset_spec = _dict(_dict(spec.get("template")).get("spec"))
    for replicated in _list(jobset_spec.get("replicatedJobs")):
        job = _dict(replicated)
        job_template = _dict(job.get("template"))
        ancestor = _dict(_dict(job_template.get("metadata")).get("labels")).get(
            "trainer.kubeflow.org/trainjob-ancestor-step"
        )
        if job.get("name") != "node" and ancestor != "trainer":
            continue
        pod_spec = _dict(_dict(_dict(job_template.get("spec")).get("template")).get("spec"))
        for container in _list(pod_spec.get("containers")):
            if _dict(container).get("name") == "node":
                found = accelerators_of(_dict(container).get("resources"))
                if found is not None:
                    return found
    return None


def runtime_key_of(runtime: Mapping[str, Any]) -> RuntimeKey:
    meta = _dict(runtime.get("metadata"))
    return str(runtime.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))


def runtime_ref_of(job: Mapping[str, Any]) -> tuple[str, RuntimeKey | None]:
    """(runtime_ref label, key of the runtime it names). A foreign group or kind gives ("unknown", None)."""
    spec = _dict(job.get("spec"))
    ref = _dict(spec.get("runtimeRef"))
    group = ref.get("apiGroup")
    kind = ref.get("kind")
    group = TRAINER_GROUP if group is None else group
    kind = CLUSTER_TRAINING_RUNTIME if kind is None else kind
    name = ref.get("name")
    if group != TRAINER_GROUP or kind not in RUNTIME_KINDS or not isinstance(name, str) or not name:
        return UNKNOWN_REF, None
    namespace = str(_dict(job.get("metadata")).get("namespace") or "") if kind == TRAINING_RUNTIME else ""
    return f"{group}/{kind}/{namespace}/{name}", (kind, namespace, name)


def requested_nodes(job: Mapping[str, Any], runtime: RuntimeFacts | None) -> int:
    """spec.trainer.numNodes ?? runtime mlPolicy.numNodes ?? 1; an explicit 0 stays 0."""
    num_nodes = _dict(_dict(job.get("spec")).get("trainer")).get("numNodes")
    if isinstance(num_nodes, int) and not isinstance(num_nodes, bool):
        return num_nodes
    if runtime is not None and runtime.num_nodes is not None:
        return runtime.num_nodes
    return 1


def requested_accelerators(
    job: Mapping[str, Any], runtime: RuntimeFacts | None, nodes: int
) -> tuple[str, int]:
    """(accelerator class, per-node count * nodes): the job's resourcesPerNode, else the runtime's trainer."""
    found = accelerators_of(_dict(_dict(job.get("spec")).get("trainer")).get("resourcesPerNode"))
    if found is None and runtime is not None and runtime.accelerator_class != NO_ACCELERATOR:
        found = (runtime.accelerator_class, runtime.accelerators_per_node)
    if found is None:
        return NO_ACCELERATOR, 0
    return found[0], found[1] * nodes


def classify(job: Mapping[str, Any]) -> tuple[str, tuple[str, str, dict[str, Any]] | None]:
    """(state, terminal) in one pass. state is one of JOB_STATES (product.md §3, kubeflow_trainer_trainjobs);
    terminal is (result, reason bucket, deciding condition) when Complete or Failed is True, where
    Failed=True wins over Complete=True. Written for speed: populate() classifies every write."""
    status = job.get("status")
    if not isinstance(status, dict):
        status = {}
    failed = complete = None
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for condition in conditions:
            if isinstance(condition, dict) and condition.get("status") == "True":
                cond_type = condition.get("type")
                if cond_type == "Failed" and failed is None:
                    failed = condition
                elif cond_type == "Complete" and complete is None:
                    complete = condition
    if failed is not None:
        reason = failed.get("reason")
        return "failed", ("failed", reason if reason in FAILURE_REASONS else "other", failed)
    if complete is not None:
        return "succeeded", ("succeeded", "none", complete)
    spec = job.get("spec")
    if isinstance(spec, dict) and spec.get("suspend") is True:
        return "suspended", None
    for entry in _list(status.get("jobsStatus")):
        active = entry.get("active") if isinstance(entry, dict) else None
        if isinstance(active, int) and active > 0:
            return "running", None
    return "pending", None


def terminal_of(job: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """(result, reason bucket, the deciding condition) when terminal; Failed=True wins over Complete=True."""
    return classify(job)[1]


def job_state(job: Mapping[str, Any]) -> str:
    """One of JOB_STATES."""
    return classify(job)[0]


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def lifetime_of(job: Mapping[str, Any], condition: Mapping[str, Any]) -> float | None:
    """Terminal condition lastTransitionTime - creationTimestamp; None when either is missing."""
    created = parse_time(_dict(job.get("metadata")).get("creationTimestamp"))
    ended = parse_time(condition.get("lastTransitionTime"))
    if created is None or ended is None:
        return None
    return (ended - created).total_seconds()


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ---------------------------------------------------------------------------------------------------------
# The running tally
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What ``kubeflow_trainer_trainjob_requested_*`` should observe for one created TrainJob."""

    namespace: str
    name: str
    runtime_ref: str
    nodes: int
    accelerator_class: str
    accelerators: int
    # The generator wrote an odd-but-valid shape (odd quantity, foreign or missing runtime, ...): the
    # numbers above follow this module's reading of the rules, which another reading may round otherwise.
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """One TrainJob's first terminal write: what ``finished_total`` and ``lifetime_seconds`` should see."""

    namespace: str
    name: str
    result: str
    reason: str
    runtime_ref: str
    lifetime_seconds: float | None
    resource_version: int  # of the write that made it terminal


@dataclass(frozen=True, slots=True)
class TruthSnapshot:
    """An immutable copy of the truth at one moment; diff two of them to get a window's deltas."""

    resource_version: int  # store revision when the snapshot was taken (0 when unknown)
    created: Mapping[CreatedKey, int]
    finished: Mapping[FinishedKey, int]
    jobs: Mapping[JobsKey, int]  # current TrainJobs by state; zero entries are dropped
    requests: Mapping[str, JobRequest]  # by uid, every TrainJob created so far
    terminal: Mapping[str, FinishedJob]  # by uid, every TrainJob finished so far

    def created_since(self, before: TruthSnapshot) -> dict[CreatedKey, int]:
        return _counter_delta(self.created, before.created)

    def finished_since(self, before: TruthSnapshot) -> dict[FinishedKey, int]:
        return _counter_delta(self.finished, before.finished)

    def requests_since(self, before: TruthSnapshot) -> list[JobRequest]:
        return [req for uid, req in self.requests.items() if uid not in before.requests]

    def terminal_since(self, before: TruthSnapshot) -> list[FinishedJob]:
        return [fin for uid, fin in self.terminal.items() if uid not in before.terminal]


def _counter_delta(after: Mapping[Any, int], before: Mapping[Any, int]) -> dict[Any, int]:
    delta = {key: value - before.get(key, 0) for key, value in after.items()}
    return {key: value for key, value in delta.items() if value}


class Truth:
    """Counts derived from the objects the generator wrote; independent of the service's rules code."""

    def __init__(self) -> None:
        self.runtimes: dict[RuntimeKey, RuntimeFacts] = {}
        self.created: Counter[CreatedKey] = Counter()
        self.finished: Counter[FinishedKey] = Counter()
        self.jobs: Counter[JobsKey] = Counter()
        self.requests: dict[str, JobRequest] = {}
        self.terminal: dict[str, FinishedJob] = {}
        self._current: dict[str, JobsKey] = {}  # uid -> gauge key of the job as last written
        self._refs: dict[str, str] = {}  # uid -> runtime_ref of a live job
        self.resource_version = 0

    # -- runtimes --------------------------------------------------------------------------------------
    def runtime_written(self, runtime: Mapping[str, Any]) -> None:
        self.runtimes[runtime_key_of(runtime)] = runtime_facts(runtime)

    def runtime_deleted(self, runtime: Mapping[str, Any]) -> None:
        self.runtimes.pop(runtime_key_of(runtime), None)

    # -- TrainJobs -------------------------------------------------------------------------------------
    def job_created(self, job: Mapping[str, Any], *, malformed: bool = False) -> None:
        """A TrainJob create returned ``job``: count it created and note what it requests."""
        meta = _dict(job.get("metadata"))
        uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
        ref, key = runtime_ref_of(job)
        runtime = self.runtimes.get(key) if key is not None else None
        nodes = requested_nodes(job, runtime)
        accel_class, accelerators = requested_accelerators(job, runtime, nodes)
        self.created[(namespace, ref)] += 1
        self.requests[uid] = JobRequest(
            namespace, str(meta.get("name", "")), ref, nodes, accel_class, accelerators, malformed
        )
        self._refs[uid] = ref
        self.job_written(job)

    def job_written(self, job: Mapping[str, Any]) -> None:
        """Any write returned ``job`` (create, spec patch, status write, delete that left it in place)."""
        meta = _dict(job.get("metadata"))
        uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
        self._note_rv(meta)
        ref = self._refs.get(uid)
        if ref is None:  # not created through us: still count its state
            ref = self._refs[uid] = runtime_ref_of(job)[0]
        state, terminal = classify(job)
        if terminal is not None and uid not in self.terminal:
            result, reason, condition = terminal
            self.finished[(result, reason, ref)] += 1
            self.terminal[uid] = FinishedJob(
                namespace,
                str(meta.get("name", "")),
                result,
                reason,
                ref,
                lifetime_of(job, condition),
                self.resource_version,
            )
        self._move(uid, (namespace, ref, state))

    def job_deleted(self, uid: str, resource_version: int = 0) -> None:
        """The TrainJob ``uid`` is gone from the store."""
        self.resource_version = max(self.resource_version, resource_version)
        self._refs.pop(uid, None)
        self._move(uid, None)

    def _move(self, uid: str, key: JobsKey | None) -> None:
        old = self._current.pop(uid, None)
        if old is not None:
            self.jobs[old] -= 1
            if not self.jobs[old]:
                del self.jobs[old]
        if key is not None:
            self._current[uid] = key
            self.jobs[key] += 1

    def _note_rv(self, meta: Mapping[str, Any]) -> None:
        try:
            rv = int(meta.get("resourceVersion") or 0)
        except (TypeError, ValueError):
            return
        self.resource_version = max(self.resource_version, rv)

    def state_of(self, uid: str) -> str | None:
        key = self._current.get(uid)
        return key[2] if key else None

    def snapshot(self, resource_version: int | None = None) -> TruthSnapshot:
        return TruthSnapshot(
            resource_version=self.resource_version if resource_version is None else resource_version,
            created=MappingProxyType(dict(self.created)),
            finished=MappingProxyType(dict(self.finished)),
            jobs=MappingProxyType(dict(self.jobs)),
            requests=MappingProxyType(dict(self.requests)),
            terminal=MappingProxyType(dict(self.terminal)),
        )


def recount_jobs(jobs: Iterable[Mapping[str, Any]]) -> dict[JobsKey, int]:
    """The trainjobs gauge recomputed from scratch over stored TrainJobs (for consistency checks)."""
    counts: Counter[JobsKey] = Counter()
    for job in jobs:
        namespace = str(_dict(job.get("metadata")).get("namespace", ""))
        counts[(namespace, runtime_ref_of(job)[0], classify(job)[0])] += 1
    return dict(counts)
