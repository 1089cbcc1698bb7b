"""Ground truth for the workload generator: what the exporter's Trainer metrics should say.

Deliberately written from the design documents (docs/design/product.md §3,
docs/design/trainer-domain.md §1-§3), NOT by importing ``app/trainer``: a test that compares the service
against this module then checks two independent readings of the same rules instead of the service's code
against itself.

The generator feeds every object the store returns from its writes into ``Truth``; the truth then derives
everything from those stored objects, so what it counts is exactly what a watcher of the store can see.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from fractions import Fraction
from types import MappingProxyType
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
NO_ACCELERATOR: Final = "none"
_CAMEL_CASE: Final = re.compile(r"[A-Z][a-zA-Z0-9]*")
MAX_REASON_LENGTH: Final = 64
# The service's default caps (distinct reason names beyond FAILURE_REASONS, distinct accelerator classes).
# The truth does not model them: the generator writes fewer distinct values than either (a test checks).
MAX_REASON_NAMES: Final = 32
MAX_ACCELERATOR_CLASSES: Final = 32
# docs/design/product.md §3: accelerators are resource names matching these patterns (the default of the
# service's setting): NVIDIA GPUs and MIG slices, AMD, Intel GPUs, Google TPU, Habana Gaudi, AWS Neuron.
ACCELERATOR_PATTERNS: Final = (
    "nvidia.com/gpu",
    "nvidia.com/mig-*",
    "amd.com/gpu",
    "gpu.intel.com/*",
    "google.com/tpu",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron*",
)

CreatedKey = tuple[str, str]  # (namespace, runtime_ref)
FinishedKey = tuple[str, str, str]  # (result, reason bucket, runtime_ref)
JobsKey = tuple[str, str, str]  # (namespace, runtime_ref, state)


# ---------------------------------------------------------------------------------------------------------
# Pure rules over plain JSON objects
# ---------------------------------------------------------------------------------------------------------


Quantities = tuple[tuple[str, int], ...]  # (resource name, whole units rounded up), sorted by name


@dataclass(frozen=True, slots=True)
class RuntimeFacts:
    """What the rules need from one runtime: the node count a TrainJob without numNodes gets, and the
    trainer ``node`` container's resources, which a TrainJob's resourcesPerNode is merged into."""

    default_nodes: int
    requests: Quantities = ()
    limits: Quantities = ()
    merges_job_resources: bool = True  # False: the controller ignores the job's resourcesPerNode

    def accelerators(self) -> list[tuple[str, int]]:
        """The accelerators the runtime's trainer container requests by itself."""
        return _accelerators(dict(self.requests), dict(self.limits))


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


def is_accelerator(name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in ACCELERATOR_PATTERNS)


def quantities(section: Any) -> dict[str, int]:
    """A requests or limits map as whole units (rounded up); entries that do not parse are left out."""
    out: dict[str, int] = {}
    if isinstance(section, dict):
        for name, value in section.items():
            count = quantity_value(value)
            if isinstance(name, str) and count is not None:
                out[name] = count
    return out


def _accelerators(requests: Mapping[str, int], limits: Mapping[str, int]) -> list[tuple[str, int]]:
    """(class, per-node count) of every accelerator a container requests: per resource, its request, or
    its limit when it has no request (the API server copies a missing request from the limit); 0 is none."""
    found = []
    for name in sorted(set(requests) | set(limits)):
        count = requests[name] if name in requests else limits[name]
        if count > 0 and is_accelerator(name):
            found.append((name, count))
    return found


def runtime_facts(runtime: Mapping[str, Any]) -> RuntimeFacts:
    """Default node count and trainer container of a (Cluster)TrainingRuntime object, read as the Trainer
    controller reads them (docs/design/trainer-domain.md §2 numNodes resolution, §3 resources):

    - nodes: the trainer job (labelled ancestor ``trainer``, else named ``node``) runs mlPolicy.numNodes
      (default 1) when it carries the label and the runtime has an mlPolicy, else its template's
      parallelism (default 1);
    - resources: the ``node`` container of the first replicated job named ``node`` or labelled ``trainer``;
      a job's resourcesPerNode is merged into it only for a runtime with an mlPolicy, when that job carries
      the label or (MPI with runLauncherAsNode) is named ``node``.
    """
    spec = _dict(runtime.get("spec"))
    ml_policy = spec.get("mlPolicy")
    jobs = [_dict(job) for job in _list(_dict(_dict(spec.get("template")).get("spec")).get("replicatedJobs"))]
    labelled = [job for job in jobs if _ancestor(job) == "trainer"]
    named = [job for job in jobs if job.get("name") == "node"]
    default_nodes = 1
    trainer = labelled[0] if labelled else named[0] if named else None
    if trainer is not None:
        if ml_policy is not None and trainer in labelled:
            value = _dict(ml_policy).get("numNodes")
        else:
            value = _dict(_dict(trainer.get("template")).get("spec")).get("parallelism")
        if isinstance(value, int) and not isinstance(value, bool):
            default_nodes = value
    container_job = next((job for job in jobs if job in labelled or job in named), None)
    if container_job is None:
        return RuntimeFacts(default_nodes, merges_job_resources=False)
    mpi = _dict(_dict(ml_policy).get("mpi"))
    merges = ml_policy is not None and (
        container_job in labelled or (container_job in named and mpi.get("runLauncherAsNode") is True)
    )
    pod_spec = _dict(
        _dict(_dict(_dict(container_job.get("template")).get("spec")).get("template")).get("spec")
    )
    for container in _list(pod_spec.get("containers")):
        if _dict(container).get("name") == "node":
            resources = _dict(_dict(container).get("resources"))
            return RuntimeFacts(
                default_nodes,
                tuple(sorted(quantities(resources.get("requests")).items())),
                tuple(sorted(quantities(resources.get("limits")).items())),
                merges,
            )
    return RuntimeFacts(default_nodes, merges_job_resources=merges)


