"""The Trainer metrics (docs/design/product.md §3): their definitions and the state behind them.

The series and their cached text are app/metrics/series.py's; this module decides which families
exist, in which order, and what a Trainer event does to them. A scrape costs nothing per TrainJob
(docs/design/product.md §6, invariant 7). :class:`TrainerCollector` exposes the same state as a
regular prometheus-client ``Collector``: the tests compare its exposition with ours byte for byte.

What PromQL sees (docs/metrics.md, "How counting works"). With a ``zero_hold`` every counter and histogram
series is born at zero: ``render_text`` / ``render_openmetrics`` are the *served* renders (one per
scrape), and a series they show for the first time is shown with all its values 0 for ``zero_hold``
seconds of served renders before its real values (app/metrics/series.py). Each leader term counts from
zero (``reset_counts``): a term's series are new to Prometheus (the leader's ``pod`` label), and a
replica that leads again must not show what its earlier term counted but nobody saw, since the next
leader counted those again. Listeners (``add_served_listener``) learn of every served render and of
the series it released, so that the hand-over can say what a scrape has shown
(app/handover/served.py). Gauges are never held. The protobuf render (``render_protobuf``, native
histograms included) is a served render like the other two: born at zero, the hand-over and the journal
apply to it unchanged, since it reads the same series, counts and holds.

Exemplars (``exemplars=True``): every counter and histogram observation carries the TrainJob behind it
(app/metrics/exemplars.py), shown in OpenMetrics and protobuf; never on the gauges, the per-TrainJob
families or the self-telemetry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.metrics_core import Metric

from app.metrics.series import (
    CounterFamily,
    Family,
    Format,
    GaugeFamily,
    HistogramFamily,
    LabelValues,
    SeriesCache,
)
from app.trainer.events import (
    CountableEvent,
    GaugeKey,
    JobAdmitted,
    JobCreated,
    JobFinished,
    JobStarted,
    RuntimeInfo,
)

__all__ = [
    "ACCELERATOR_BUCKETS",
    "LIFETIME_BUCKETS",
    "NODES_BUCKETS",
    "STARTUP_BUCKETS",
    "RuntimeProvider",
    "SeriesRef",
    "ServedListener",
    "TrainerCollector",
    "TrainerMetricState",
]

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

RuntimeProvider = Callable[[], Iterable[RuntimeInfo]]
# One series: its family's name and its label values.
SeriesRef = tuple[str, LabelValues]
# Called after every served render: its time and the series whose hold it ended.
ServedListener = Callable[[float, list[SeriesRef]], None]

_PREFIX = "kubeflow_trainer_"


class TrainerMetricState:
    """State of the ``kubeflow_trainer_*`` metrics, with cached text rendering.

    Every replica keeps it warm (gauges and runtime inventory always; counters and histograms as the
    CountJournal applies events); the exposition layer exports it only while this replica leads.
    Implements :class:`app.trainer.events.TrainerSink`, so a setup without leader election can feed it
    directly.
    """

    def __init__(
        self,
        runtime_provider: RuntimeProvider | None = None,
        *,
        flush_every: int = 32,
        publish_interval: float = 0.02,
        zero_hold: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        extra_families: Sequence[Family] = (),
        exemplars: bool = False,
    ) -> None:
        """``flush_every``, ``publish_interval``: see :class:`app.metrics.series.SeriesCache`.
        ``zero_hold``: seconds a new counter or histogram series is served as zeros (born at zero); None:
        no hold, every render shows the real values (tests, benchmarks). ``extra_families``: gauge families
        kept by someone else (the opt-in per-TrainJob series, app/metrics/per_job.py), exported after
        these, by the leader only like these; their owner calls ``extra_changed`` after changing them.
        ``exemplars``: counters and histograms carry the TrainJob of their last observation (OpenMetrics
        and protobuf)."""
        if zero_hold is not None and not (math.isfinite(zero_hold) and zero_hold >= 0):
            raise ValueError("zero_hold must be a finite number >= 0")
        self._runtime_provider = runtime_provider
        self._runtimes_stale = runtime_provider is not None
        self.runtime_info = GaugeFamily(
            _PREFIX + "runtime_info",
            "Information about a TrainingRuntime or ClusterTrainingRuntime (always 1).",
            ("namespace", "name", "api_group", "kind", "ml_policy", "pod_group_policy", "framework"),
        )
        self.created = CounterFamily(
            _PREFIX + "trainjob_created",
            "TrainJobs created (first seen after the informer's initial list).",
            ("namespace", "runtime_ref"),
        )
        self.finished = CounterFamily(
            _PREFIX + "trainjob_finished",
            "TrainJobs that reached a terminal state (once per TrainJob uid).",
            ("result", "reason", "runtime_ref"),
        )
        self.lifetime = HistogramFamily(
            _PREFIX + "trainjob_lifetime_seconds",
            "Time from a TrainJob's creation to its terminal condition, in seconds.",
            ("result", "runtime_ref"),
            LIFETIME_BUCKETS,
        )
        self.requested_nodes = HistogramFamily(
            _PREFIX + "trainjob_requested_training_nodes_per_job",
            "Training nodes requested per TrainJob, observed when it is created.",
            ("runtime_ref",),
            NODES_BUCKETS,
        )
        self.requested_accelerators = HistogramFamily(
            _PREFIX + "trainjob_requested_accelerators",
            "Accelerators requested per TrainJob (per-node request times nodes), observed at creation.",
            ("accelerator_class", "runtime_ref"),
            ACCELERATOR_BUCKETS,
        )
        self.startup = HistogramFamily(
            _PREFIX + "trainjob_startup_seconds",
            "Time from a TrainJob's creation to the first time it was seen running (a child Job of the "
            "training step ready), in seconds.",
            ("runtime_ref",),
            STARTUP_BUCKETS,
        )
        self.admission_wait = HistogramFamily(
            _PREFIX + "trainjob_admission_wait_seconds",
            "Time from a TrainJob's creation to its admission (Suspended condition False, reason Resumed), "
            "for jobs held suspended before they ever ran, in seconds.",
            ("runtime_ref",),
            STARTUP_BUCKETS,
        )
        self.trainjobs = GaugeFamily(
            _PREFIX + "trainjobs",
            "Current TrainJobs by namespace, runtime and state.",
            ("namespace", "runtime_ref", "state"),
        )
        self._series = SeriesCache(
            (
                self.runtime_info,
                self.created,
                self.finished,
                self.lifetime,
                self.requested_nodes,
                self.requested_accelerators,
                self.startup,
                self.admission_wait,
                self.trainjobs,
                *extra_families,
            ),
            flush_every=flush_every,
            publish_interval=publish_interval,
            clock=clock,
            before_publish=self.apply_pending_gauges,
        )
        self._pending_gauges: dict[GaugeKey, int] = {}
        self._gauge_moves = 0
        self._flush_every = flush_every
        self._zero_hold = zero_hold
        self._clock = clock
        # The families whose series are born at zero: every counter and histogram (a new one must be
        # added here too; tests/metrics/test_born_at_zero.py checks that none is missing).
        self._counting: tuple[CounterFamily | HistogramFamily, ...] = (
            self.created,
            self.finished,
            self.lifetime,
            self.requested_nodes,
            self.requested_accelerators,
            self.startup,
            self.admission_wait,
        )
        if zero_hold is not None:
            for family in self._counting:
                family.enable_hold()
        self._exemplars = exemplars
        if exemplars:
            for family in self._counting:
                family.enable_exemplars()
        self._served_listeners: list[ServedListener] = []

    # --- TrainerSink -------------------------------------------------------------------------------

    def on_countable(self, event: CountableEvent) -> None:
        """Count an event now (the CountJournal calls this only while leading)."""
        if isinstance(event, JobCreated):
            self.count_created(event)
        elif isinstance(event, JobFinished):
            self.count_finished(event)
        elif isinstance(event, JobStarted):
            self.count_started(event)
        else:
            self.count_admitted(event)

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None:
        # Kept as the series' latest value until the next publish or render: a TrainJob's state change
        # moves two series, and applying each move to the family at once (its dirty set, the cached bodies)
        # was about 3 % of the per-event work after the decode (docs/benchmarks.md, bench.instructions).
        # The moves count towards the publish like any change, handed over ``flush_every`` at a time (one
        # call instead of one per move), so a scrape finds at most a publish interval's worth to apply.
        self._pending_gauges[key] = value
        moves = self._gauge_moves + 1
        if moves < self._flush_every:
            self._gauge_moves = moves
        else:
            self._gauge_moves = 0
            self._series.tick(moves)

    def apply_pending_gauges(self) -> None:
        """Apply the TrainJob gauge moves kept so far (every render and publish does; for readers of
        ``trainjobs``)."""
        pending = self._pending_gauges
        if not pending:
            return
        self._pending_gauges = {}
        family = self.trainjobs
        for key, value in pending.items():
            family.set(key, value)
        if family.changed:
            self._series.invalidate()

    def on_runtimes_changed(self) -> None:
        # Re-read lazily at the next scrape: a burst of runtime events costs one snapshot read.
        self._runtimes_stale = True
        self._series.invalidate()

    # --- counting ----------------------------------------------------------------------------------

    def count_created(self, event: JobCreated) -> None:
        ref = event.runtime_ref
        ex = self._exemplars
        self.created.inc((event.namespace, ref), (event, 1.0) if ex else None)
        # A request above the ceilings (rules.requests_within_ceilings) is not observed:
        # one absurd job would otherwise dominate the histograms' sums for ever.
        if event.nodes_observed:
            nodes = event.requested_nodes
            self.requested_nodes.observe((ref,), nodes, (event, float(nodes)) if ex else None)
        if event.accelerators_observed:
            # One observation per accelerator class the job requests (upstream observes each class).
            for accelerator_class, count in event.accelerators:
                exemplar = (event, float(count)) if ex else None
                self.requested_accelerators.observe((accelerator_class, ref), count, exemplar)
        self._series.changed()

    def count_finished(self, event: JobFinished) -> None:
        ref = event.runtime_ref
        ex = self._exemplars
        self.finished.inc((event.result, event.reason, ref), (event, 1.0) if ex else None)
        lifetime = event.lifetime_seconds
        # A NaN or infinite observation would poison the histogram sum forever; skip it. Clock skew
        # between creation and the condition can make a lifetime slightly negative: count it as 0.
        if lifetime is not None and math.isfinite(lifetime):
            value = max(lifetime, 0.0)
            self.lifetime.observe((event.result, ref), value, (event, value) if ex else None)
        self._series.changed()

    def count_started(self, event: JobStarted) -> None:
        self._observe_duration(self.startup, event, event.startup_seconds)

    def count_admitted(self, event: JobAdmitted) -> None:
        self._observe_duration(self.admission_wait, event, event.wait_seconds)

    def _observe_duration(
        self, family: HistogramFamily, event: JobStarted | JobAdmitted, seconds: float
    ) -> None:
        # As for lifetimes: never a NaN or infinity into a sum, and clock skew counts as 0.
        if math.isfinite(seconds):
            value = max(seconds, 0.0)
            family.observe((event.runtime_ref,), value, (event, value) if self._exemplars else None)
            self._series.changed()

    def extra_changed(self) -> None:
        """An ``extra_families`` series changed (as ``on_jobs_gauge`` does for the Trainer gauge)."""
        self._series.changed()

    def reset_counts(self) -> None:
        """Drop every counter and histogram series: a new leader term counts from zero. Gauges stay."""
        for family in self._counting:
            family.clear()
        self._series.invalidate()

    # --- born at zero ------------------------------------------------------------------------------

    @property
    def zero_hold(self) -> float | None:
        return self._zero_hold

    def add_served_listener(self, listener: ServedListener) -> None:
        self._served_listeners.append(listener)

    def held_series_of(self, event: CountableEvent) -> SeriesRef | None:
        """A series ``event`` incremented that is still shown as zeros, or None: a served render shows
        the event's increments now (all its series are out of their hold)."""
        if isinstance(event, JobCreated):
            ref = event.runtime_ref
            candidates: tuple[tuple[Family, LabelValues], ...] = (
                (self.created, (event.namespace, ref)),
                *(((self.requested_nodes, (ref,)),) if event.nodes_observed else ()),
                *(
                    (self.requested_accelerators, (cls, ref))
                    for cls, _ in (event.accelerators if event.accelerators_observed else ())
                ),
            )
        elif isinstance(event, JobFinished):
            candidates = (
                (self.finished, (event.result, event.reason, event.runtime_ref)),
                (self.lifetime, (event.result, event.runtime_ref)),
            )
        elif isinstance(event, JobStarted):
            candidates = ((self.startup, (event.runtime_ref,)),)
        else:
            candidates = ((self.admission_wait, (event.runtime_ref,)),)
        for family, key in candidates:
            if family.held(key):
                return family.name, key
        return None

    @property
    def held_series(self) -> int:
        """Series currently shown as zeros."""
        return sum(family.held_count for family in self._counting)

    def _serve(self) -> tuple[float, list[SeriesRef]]:
        """Before a served render: end and start holds (O(series whose hold ends or starts))."""
        hold = self._zero_hold
        now = self._clock()
        released: list[SeriesRef] = []
        if hold is not None:
            for family in self._counting:
                released.extend((family.name, key) for key in family.serve(now, hold))
            if released:
                self._series.invalidate()
        return now, released

    def _served(self, now: float, released: list[SeriesRef]) -> None:
        """After a served render: tell the listeners (the body they are told about is the one built)."""
        for listener in self._served_listeners:
            listener(now, released)

    # --- rendering ---------------------------------------------------------------------------------

    @property
    def families(self) -> tuple[Family, ...]:
        """The families, in exposition order."""
        return self._series.families

    @property
    def series_count(self) -> int:
        """Number of series (label sets) currently held, all families together."""
        self._before_read()
        return self._series.series_count

    def render_text(self) -> bytes:
        """All families in the Prometheus text format 0.0.4, from the per-series cache.

        A served render (a scrape): it moves the zero holds on (see the module docstring)."""
        self._before_read()
        served = self._serve()
        body = self._series.text()
        self._served(*served)
        return body

    def render_openmetrics(self) -> bytes:
        """All families in OpenMetrics 1.0, WITHOUT the final ``# EOF`` line.

        The exposition layer concatenates this with the self-telemetry and ends the whole body with
        one ``# EOF``. As fast as the text format: Prometheus prefers OpenMetrics in its default
        Accept header, so this is what a real scrape usually gets. The tests compare it with
        prometheus_client's OpenMetrics exposition of :class:`TrainerCollector`.
        """
        self._before_read()
        served = self._serve()
        body = self._series.openmetrics()
        self._served(*served)
        return body

    def render_protobuf(self) -> bytes:
        """All families with series as delimited protobuf MetricFamily messages, the histograms with their
        native buckets as well as their classic ones. A served render, as the other two."""
        self._before_read()
        served = self._serve()
        body = self._series.render(Format.PROTOBUF)
        self._served(*served)
        return body

    def collector(self) -> TrainerCollector:
        return TrainerCollector(self)

    def metrics(self) -> Iterator[Metric]:
        """The families as prometheus_client metric families (for the Collector)."""
        self._before_read()
        return self._series.metrics()

    def _before_read(self) -> None:
        """Before anything reads the families: the runtime snapshot if stale, the pending gauge moves."""
        self.apply_pending_gauges()
        if not self._runtimes_stale or self._runtime_provider is None:
            return
        self._runtimes_stale = False
        self.runtime_info.replace_all(
            (r.namespace, r.name, r.api_group, r.kind, r.ml_policy, r.pod_group_policy, r.framework)
            for r in self._runtime_provider()
        )
        if self.runtime_info.changed:
            self._series.invalidate()


class TrainerCollector:
    """A prometheus_client ``Collector`` over a :class:`TrainerMetricState` (same state, same order)."""

    def __init__(self, state: TrainerMetricState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        return self._state.metrics()
