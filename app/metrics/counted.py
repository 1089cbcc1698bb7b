"""The counted families, declared once: one row per countable event type (app/trainer/events.py).

As kube-state-metrics' ``FamilyGenerator`` declares a family with the function that turns an object into
its metrics, a row (``CountedEdge``) declares, for one edge of the Trainer state machine
(app/trainer/state.py):

* ``families``: the counter and histogram families it counts into (``CountedFamily``: name, help, labels,
  buckets);
* ``series(event)``: the series one event increments, each with its label values and the value it adds
  (1 for a counter, the observation for a histogram), in counting order. That value is also the
  increment's exemplar: the event with that value (app/metrics/exemplars.py);
* ``at_floor``: the ``AT_FLOOR_*`` bits the TrainJob had at the hand-over floor if the previous leader
  counted the edge (0: the job existed then), for the edges a relist found across the floor
  (app/handover/settle.py);
* ``subject``: for a row whose edge is an object's other than the TrainJob (a pod's failure), the uid of
  that object, which the at-floor bits are read by (None: the event's ``uid``, the TrainJob's).

Derived from it: the counter and histogram families of ``TrainerMetricState`` (``FAMILIES``, in exposition
order), its ``on_countable`` and ``held_series_of`` (app/metrics/trainer_metrics.py), ``counted_before``
(app/handover/settle.py), and the tests' ledger of what PromQL can see (tests/support/promql_visible.py).
The table is complete: a countable event type without a row, or a family in no row, fails at import
(``check_table``). Pure data and pure functions: the hand-over imports it without the metric engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar, get_args

from app.trainer.events import CountableEvent, JobAdmitted, JobCreated, JobFinished, JobStarted, PodFailed
from app.trainer.projection_types import uid_text

__all__ = [
    "ACCELERATOR_BUCKETS",
    "ADMISSION_WAIT",
    "AT_FLOOR_FAILED",
    "AT_FLOOR_RESUMED",
    "AT_FLOOR_RUNNING",
    "AT_FLOOR_TERMINAL",
    "CREATED",
    "EDGES",
    "FAMILIES",
    "FINISHED",
    "LIFETIME",
    "LIFETIME_BUCKETS",
    "NODES_BUCKETS",
    "POD_FAILURES",
    "REQUESTED_ACCELERATORS",
    "REQUESTED_NODES",
    "STARTUP",
    "STARTUP_BUCKETS",
    "CountedEdge",
    "CountedFamily",
    "Increment",
    "check_table",
    "edge_of",
    "series_of",
]

_PREFIX = "kubeflow_trainer_"

# Lifetime of a TrainJob, 1 minute to 7 days. Roughly doubling steps on the hour/day grid operators think
# in (1m, 5m, 15m, 30m, 1h, 2h, 4h, 8h, 16h, 1d, 2d, 4d, 7d): 13 buckets keep the series small while
# p50/p95 stay meaningful from short smoke-test jobs to week-long pre-training runs.
LIFETIME_BUCKETS: tuple[float, ...] = (
    60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 57600.0,
    86400.0, 172800.0, 345600.0, 604800.0,
)  # fmt: skip
# Time to running and admission wait, 1 second to 7 days: a job whose pods are up in seconds and one that
# waits days for GPUs or its queue both land in a bucket of their own (Kueue's admission-wait buckets, and the
# hour/day grid of the lifetimes above 1 h).
STARTUP_BUCKETS: tuple[float, ...] = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
    86400.0, 259200.0, 604800.0,
)  # fmt: skip
# Requested training nodes: 1, 2, 4 ... 1024.
NODES_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(11))
# Requested accelerators: 0 (CPU-only jobs are observed as 0 with class "none"), then 1, 2, 4 ... 4096.
ACCELERATOR_BUCKETS: tuple[float, ...] = (0.0, *(float(2**i) for i in range(13)))

# What a TrainJob was at the hand-over floor (app/handover/settle.py's ``terminal_at``), as bits; a bool
# True reads as AT_FLOOR_TERMINAL.
AT_FLOOR_TERMINAL = 1
AT_FLOOR_RUNNING = 2
AT_FLOOR_RESUMED = 4
AT_FLOOR_FAILED = 8  # a pod (the row's subject) in phase Failed


@dataclass(frozen=True, eq=False, slots=True)
class CountedFamily:
    """One counter or histogram family. Hashed by identity: each is declared once, below."""

    name: str  # a counter's without ``_total`` (its OpenMetrics family name)
    help: str
    labels: tuple[str, ...]
    kind: Literal["counter", "histogram"]
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The samples PromQL reads as counters: ``_total``, or a histogram's ``_count`` and ``_sum``."""
        if self.kind == "counter":
            return (self.name + "_total",)
        return (self.name + "_count", self.name + "_sum")


