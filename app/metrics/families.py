"""The three cached family kinds: counters, gauges and histograms, each its numbers per series and how a
series renders (text and zero text) and converts to a prometheus_client metric family.

Its own module because the kinds are the engine's users, not its machinery (app/metrics/family.py): what
they add is the per-kind numbers and the rendering on the per-event and per-flush path.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from app.metrics.family import Family
from app.metrics.formatting import LabelValues, floatToGoString
from app.metrics.formatting import fmt_int as _fmt_int

__all__ = ["CounterFamily", "GaugeFamily", "HistogramFamily"]


class CounterFamily(Family):
    __slots__ = ("base_name", "values")

    def __init__(self, base_name: str, documentation: str, label_names: Sequence[str]) -> None:
        super().__init__(base_name + "_total", documentation, "counter", label_names)
        self.base_name = base_name  # the OpenMetrics family name has no _total
        self.values: dict[LabelValues, int] = {}

    def inc(self, key: LabelValues) -> None:
        values = self.values
        if key in values:
            values[key] += 1
        else:
            values[key] = 1
            self._add_series(key)
        self.touch(key)

    def clear(self) -> None:
        """Drop every series (a new leader term counts from zero)."""
        self.values = {}
        self._clear()

    def _render_series(self, key: LabelValues) -> bytes:
        return self._prefix(key) + _fmt_int(self.values[key]).encode() + b"\n"

    def _render_zero(self, key: LabelValues) -> bytes:
        return self._prefix(key) + b"0.0\n"

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.base_name, self.documentation, labels=self.label_names)
        for key, value in self.values.items():
            family.add_metric(key, value)
        return family


class GaugeFamily(Family):
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

    def metric(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key, value in self.values.items():
            family.add_metric(key, value)
        return family


class HistogramFamily(Family):
    __slots__ = ("_le", "_templates", "bounds", "counts", "sums")

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
        # Per series: NON-cumulative counts per bucket (last = above the highest bound), and the sum.
        self.counts: dict[LabelValues, list[int]] = {}
        self.sums: dict[LabelValues, float] = {}
        # Per series: the label parts of its lines, built once (escaping and sorting are most of the
        # cost of rendering a series, and its labels never change).
        self._templates: dict[LabelValues, tuple[str, str, str, str]] = {}

    def observe(self, key: LabelValues, value: float) -> None:
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
            self._add_series(key)
        # bisect_left: the first bound >= value, so a value equal to a bound falls in that bound's
        # bucket (le is inclusive, as in Prometheus).
        counts[bisect_left(self.bounds, value)] += 1
        self.sums[key] += value
        self.touch(key)

    def cumulative(self, key: LabelValues) -> list[int]:
        return list(itertools.accumulate(self.counts[key]))

    def clear(self) -> None:
        """Drop every series (a new leader term counts from zero). Templates stay: labels do not change."""
        self.counts = {}
        self.sums = {}
        self._clear()

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

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key in self.counts:
            buckets = list(zip(self._le, map(float, self.cumulative(key)), strict=True))
            family.add_metric(key, buckets, sum_value=self.sums[key])
        return family
