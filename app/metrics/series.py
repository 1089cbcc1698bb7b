"""Prometheus series kept as plain numbers plus their rendered text, cached per series.

Why not prometheus-client's Counter/Histogram with a registry: its exposition renders every sample of
every series on every scrape (~60-100k samples/s), so a scrape of a few thousand histogram series costs
tens of milliseconds and grows with activity. Like kube-state-metrics, we keep the rendered text of
each series (one label set: all its bucket/count/sum lines) as one ``bytes`` chunk:

* an update changes the numbers of one series and marks it dirty (O(1));
* every ``flush_every`` changes, the dirty series are re-rendered and the blocks (runs of ~16 KB of
  consecutive series) that hold them re-joined, a fraction of a millisecond on the event loop;
* a scrape flushes what is left and joins the blocks; the joined body is kept until the next change,
  so repeated scrapes of an unchanged state cost nothing.

A scrape therefore costs one memcpy of the body plus the formatting of at most ``flush_every``
changes, and nothing per object behind the numbers.

Born at zero (``Family.enable_hold``, counters and histograms only). PromQL never counts the first
sample of a series: a series first scraped at 1 hides its first increment from ``increase()`` and
``rate()``. A family with a hold renders a new series with all its values 0 (the zero text is its chunk,
cached like any other) from the first render that is *served* (``serve(now, hold)``, once per scrape)
until ``hold`` seconds later; the first served render after that shows the real values. Every scraper
whose interval is at most ``hold`` therefore stores the 0 first. The hold check of a scrape costs
O(series whose hold starts or ends), never O(series): held series wait in a queue ordered by release
time. ``metric()`` (the prometheus_client view) always gives the real values.

The text is byte-for-byte what ``prometheus_client.generate_latest`` prints for the same state
(label order, float formatting, escaping, histogram sample order), and the OpenMetrics rendering
byte-for-byte what ``prometheus_client.openmetrics.exposition.generate_latest`` prints (minus its
``# EOF``): ``Family.metric()`` gives the same state as prometheus_client metric families, which the
tests render for comparison. Both formats share the series chunks: only family headers differ.

Everything here runs on the event loop thread: there is no lock, so do not call it from a thread pool.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string

__all__ = [
    "CounterFamily",
    "Family",
    "GaugeFamily",
    "HistogramFamily",
    "LabelValues",
    "SeriesCache",
    "escape_label_value",
]

LabelValues = tuple[str, ...]

# prometheus_client ships it untyped; pin its type once here for mypy --strict.
floatToGoString: Callable[[float], str] = _untyped_float_to_go_string


def escape_label_value(value: str) -> str:
    r"""Escape a label value for the text formats: ``\`` → ``\\``, newline → ``\n``, ``"`` → ``\"``."""
    # Same order as prometheus_client (backslash first, so the escapes added after are not doubled).
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _fmt_int(n: int) -> str:
    # floatToGoString(float(n)) without the float round trip for the common case; from 1e6 on, Go (and
    # so prometheus_client) switches to exponent notation ("1.234567e+06"), so defer to it there.
    if 0 <= n < 1_000_000:
        return f"{n}.0"
    return floatToGoString(float(n))


class _Block:
    """A run of consecutive series of one family and their joined text.

    Why blocks: joining tens of thousands of small chunks scattered over the heap is slow (cache and
    TLB misses: ~5-10 ms for 7 MB measured, against ~1 ms from a few thousand contiguous blocks).
    A change re-joins only the blocks it touched; a scrape joins the blocks."""

    __slots__ = ("body", "chunks")

    def __init__(self) -> None:
        self.chunks: dict[LabelValues, bytes] = {}
        self.body: bytes | None = None