class Increment(NamedTuple):
    """What one event adds to one series: 1 to a counter, ``value`` observed by a histogram."""

    family: CountedFamily
    labels: tuple[str, ...]
    value: float


E = TypeVar("E", JobCreated, JobFinished, JobStarted, JobAdmitted, PodFailed)


@dataclass(frozen=True, slots=True)
class CountedEdge(Generic[E]):
    """One countable event type and everything counted of it (see the module docstring)."""

    event: type[E]
    name: str  # the edge in logs and test records: "created", "finished", ...
    families: tuple[CountedFamily, ...]
    series: Callable[[E], Sequence[Increment]]
    at_floor: int
    subject: Callable[[E], str] | None = None  # see the module docstring

    def subject_uid(self, event: E) -> str:
        """The uid the at-floor bits of ``event`` are keyed by: its subject's, else the TrainJob's."""
        return event.uid if self.subject is None else self.subject(event)

    def counted_before(self, bits_at_floor: int | None) -> bool:
        """Whether the previous leader counted this edge of a job that had ``bits_at_floor`` at the floor
        (None: the job did not exist then)."""
        return bits_at_floor is not None and int(bits_at_floor) & self.at_floor == self.at_floor


CREATED = CountedFamily(
    _PREFIX + "trainjob_created",
    "TrainJobs created (first seen after the informer's initial list).",
    ("namespace", "runtime_ref"),
    "counter",
)
FINISHED = CountedFamily(
    _PREFIX + "trainjob_finished",
    "TrainJobs that reached a terminal state (once per TrainJob uid).",
    ("result", "reason", "runtime_ref"),
    "counter",
)
LIFETIME = CountedFamily(
    _PREFIX + "trainjob_lifetime_seconds",
    "Time from a TrainJob's creation to its terminal condition, in seconds.",
    ("result", "runtime_ref"),
    "histogram",
    LIFETIME_BUCKETS,
)
REQUESTED_NODES = CountedFamily(
    _PREFIX + "trainjob_requested_training_nodes_per_job",
    "Training nodes requested per TrainJob, observed when it is created.",
    ("runtime_ref",),
    "histogram",
    NODES_BUCKETS,
)
REQUESTED_ACCELERATORS = CountedFamily(
    _PREFIX + "trainjob_requested_accelerators",
    "Accelerators requested per TrainJob (per-node request times nodes), observed at creation.",
    ("accelerator_class", "runtime_ref"),
    "histogram",
    ACCELERATOR_BUCKETS,
)
STARTUP = CountedFamily(
    _PREFIX + "trainjob_startup_seconds",
    "Time from a TrainJob's creation to the first time it was seen running (a child Job of the "
    "training step ready), in seconds.",
    ("runtime_ref",),
    "histogram",
    STARTUP_BUCKETS,
)
ADMISSION_WAIT = CountedFamily(
    _PREFIX + "trainjob_admission_wait_seconds",
    "Time from a TrainJob's creation to its admission (Suspended condition False, reason Resumed), "
    "for jobs held suspended before they ever ran, in seconds.",
    ("runtime_ref",),
    "histogram",
    STARTUP_BUCKETS,
)
POD_FAILURES = CountedFamily(
    _PREFIX + "trainjob_pod_failures",
    "Pods of TrainJobs that failed (phase Failed, once per pod uid), by the pod's reason (its status' or its "
    "failed container's).",
    ("namespace", "runtime_ref", "reason"),
    "counter",
)

# Exposition order (between kubeflow_trainer_runtime_info and the kubeflow_trainer_trainjobs gauge).
FAMILIES: tuple[CountedFamily, ...] = (
    CREATED,
    FINISHED,
    LIFETIME,
    REQUESTED_NODES,
    REQUESTED_ACCELERATORS,
    STARTUP,
    ADMISSION_WAIT,
    POD_FAILURES,
)