def _ancestor(job: Mapping[str, Any]) -> Any:
    labels = _dict(_dict(_dict(job.get("template")).get("metadata")).get("labels"))
    return labels.get("trainer.kubeflow.org/trainjob-ancestor-step")


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
    """spec.trainer.numNodes, else the runtime's default node count, else 1; an explicit 0 stays 0."""
    num_nodes = _dict(_dict(job.get("spec")).get("trainer")).get("numNodes")
    if isinstance(num_nodes, int) and not isinstance(num_nodes, bool):
        return num_nodes
    if runtime is not None:
        return runtime.default_nodes
    return 1


def requested_accelerators(
    job: Mapping[str, Any], runtime: RuntimeFacts | None, nodes: int
) -> tuple[tuple[str, int], ...]:
    """(accelerator class, per-node count * nodes) for every class the job's trainer nodes request, or
    (("none", 0),). Per-node resources: the runtime's trainer container with the job's resourcesPerNode
    merged in (requests into requests, limits into limits, name by name, the job's value winning), when
    the runtime takes it; the job's resourcesPerNode alone when the runtime is not known."""
    override = _dict(_dict(_dict(job.get("spec")).get("trainer")).get("resourcesPerNode"))
    if runtime is None:
        requests, limits = quantities(override.get("requests")), quantities(override.get("limits"))
    else:
        requests, limits = dict(runtime.requests), dict(runtime.limits)
        if runtime.merges_job_resources:
            requests.update(quantities(override.get("requests")))
            limits.update(quantities(override.get("limits")))
    found = _accelerators(requests, limits)
    if not found:
        return ((NO_ACCELERATOR, 0),)
    return tuple((name, count * nodes) for name, count in found)


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


def classify(job: Mapping[str, Any]) -> tuple[str, tuple[str, str, dict[str, Any]] | None]:
    """(state, terminal) in one pass. state is one of JOB_STATES (docs/design/product.md §3,
    kubeflow_trainer_trainjobs); terminal is (result, reason bucket, deciding condition) when Complete or
    Failed is True, where Failed=True wins over Complete=True. Written for speed: populate() classifies
    every write."""
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
        return "failed", ("failed", reason_label(failed.get("reason")), failed)
    if complete is not None:
        return "succeeded", ("succeeded", "none", complete)
    spec = job.get("spec")
    if isinstance(spec, dict) and spec.get("suspend") is True:
        return "suspended", None
    # Running once a child Job has all its pods ready (jobsStatus[].ready); ``active`` also counts child Jobs
    # whose pods are still pending (waiting for capacity), which are pending here.
    for entry in _list(status.get("jobsStatus")):
        ready = entry.get("ready") if isinstance(entry, dict) else None
        if isinstance(ready, int) and ready > 0:
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