class Family:
    """One metric family: a rendered chunk per series, grouped in blocks, and the series to re-render."""

    __slots__ = (
        "_block_of",
        "_block_series",
        "_blocks",
        "_dirty",
        "_held",
        "_holds",
        "_order",
        "_prefixes",
        "_releases",
        "_unserved",
        "changed",
        "documentation",
        "header",
        "label_names",
        "name",
        "om_header",
    )

    def __init__(
        self, name: str, documentation: str, mtype: str, label_names: Sequence[str], *, block_series: int = 64
    ) -> None:
        self.name = name  # name on the HELP/TYPE lines of the text format (counters: with _total)
        self.documentation = documentation
        self.label_names = tuple(label_names)
        self.header = f"# HELP {name} {_escape_help(documentation)}\n# TYPE {name} {mtype}\n".encode()
        # OpenMetrics differs only in the family name of counters (no _total) and HELP escaping; the
        # sample lines are the same, so both formats share the series chunks.
        om_name = name.removesuffix("_total") if mtype == "counter" else name
        om_help = _escape_help(documentation).replace('"', r"\"")
        self.om_header = f"# HELP {om_name} {om_help}\n# TYPE {om_name} {mtype}\n".encode()
        # The text format lists labels sorted by name; keys keep the declared order.
        self._order = sorted(range(len(self.label_names)), key=lambda i: self.label_names[i])
        # A new series always goes to the last block, and the state dicts of the subclasses insert
        # and delete keys at the same moments, so blocks (in order) list series in the same order as
        # the state dicts: the text and the Collector agree byte for byte.
        self._block_series = block_series
        self._blocks: list[_Block] = []
        self._block_of: dict[LabelValues, _Block] = {}
        self._dirty: set[LabelValues] = set()
        self._prefixes: dict[LabelValues, bytes] = {}
        self.changed = False  # anything changed since the last render (cleared by SeriesCache)
        # Born at zero (see the module docstring): series rendered as zeros, those among them no served
        # render has shown yet (their hold has not started), and (release time, series) in time order.
        self._holds = False
        self._held: set[LabelValues] = set()
        self._unserved: list[LabelValues] = []
        self._releases: deque[tuple[float, LabelValues]] = deque()

    def __len__(self) -> int:
        return len(self._block_of)

    def enable_hold(self) -> None:
        """Render every series added from now on as zeros until ``serve`` releases it."""
        self._holds = True

    def held(self, key: LabelValues) -> bool:
        """``key`` is shown as zeros (its real values are not served yet)."""
        return key in self._held

    @property
    def held_count(self) -> int:
        return len(self._held)

    def serve(self, now: float, hold: float) -> list[LabelValues]:
        """A render at ``now`` is about to be served: release the series whose hold has ended (they are
        re-rendered with their real values) and start the hold of those this render shows for the first
        time (released at the first served render at or after ``now + hold``: never this one, even with
        ``hold`` 0). Returns the released series."""
        released: list[LabelValues] = []
        releases = self._releases
        while releases and releases[0][0] <= now:
            key = releases.popleft()[1]
            self._held.discard(key)
            self._dirty.add(key)
            released.append(key)
        if released:
            self.changed = True
        if self._unserved:
            at = now + hold
            releases.extend((at, key) for key in self._unserved)
            self._unserved = []
        return released

    def _add_series(self, key: LabelValues) -> None:
        blocks = self._blocks
        if not blocks or len(blocks[-1].chunks) >= self._block_series:
            blocks.append(_Block())
        block = blocks[-1]
        block.chunks[key] = b""  # placeholder holding the key's position; rendered at the next scrape
        self._block_of[key] = block
        if self._holds:
            self._held.add(key)
            self._unserved.append(key)

    def _drop_series(self, key: LabelValues) -> None:
        self._prefixes.pop(key, None)
        block = self._block_of.pop(key)
        del block.chunks[key]
        block.body = None
        if not block.chunks:
            self._blocks.remove(block)  # O(blocks), only when a block empties
        self._dirty.discard(key)
        self.changed = True

    def _clear(self) -> None:
        self._blocks = []
        self._block_of = {}
        self._dirty = set()
        self._prefixes = {}
        self._held = set()
        self._unserved = []
        self._releases = deque()
        self.changed = True

    def touch(self, key: LabelValues) -> None:
        """Re-render ``key`` at the next flush; also for numbers its owner changed in place."""
        if key in self._held and self._block_of[key].chunks[key]:
            return  # its zero text is rendered already and stays until the release
        self._dirty.add(key)
        self.changed = True

    def _sorted_pairs(self, key: LabelValues) -> list[tuple[str, str]]:
        names = self.label_names
        return [(names[i], escape_label_value(key[i])) for i in self._order]

    def _labelstr(self, key: LabelValues) -> str:
        if not key:
            return ""
        return "{" + ",".join(f'{n}="{v}"' for n, v in self._sorted_pairs(key)) + "}"

    def _prefix(self, key: LabelValues) -> bytes:
        """``name{labels} `` of a single-sample series, escaped and sorted once per series: the hot
        path re-renders only the value (two gauge series move on every TrainJob state change)."""
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefixes[key] = f"{self.name}{self._labelstr(key)} ".encode()
        return prefix

    def _render_series(self, key: LabelValues) -> bytes:
        raise NotImplementedError

    def _render_zero(self, key: LabelValues) -> bytes:
        """The series with every value 0 (born at zero); only families with a hold use it."""
        raise NotImplementedError

    def metric(self) -> Metric:
        """The family as a prometheus_client metric family, series in the same order as the text."""
        raise NotImplementedError

    def flush(self) -> None:
        """Re-render the dirty series and re-join the blocks they are in."""
        if not self._dirty:
            return
        block_of = self._block_of
        render = self._render_series
        held = self._held
        blocks: dict[int, _Block] = {}
        for key in self._dirty:
            block = block_of[key]
            block.chunks[key] = self._render_zero(key) if key in held else render(key)
            blocks[id(block)] = block
        self._dirty.clear()
        for block in blocks.values():
            block.body = b"".join(block.chunks.values())

    def bodies(self) -> list[bytes]:
        """The joined blocks, up to date. The caller puts the header before them."""
        self.flush()
        out = []
        for block in self._blocks:
            body = block.body
            if body is None:  # a series was dropped from it
                body = block.body = b"".join(block.chunks.values())
            out.append(body)
        return out


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