def _created(event: JobCreated) -> list[Increment]:
    ref = event.runtime_ref
    out = [Increment(CREATED, (event.namespace, ref), 1.0)]
    # A request above the ceilings (rules.requests_within_ceilings) is counted created and not observed:
    # one absurd job would otherwise dominate the histograms' sums for ever.
    if event.nodes_observed:
        out.append(Increment(REQUESTED_NODES, (ref,), float(event.requested_nodes)))
    if event.accelerators_observed:
        # One observation per accelerator class the job requests (upstream observes each class).
        out.extend(
            Increment(REQUESTED_ACCELERATORS, (accelerator_class, ref), float(count))
            for accelerator_class, count in event.accelerators
        )
    return out


def _finished(event: JobFinished) -> list[Increment]:
    out = [Increment(FINISHED, (event.result, event.reason, event.runtime_ref), 1.0)]
    lifetime = event.lifetime_seconds
    # A NaN or infinite observation would poison the histogram sum for ever; skip it. Clock skew
    # between creation and the condition can make a lifetime slightly negative: count it as 0.
    if lifetime is not None and math.isfinite(lifetime):
        out.append(Increment(LIFETIME, (event.result, event.runtime_ref), max(lifetime, 0.0)))
    return out


def _duration(family: CountedFamily, runtime_ref: str, seconds: float) -> list[Increment]:
    # As for lifetimes: never a NaN or infinity into a sum, and clock skew counts as 0.
    if not math.isfinite(seconds):
        return []
    return [Increment(family, (runtime_ref,), max(seconds, 0.0))]


def _started(event: JobStarted) -> list[Increment]:
    return _duration(STARTUP, event.runtime_ref, event.startup_seconds)


def _admitted(event: JobAdmitted) -> list[Increment]:
    return _duration(ADMISSION_WAIT, event.runtime_ref, event.wait_seconds)


def _pod_failed(event: PodFailed) -> list[Increment]:
    return [Increment(POD_FAILURES, (event.namespace, event.runtime_ref, event.reason), 1.0)]


def _pod_of(event: PodFailed) -> str:
    return uid_text(event.pod_uid)


EDGES: tuple[CountedEdge[Any], ...] = (
    # Created: the creation counter and the requests' histograms; counted before if the job existed.
    CountedEdge(JobCreated, "created", (CREATED, REQUESTED_NODES, REQUESTED_ACCELERATORS), _created, 0),
    CountedEdge(JobFinished, "finished", (FINISHED, LIFETIME), _finished, AT_FLOOR_TERMINAL),
    CountedEdge(JobStarted, "started", (STARTUP,), _started, AT_FLOOR_RUNNING),
    CountedEdge(JobAdmitted, "admitted", (ADMISSION_WAIT,), _admitted, AT_FLOOR_RESUMED),
    # A pod's failure: counted before if the pod was Failed at the floor (its bits are read from the pods).
    CountedEdge(PodFailed, "pod_failed", (POD_FAILURES,), _pod_failed, AT_FLOOR_FAILED, subject=_pod_of),
)


def check_table(
    edges: Iterable[CountedEdge[Any]], families: Collection[CountedFamily], event_types: Iterable[type]
) -> dict[type, CountedEdge[Any]]:
    """The rows by event type; raises TypeError unless every event type has exactly one row and every
    family is counted by exactly one row."""
    types = tuple(event_types)
    by_type: dict[type, CountedEdge[Any]] = {}
    counted: list[CountedFamily] = []
    for edge in edges:
        if edge.event in by_type:
            raise TypeError(f"two rows count {edge.event.__name__}")
        by_type[edge.event] = edge
        counted.extend(edge.families)
    missing = [t.__name__ for t in types if t not in by_type]
    if missing:
        raise TypeError(f"countable event types without a row in app/metrics/counted.py: {missing}")
    unknown = [t.__name__ for t in by_type if t not in types]
    if unknown:
        raise TypeError(f"rows for types that are not countable events: {unknown}")
    if sorted(f.name for f in counted) != sorted(f.name for f in families):
        raise TypeError("every family must be counted by exactly one row and be in FAMILIES")
    return by_type


_BY_TYPE: Mapping[type, CountedEdge[Any]] = check_table(EDGES, FAMILIES, get_args(CountableEvent))


def edge_of(event: CountableEvent) -> CountedEdge[Any]:
    """The row of ``event``'s type."""
    return _BY_TYPE[type(event)]


def series_of(event: CountableEvent) -> Sequence[Increment]:
    """The series ``event`` increments, with what it adds to each."""
    edge: CountedEdge[Any] = _BY_TYPE[type(event)]
    return edge.series(event)
