"""The three cached family kinds: counters, gauges and histograms, each its numbers per series and how a
series renders (text, OpenMetrics with exemplars, protobuf, and their zero versions) and converts to a
prometheus_client metric family.

Exemplars (counters and histograms, once ``enable_exemplars``): ``inc`` / ``observe`` take the exemplar of
the observation (app/metrics/exemplars.py); a counter keeps the last one, a histogram the last one per
bucket, as client libraries do. A series held at zero (born at zero) shows, on its zero values, the *first*
exemplar each counter or bucket received: the TrainJob that made the series appear is named from the first
scrape that shows the series, and its real values come with the latest exemplars. The text format has
none; OpenMetrics and protobuf carry them.

Its own module because the kinds are the engine's users, not its machinery (app/metrics/cached_family.py):
what they add is the per-kind numbers and the rendering on the per-event and per-flush path.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar as ClientExemplar

from app.metrics import protobuf as pb
from app.metrics.cached_family import Family
from app.metrics.exemplars import Exemplar, client_exemplar, openmetrics_suffix, protobuf_message
from app.metrics.formatting import LabelValues, floatToGoString
from app.metrics.formatting import fmt_int as _fmt_int
from app.metrics.native import NativeBuckets

__all__ = ["CounterFamily", "GaugeFamily", "HistogramFamily"]


_COUNTER_ZERO = pb.field_bytes(pb.METRIC_COUNTER, b"")


class CounterFamily(Family[LabelValues]):
    __slots__ = ("_first", "base_name", "exemplars", "values")

    def __init__(self, base_name: str, documentation: str, label_names: Sequence[str]) -> None:
        super().__init__(base_name + "_total", documentation, "counter", label_names)
        self.base_name = base_name  # the OpenMetrics family name has no _total
        self.values: dict[LabelValues, int] = {}
        self.exemplars: dict[LabelValues, Exemplar] = {}  # the last one per series
        self._first: dict[LabelValues, Exemplar] = {}  # the first one, of series held at zero

    def inc(self, key: LabelValues, exemplar: Exemplar | None = None) -> None:
        values = self.values
        if key in values:
            values[key] += 1
        else:
            values[key] = 1
            self._add_series(key)
            if exemplar is not None and self.held(key):
                self._first[key] = exemplar
        if exemplar is not None:
            self.exemplars[key] = exemplar
        self.touch(key)

    def clear(self) -> None:
        """Drop every series (a new leader term counts from zero)."""
        self.values = {}
        self.exemplars = {}
        self._first = {}
        self._clear()

    def _released(self, key: LabelValues) -> None:
        self._first.pop(key, None)

    def _render_series(self, key: LabelValues) -> bytes:
        return self._prefix(key) + _fmt_int(self.values[key]).encode() + b"\n"

    def _render_zero(self, key: LabelValues) -> bytes:
        return self._prefix(key) + b"0.0\n"

    def _render_openmetrics(self, key: LabelValues) -> bytes:
        suffix = openmetrics_suffix(self.exemplars.get(key))
        return self._prefix(key) + f"{_fmt_int(self.values[key])}{suffix}\n".encode("utf-8", "replace")

    def _render_zero_openmetrics(self, key: LabelValues) -> bytes:
        suffix = openmetrics_suffix(self._first.get(key))
        return self._prefix(key) + f"0.0{suffix}\n".encode("utf-8", "replace")

    def _render_protobuf(self, key: LabelValues) -> bytes:
        return self._pb_counter(key, float(self.values[key]), self.exemplars.get(key))

    def _render_zero_protobuf(self, key: LabelValues) -> bytes:
        first = self._first.get(key)
        if first is None:
            return pb.metric_field(self._pb_labels(key) + _COUNTER_ZERO)
        return self._pb_counter(key, 0.0, first)

    def _pb_counter(self, key: LabelValues, value: float, exemplar: Exemplar | None) -> bytes:
        counter = pb.field_double(1, value)
        if exemplar is not None and self._exemplars_on:
            counter += pb.field_bytes(2, protobuf_message(exemplar))
        return pb.metric_field(self._pb_labels(key) + pb.field_bytes(pb.METRIC_COUNTER, counter))

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.base_name, self.documentation, labels=self.label_names)
        exemplars = self.exemplars
        for key, value in self.values.items():
            exemplar = exemplars.get(key)
            family.add_metric(key, value, exemplar=client_exemplar(exemplar) if exemplar else None)
        return family


class GaugeFamily(Family[LabelValues]):
    __slots__ = ("values",)

    def __init__(self, name: str, documentation: str, label_names: Sequence[str]) -> None:
        super().__init__(name, documentation, "gauge", label_names)
        self.values: dict[LabelValues, int] = {}

    def set(self, key: LabelValues, value: int) -> None:
        """Set a series; 0 removes it (a state with no TrainJobs has no series, as in kube-state-metrics)."""
        values = self.values
        if value == 0:
            if key in values:
                del values[key]
                self._drop_series(key)
            return
        if key not in values:
            self._add_series(key)
        elif values[key] == value:
            return  # unchanged: keep the cached body
        values[key] = value
        self.touch(key)

    def replace_all(self, keys: Iterable[LabelValues]) -> None:
        """Replace every series by ``keys`` with value 1 (runtime_info is re-read as a whole)."""
        # Sorted so the inventory reads the same on every replica whatever order the snapshot has.
        unique = sorted(set(keys))
        if list(self.values) == unique:
            return
        self._clear()
        self.values = dict.fromkeys(unique, 1)
        for key in unique:
            self._add_series(key)
            self.touch(key)

    def _render_series(self, key: LabelValues) -> bytes:
        return self._prefix(key) + _fmt_int(self.values[key]).encode() + b"\n"

    def _render_protobuf(self, key: LabelValues) -> bytes:
        gauge = pb.field_bytes(pb.METRIC_GAUGE, pb.field_double(1, float(self.values[key])))
        return pb.metric_field(self._pb_labels(key) + gauge)

    def metric(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key, value in self.values.items():
            family.add_metric(key, value)
        return family


class HistogramFamily(Family[LabelValues]):
    """Classic buckets (``bounds``) and, for the protobuf exposition, native buckets (app/metrics/native.py)
    of the same observations: one count and one sum, so both views of a series always agree."""

    __slots__ = (
        "_first",
        "_le",
        "_pb_bounds",
        "_templates",
        "bounds",
        "counts",
        "exemplars",
        "native",
        "sums",
    )

    def __init__(
        self, name: str, documentation: str, label_names: Sequence[str], bounds: Sequence[float]
    ) -> None:
        if "le" in label_names:
            raise ValueError("a histogram cannot have a label named le")
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be strictly increasing")
        # ~2 KB per series: 8 series make blocks of the same ~16 KB as 64 counter series do.
        super().__init__(name, documentation, "histogram", label_names, block_series=8)
        self.bounds = tuple(float(b) for b in bounds)
        self._le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        # The upper_bound field of each protobuf Bucket, +Inf last (written out: its exemplar needs a place).
        self._pb_bounds = [pb.field_double(2, b) for b in (*self.bounds, math.inf)]
        # Per series: NON-cumulative counts per bucket (last = above the highest bound), and the sum.
        self.counts: dict[LabelValues, list[int]] = {}
        self.sums: dict[LabelValues, float] = {}
        self.native: dict[LabelValues, NativeBuckets] = {}
        # Per series and bucket: the last exemplar, and the first of series held at zero.
        self.exemplars: dict[LabelValues, list[Exemplar | None]] = {}
        self._first: dict[LabelValues, list[Exemplar | None]] = {}
        # Per series: the label parts of its lines, built once (escaping and sorting are most of the
        # cost of rendering a series, and its labels never change).
        self._templates: dict[LabelValues, tuple[str, str, str, str]] = {}

    def observe(self, key: LabelValues, value: float, exemplar: Exemplar | None = None) -> None:
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
            self.native[key] = NativeBuckets()
            self._add_series(key)
        # bisect_left: the first bound >= value, so a value equal to a bound falls in that bound's
        # bucket (le is inclusive, as in Prometheus).
        bucket = bisect_left(self.bounds, value)
        counts[bucket] += 1
        self.sums[key] += value
        self.native[key].observe(value)
        if exemplar is not None:
            self._exemplar(key, bucket, exemplar)
        self.touch(key)

    def _exemplar(self, key: LabelValues, bucket: int, exemplar: Exemplar) -> None:
        slots = self.exemplars.get(key)
        if slots is None:
            slots = self.exemplars[key] = [None] * (len(self.bounds) + 1)
        slots[bucket] = exemplar
        if self.held(key):
            first = self._first.get(key)
            if first is None:
                first = self._first[key] = [None] * (len(self.bounds) + 1)
            if first[bucket] is None:
                first[bucket] = exemplar
                self._dirty.add(key)  # its zero chunks show first exemplars: render them again
                self.changed = True

    def cumulative(self, key: LabelValues) -> list[int]:
        return list(itertools.accumulate(self.counts[key]))

    def clear(self) -> None:
        """Drop every series (a new leader term counts from zero). Templates stay: labels do not change."""
        self.counts = {}
        self.sums = {}
        self.native = {}
        self.exemplars = {}
        self._first = {}
        self._clear()

    def _released(self, key: LabelValues) -> None:
        self._first.pop(key, None)

    def _template(self, key: LabelValues) -> tuple[str, str, str, str]:
        name = self.name
        pairs = self._sorted_pairs(key)
        # "le" takes its sorted place among the other label names, as prometheus_client prints it.
        before = "".join(f'{n}="{v}",' for n, v in pairs if n < "le")
        after = "".join(f',{n}="{v}"' for n, v in pairs if n > "le")
        labels = self._labelstr(key)
        bucket_head, bucket_tail = f'{name}_bucket{{{before}le="', f'"{after}}} '
        return (bucket_head, bucket_tail, f"{name}_count{labels} ", f"{name}_sum{labels} ")

    def _template_of(self, key: LabelValues) -> tuple[str, str, str, str]:
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self._template(key)
        return template

    def _render_zero(self, key: LabelValues) -> bytes:
        head, tail, count_head, sum_head = self._template_of(key)
        lines = [f"{head}{le}{tail}0.0\n" for le in self._le]
        lines.append(f"{count_head}0.0\n{sum_head}0.0\n")
        return "".join(lines).encode()

    def _render_series(self, key: LabelValues) -> bytes:
        head, tail, count_head, sum_head = self._template_of(key)
        cumulative = self.cumulative(key)
        total = cumulative[-1]
        pairs = zip(self._le, cumulative, strict=True)
        if total < 1_000_000:  # every cumulative count is <= total: the "N.0" fast path holds for all
            lines = [f"{head}{le}{tail}{cum}.0\n" for le, cum in pairs]
        else:
            lines = [f"{head}{le}{tail}{_fmt_int(cum)}\n" for le, cum in pairs]
        lines.append(f"{count_head}{_fmt_int(total)}\n")
        lines.append(f"{sum_head}{floatToGoString(self.sums[key])}\n")
        return "".join(lines).encode()

    def _render_openmetrics(self, key: LabelValues) -> bytes:
        """The text lines with each bucket's exemplar after its value."""
        head, tail, count_head, sum_head = self._template_of(key)
        cumulative = self.cumulative(key)
        total = cumulative[-1]
        exemplars = self.exemplars.get(key) or [None] * len(cumulative)
        lines = [
            f"{head}{le}{tail}{_fmt_int(cum)}{openmetrics_suffix(ex)}\n"
            for le, cum, ex in zip(self._le, cumulative, exemplars, strict=True)
        ]
        lines.append(f"{count_head}{_fmt_int(total)}\n")
        lines.append(f"{sum_head}{floatToGoString(self.sums[key])}\n")
        return "".join(lines).encode("utf-8", "replace")

    def _render_zero_openmetrics(self, key: LabelValues) -> bytes:
        first = self._first.get(key)
        if first is None:
            return self._render_zero(key)
        head, tail, count_head, sum_head = self._template_of(key)
        lines = [
            f"{head}{le}{tail}0.0{openmetrics_suffix(ex)}\n" for le, ex in zip(self._le, first, strict=True)
        ]
        lines.append(f"{count_head}0.0\n{sum_head}0.0\n")
        return "".join(lines).encode("utf-8", "replace")

    def _render_protobuf(self, key: LabelValues) -> bytes:
        cumulative = self.cumulative(key)
        return self._pb_histogram(
            key, cumulative, self.sums[key], self.exemplars.get(key), self.native[key].fields()
        )

    def _render_zero_protobuf(self, key: LabelValues) -> bytes:
        zeros = [0] * (len(self.bounds) + 1)
        return self._pb_histogram(key, zeros, 0.0, self._first.get(key), _NATIVE_ZERO)

    def _pb_histogram(
        self,
        key: LabelValues,
        cumulative: list[int],
        total: float,
        exemplars: list[Exemplar | None] | None,
        native: bytes,
    ) -> bytes:
        """A Histogram Metric: count, sum, the classic buckets (with their exemplars), the native fields."""
        parts = [pb.field_varint(1, cumulative[-1]), pb.field_double(2, total)]
        if exemplars is None or not self._exemplars_on:
            for cum, bound in zip(cumulative, self._pb_bounds, strict=True):
                parts.append(pb.field_bytes(3, pb.field_varint(1, cum) + bound))
        else:
            for cum, bound, ex in zip(cumulative, self._pb_bounds, exemplars, strict=True):
                bucket = pb.field_varint(1, cum) + bound
                if ex is not None:
                    bucket += pb.field_bytes(3, protobuf_message(ex))
                parts.append(pb.field_bytes(3, bucket))
        parts.append(native)
        histogram = pb.field_bytes(pb.METRIC_HISTOGRAM, b"".join(parts))
        return pb.metric_field(self._pb_labels(key) + histogram)

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key in self.counts:
            cumulative = map(float, self.cumulative(key))
            exemplars = self.exemplars.get(key)
            if exemplars is None:
                buckets: list[tuple[str, float] | tuple[str, float, ClientExemplar]] = list(
                    zip(self._le, cumulative, strict=True)
                )
            else:
                buckets = [
                    (le, cum, client_exemplar(ex)) if ex is not None else (le, cum)
                    for le, cum, ex in zip(self._le, cumulative, exemplars, strict=True)
                ]
            family.add_metric(key, buckets, sum_value=self.sums[key])
        return family


_NATIVE_ZERO = NativeBuckets().fields()  # schema, zero threshold, no observation