class SeriesCache:
    """Families in exposition order, with their joined bodies cached until the next change.

    The owner calls ``changed()`` after updating a series (on the per-event path: one call) and
    ``invalidate()`` when something a render reads lazily went stale without a series changing yet.
    """

    __slots__ = ("_changes", "_flush_every", "_openmetrics", "_text", "families")

    def __init__(self, families: Sequence[Family], *, flush_every: int) -> None:
        """``flush_every``: re-render touched series after this many changes (0: only at scrape).

        Rendering only at scrape would batch all the work of a scrape interval (at 1k events/s over
        15 s, every series) into the scrape; flushing every few dozen changes keeps each flush well
        under a millisecond on the event loop and leaves a scrape only the final join.
        A series touched again before its flush is still rendered once."""
        if flush_every < 0:
            raise ValueError("flush_every must be >= 0")
        # Fixed order, so the output is stable.
        self.families: tuple[Family, ...] = tuple(families)
        self._flush_every = flush_every
        self._changes = 0
        self._text: bytes | None = None
        self._openmetrics: bytes | None = None

    @property
    def series_count(self) -> int:
        return sum(len(f) for f in self.families)

    def changed(self) -> None:
        self._text = None
        self._openmetrics = None
        if not self._flush_every:
            return
        self._changes += 1
        if self._changes >= self._flush_every:
            self._changes = 0
            for family in self.families:
                family.flush()

    def invalidate(self) -> None:
        self._text = None
        self._openmetrics = None

    def text(self) -> bytes:
        """Every family in the text format 0.0.4; the same object while nothing changed."""
        text = self._text
        if text is None:
            text = self._text = self._join(openmetrics=False)
        return text

    def openmetrics(self) -> bytes:
        """Every family in OpenMetrics 1.0, without the final ``# EOF`` (the caller ends the body)."""
        body = self._openmetrics
        if body is None:
            body = self._openmetrics = self._join(openmetrics=True)
        return body

    def metrics(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.metric()

    def _join(self, *, openmetrics: bool) -> bytes:
        # One join over every header and block: unchanged blocks are not copied twice.
        parts: list[bytes] = []
        for family in self.families:
            parts.append(family.om_header if openmetrics else family.header)
            parts.extend(family.bodies())
            family.changed = False
        return b"".join(parts)
