"""The Trainer metrics (docs/design/product.md §3): their definitions and the state behind them.

The series and their cached text are app/metrics/series_cache.py's; the counter and histogram families, and
what each Trainer event adds to them, are declared once in app/metrics/counted.py; this module keeps
their state beside the two gauges (runtime_info, trainjobs) and renders them. A scrape costs nothing
per TrainJob (docs/design/product.md §6, invariant 7). :class:`TrainerCollector` exposes the same state as a
regular prometheus-client ``Collector``: the tests compare its exposition with ours byte for byte.

What PromQL sees (docs/metrics.md, "How counting works"). With a ``zero_hold`` every counter and histogram
series is born at zero: ``render_text`` / ``render_openmetrics`` / ``render_protobuf`` / ``render_parts``
(the parts a gzip scrape compresses) are the *served* renders (one per scrape), and a series they show for
the first time is shown with all its values 0 for ``zero_hold`` seconds of served renders before its real
values (app/metrics/series_cache.py). Each leader term counts from zero (``reset_counts``): a term's series
are new to Prometheus (the leader's ``pod`` label), and a replica that leads again must not show what its
earlier term counted but nobody saw, since the next leader counted those again. Listeners
(``add_served_listener``) learn of every served render and of the series it released, so that the
hand-over can say what a scrape has shown (app/handover/served.py). Gauges are never held. The protobuf
render (native histograms included) is born at zero too, and the hand-over and the journal apply to it
unchanged, since it reads the same series, counts and holds.

Exemplars (``exemplars=True``): every counter and histogram observation carries the TrainJob behind it
(app/metrics/exemplars.py), shown in OpenMetrics and protobuf; never on the gauges, the per-TrainJob
families or the self-telemetry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, assert_never

from prometheus_client.metrics_core import Metric

from app.metrics.cached_family import Family, Format
from app.metrics.counted import FAMILIES, CountedFamily, Increment, series_of
from app.metrics.deflate_parts import Part
from app.metrics.exemplars import Exemplar, exemplar_ref
from app.metrics.family_kinds import CounterFamily, GaugeFamily, HistogramFamily
from app.metrics.formatting import LabelValues
from app.metrics.series_cache import SeriesCache
from app.trainer.events import CountableEvent, GaugeKey, RuntimeInfo

__all__ = [
    "RuntimeProvider",
    "SeriesRef",
    "ServedListener",
    "TrainerCollector",
    "TrainerMetricState",
]

RuntimeProvider = Callable[[], Iterable[RuntimeInfo]]
# One series: its family's name and its label values.
SeriesRef = tuple[str, LabelValues]
# Called after every served render: its time and the series whose hold it ended.
ServedListener = Callable[[float, list[SeriesRef]], None]
# Adds one increment to a counted family: (labels, value, exemplar).
_Add = Callable[[LabelValues, float, Exemplar | None], None]

_PREFIX = "kubeflow_trainer_"
_R = TypeVar("_R")  # what a served render returns


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
        extra_families: Sequence[Family[Any]] = (),
        exemplars: bool = False,
        defer_publish: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        """``flush_every``, ``publish_interval``, ``defer_publish`` (its ``defer``): see
        :class:`app.metrics.series_cache.SeriesCache`.
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
        # The counter and histogram families, declared in app/metrics/counted.py.
        self._counted: dict[CountedFamily, CounterFamily | HistogramFamily] = {
            spec: _build(spec) for spec in FAMILIES
        }
        self._counting = tuple(self._counted.values())
        self._add: dict[CountedFamily, _Add] = {
            spec: _adder(family) for spec, family in self._counted.items()
        }
        self.trainjobs = GaugeFamily(
            _PREFIX + "trainjobs",
            "Current TrainJobs by namespace, runtime and state.",
            ("namespace", "runtime_ref", "state"),
        )
        self._series = SeriesCache(
            (
                self.runtime_info,
                *self._counting,
                self.trainjobs,
                *extra_families,
            ),
            flush_every=flush_every,
            publish_interval=publish_interval,
            clock=clock,
            before_publish=self.apply_pending_gauges,
            defer=defer_publish,
        )
        self._pending_gauges: dict[GaugeKey, int] = {}
        self._gauge_moves = 0
        self._flush_every = flush_every
        self._zero_hold = zero_hold
        self._clock = clock
        # Every counter and histogram is born at zero (tests/metrics/test_born_at_zero.py).
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
        self._count(event, series_of(event))

    def count(self, event: CountableEvent) -> SeriesRef | None:
        """``on_countable``, then ``held_series_of``, the event's series looked up once (the served
        ledger's call for every counted event)."""
        increments = series_of(event)
        self._count(event, increments)
        return self._held_of(increments)

    def _count(self, event: CountableEvent, increments: Sequence[Increment]) -> None:
        if not increments:
            return
        add = self._add
        if self._exemplars:
            source = exemplar_ref(event)  # not the event: exemplars live as long as their series
            for family, labels, value in increments:
                add[family](labels, value, (source, value))
        else:
            for family, labels, value in increments:
                add[family](labels, value, None)
        self._series.changed()

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

    def apply_pending_gauges(self, budget: int | None = None) -> bool:
        """Apply the TrainJob gauge moves kept so far, or ``budget`` of them; True when none is left.
        Every render applies all (as must readers of ``trainjobs``); a deferred publish a budget per
        step: under a firehose a publish interval keeps hundreds, each a series that appears or goes."""
        pending = self._pending_gauges
        if not pending:
            return True
        if budget is None or len(pending) <= budget:
            self._pending_gauges = {}
            moves: Iterable[tuple[GaugeKey, int]] = pending.items()
        else:
            # Each key holds its latest value, so the order they are applied in does not matter.
            moves = [pending.popitem() for _ in range(budget)]
        family = self.trainjobs
        for key, value in moves:
            family.set(key, value)
        if family.changed:
            self._series.invalidate()
        return not self._pending_gauges

    def on_runtimes_changed(self) -> None:
        # Re-read lazily at the next scrape: a burst of runtime events costs one snapshot read.
        self._runtimes_stale = True
        self._series.invalidate()

    # --- counting ----------------------------------------------------------------------------------

    def counter(self, spec: CountedFamily) -> CounterFamily:
        """The counter family ``spec`` declares (app/metrics/counted.py), for readers of its values."""
        family = self._counted[spec]
        if not isinstance(family, CounterFamily):
            raise TypeError(f"{spec.name} is a {spec.kind}")
        return family

    def histogram(self, spec: CountedFamily) -> HistogramFamily:
        """The histogram family ``spec`` declares (app/metrics/counted.py), for readers of its values."""
        family = self._counted[spec]
        if not isinstance(family, HistogramFamily):
            raise TypeError(f"{spec.name} is a {spec.kind}")
        return family

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
        return self._held_of(series_of(event))

    def _held_of(self, increments: Sequence[Increment]) -> SeriesRef | None:
        for spec, labels, _ in increments:
            family = self._counted[spec]
            if family.held(labels):
                return family.name, labels
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
    def families(self) -> tuple[Family[Any], ...]:
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
        return self._served_render(self._series.text)

    def render_openmetrics(self) -> bytes:
        """All families in OpenMetrics 1.0, WITHOUT the final ``# EOF`` line.

        The exposition layer concatenates this with the self-telemetry and ends the whole body with
        one ``# EOF``. As fast as the text format: Prometheus prefers OpenMetrics in its default
        Accept header, so this is what a real scrape usually gets. The tests compare it with
        prometheus_client's OpenMetrics exposition of :class:`TrainerCollector`.
        """
        return self._served_render(self._series.openmetrics)

    def render_protobuf(self) -> bytes:
        """All families with series as delimited protobuf MetricFamily messages, the histograms with their
        native buckets as well as their classic ones. A served render, as the other two."""
        return self._served_render(lambda: self._series.render(Format.PROTOBUF))

    def render_parts(self, fmt: Format) -> tuple[Part, ...]:
        """The parts whose join is ``fmt``'s body, the same tuple while nothing changed
        (``SeriesCache.render_parts``): what a gzip scrape compresses, without the joined body. A served
        render, as the other three."""
        return self._served_render(lambda: self._series.render_parts(fmt))

    def _served_render(self, render: Callable[[], _R]) -> _R:
        """``render()`` as a served render: the holds move on before it, the listeners hear of it after."""
        self._before_read()
        served = self._serve()
        out = render()
        self._served(*served)
        return out

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


def _build(spec: CountedFamily) -> CounterFamily | HistogramFamily:
    match spec.kind:
        case "counter":
            return CounterFamily(spec.name, spec.help, spec.labels)
        case "histogram":
            return HistogramFamily(spec.name, spec.help, spec.labels, spec.buckets)
        case _:
            assert_never(spec.kind)


def _adder(family: CounterFamily | HistogramFamily) -> _Add:
    match family:
        case CounterFamily():
            inc = family.inc
            return lambda labels, _value, exemplar: inc(labels, exemplar)
        case HistogramFamily():
            return family.observe
        case _:
            assert_never(family)


class TrainerCollector:
    """A prometheus_client ``Collector`` over a :class:`TrainerMetricState` (same state, same order)."""

    def __init__(self, state: TrainerMetricState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        return self._state.metrics()