def resumed_condition(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Suspended condition with status False and reason Resumed (the controller writes it when a job's
    spec.suspend goes off: Kueue admitted it), if the job has one (the first, if several)."""
    conditions = _dict(job.get("status")).get("conditions")
    for condition in _list(conditions):
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
    created = parse_time(_dict(job.get("metadata")).get("creationTimestamp"))
    if created is None or at is None:
        return None
    end = at.timestamp() if isinstance(at, datetime) else at
    return max(end - created.timestamp(), 0.0)


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
    # (accelerator_class, per-node count * nodes) for each class requested, or (("none", 0),): one
    # observation of kubeflow_trainer_trainjob_requested_accelerators each.
    accelerators: tuple[tuple[str, int], ...]
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
class StartedJob:
    """One TrainJob's first write in the running state (not terminal): what
    ``kubeflow_trainer_trainjob_startup_seconds`` should observe. ``startup_seconds`` is the writer's clock at
    that write minus creationTimestamp: a watcher sees the write a little later, never earlier."""

    namespace: str
    name: str
    runtime_ref: str
    startup_seconds: float
    resource_version: int


@dataclass(frozen=True, slots=True)
class AdmittedJob:
    """One TrainJob's first write with a Suspended=False/Resumed condition while not terminal and before it
    ever ran: what ``kubeflow_trainer_trainjob_admission_wait_seconds`` should observe (the condition's
    lastTransitionTime minus creationTimestamp)."""

    namespace: str
    name: str
    runtime_ref: str
    wait_seconds: float
    resource_version: int


@dataclass(frozen=True, slots=True)
class TruthSnapshot:
    """An immutable copy of the truth at one moment; diff two of them to get a window's deltas."""

    resource_version: int  # store revision when the snapshot was taken (0 when unknown)
    created: Mapping[CreatedKey, int]
    finished: Mapping[FinishedKey, int]
    jobs: Mapping[JobsKey, int]  # current TrainJobs by state; zero entries are dropped
    requests: Mapping[str, JobRequest]  # by uid, every TrainJob created so far
    terminal: Mapping[str, FinishedJob]  # by uid, every TrainJob finished so far
    started: Mapping[str, StartedJob] = field(default_factory=lambda: MappingProxyType({}))  # by uid
    admitted: Mapping[str, AdmittedJob] = field(default_factory=lambda: MappingProxyType({}))  # by uid
    # Observations of kubeflow_trainer_trainjob_requested_accelerators by runtime_ref over every TrainJob
    # created so far (one per accelerator class a job requests, or one "none"): a running total, so that
    # a window's count survives a caller dropping the records of deleted jobs from ``requests``.
    accelerator_observations: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def created_since(self, before: TruthSnapshot) -> dict[CreatedKey, int]:
        return _counter_delta(self.created, before.created)

    def finished_since(self, before: TruthSnapshot) -> dict[FinishedKey, int]:
        return _counter_delta(self.finished, before.finished)

    def accelerator_observations_since(self, before: TruthSnapshot) -> dict[str, int]:
        return _counter_delta(self.accelerator_observations, before.accelerator_observations)

    def requests_since(self, before: TruthSnapshot) -> list[JobRequest]:
        return [req for uid, req in self.requests.items() if uid not in before.requests]

    def terminal_since(self, before: TruthSnapshot) -> list[FinishedJob]:
        return [fin for uid, fin in self.terminal.items() if uid not in before.terminal]

    def started_since(self, before: TruthSnapshot) -> list[StartedJob]:
        return [job for uid, job in self.started.items() if uid not in before.started]

    def admitted_since(self, before: TruthSnapshot) -> list[AdmittedJob]:
        return [job for uid, job in self.admitted.items() if uid not in before.admitted]


def _counter_delta(after: Mapping[Any, int], before: Mapping[Any, int]) -> dict[Any, int]:
    delta = {key: value - before.get(key, 0) for key, value in after.items()}
    return {key: value for key, value in delta.items() if value}


class Truth:
    """Counts derived from the objects the generator wrote; independent of the service's rules code."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the writer's wall clock (epoch seconds), read at each write to time the first running
        state (nothing in a TrainJob records when its pods became ready)."""
        self.clock = clock
        self.started: dict[str, StartedJob] = {}
        self.admitted: dict[str, AdmittedJob] = {}
        self.runtimes: dict[RuntimeKey, RuntimeFacts] = {}
        self.created: Counter[CreatedKey] = Counter()
        self.finished: Counter[FinishedKey] = Counter()
        self.jobs: Counter[JobsKey] = Counter()
        self.requests: dict[str, JobRequest] = {}
        self.accelerator_observations: Counter[str] = Counter()  # by runtime_ref; never pruned
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
        self.created[(namespace, ref)] += 1
        accelerators = requested_accelerators(job, runtime, nodes)
        self.accelerator_observations[ref] += len(accelerators)
        self.requests[uid] = JobRequest(
            namespace, str(meta.get("name", "")), ref, nodes, accelerators, malformed
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
        if terminal is None:
            self._first_running_or_admitted(job, uid, namespace, ref, state)
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

    def _first_running_or_admitted(
        self, job: Mapping[str, Any], uid: str, namespace: str, ref: str, state: str
    ) -> None:
        """docs/design/product.md §3, time to running: an admission (the Resumed condition) counts only before
        the job first ran, and each of the two at most once per job."""
        name = str(_dict(job.get("metadata")).get("name", ""))
        if uid not in self.admitted and uid not in self.started:
            resumed = resumed_condition(job)
            if resumed is not None:
                wait = since_creation(job, parse_time(resumed.get("lastTransitionTime")))
                if wait is not None:
                    self.admitted[uid] = AdmittedJob(namespace, name, ref, wait, self.resource_version)
        if state == "running" and uid not in self.started:
            startup = since_creation(job, self.clock())
            if startup is not None:
                self.started[uid] = StartedJob(namespace, name, ref, startup, self.resource_version)

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
            started=MappingProxyType(dict(self.started)),
            admitted=MappingProxyType(dict(self.admitted)),
            accelerator_observations=MappingProxyType(dict(self.accelerator_observations)),
        )


def recount_jobs(jobs: Iterable[Mapping[str, Any]]) -> dict[JobsKey, int]:
    """The trainjobs gauge recomputed from scratch over stored TrainJobs (for consistency checks)."""
    counts: Counter[JobsKey] = Counter()
    for job in jobs:
        namespace = str(_dict(job.get("metadata")).get("namespace", ""))
        counts[(namespace, runtime_ref_of(job)[0], classify(job)[0])] += 1
    return dict(counts)
