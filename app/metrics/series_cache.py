"""Prometheus series kept as plain numbers plus their rendered text, cached per series.

Why not prometheus-client's Counter/Histogram with a registry: its exposition renders every sample of
every series on every scrape (~60-100k samples/s), so a scrape of a few thousand histogram series costs
tens of milliseconds and grows with activity. Like kube-state-metrics, we keep the rendered text of
each series (one label set: all its bucket/count/sum lines) as one ``bytes`` chunk:

* an update changes the numbers of one series and marks it dirty (O(1));
* at most every ``publish_interval`` (checked every ``flush_every`` changes), the dirty series are
  re-rendered and the blocks (runs of ~16 KB of consecutive series) that hold them re-joined, a fraction
  of a millisecond on the event loop. A series that changes a thousand times in an interval is rendered
  once: under a watch firehose every gauge series moves on nearly every event, and rendering per change
  (as every 32 changes did) cost the loop more than the scrapes it served;
* a scrape flushes what is left and collects the parts (family headers and blocks) into a tuple, kept
  until the next change, so repeated scrapes of an unchanged state cost nothing. A gzip scrape compresses
  the parts one by one (app/metrics/deflate_parts.py) and never joins them: the joined body, one more
  uncompressed copy of the whole text (~175 B a watched pod), is made only for an uncompressed scrape,
  and kept until the next change too.

A scrape therefore costs the formatting of what changed since the last publish (at most
``publish_interval`` of activity), plus one memcpy of the body when uncompressed, and nothing per object
behind the numbers.

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
``# EOF``), exemplars included: ``Family.metric()`` gives the same state as prometheus_client metric
families, which the tests render for comparison. The two text formats share the series chunks (only
family headers differ) unless the family carries exemplars. The protobuf exposition (app/metrics/protobuf.py,
native histograms included) is a third chunk per series, cached, flushed and joined the same way, rendered
only once a scrape asked for it (app/metrics/cached_family.py, "Formats").

Everything here runs on the event loop thread: there is no lock, so do not call it from a thread pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric

from app.metrics import protobuf as pb
from app.metrics.cached_family import Family, Format
from app.metrics.deflate_parts import Part, join_parts

__all__ = ["SeriesCache"]

# The owner's kept changes a deferred publish applies per loop step (``before_publish``): ~2-3 us each.
_STEP_BUDGET = 128
# Steps of one deferred publish at most: under a firehose the changes may come in as fast as the steps take
# them, and the publish flushes the families after this many, leaving the rest for the next publish.
_MAX_STEPS = 16


class SeriesCache:
    """Families in exposition order, with their parts and joined bodies cached (per format) until the next
    change.

    The owner calls ``changed()`` after updating a series (on the per-event path: one call) and
    ``invalidate()`` when something a render reads lazily went stale without a series changing yet.
    """

    __slots__ = (
        "_before_publish",
        "_bodies",
        "_changes",
        "_clock",
        "_defer",
        "_deferred",
        "_flush_every",
        "_next_publish",
        "_parts",
        "_publish_interval",
        "_steps",
        "families",
    )

    def __init__(
        self,
        families: Sequence[Family[Any]],
        *,
        flush_every: int,
        publish_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        before_publish: Callable[[int | None], bool] | None = None,
        defer: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        """``flush_every``: look at the clock after this many changes (0: render only at scrape), and
        re-render the touched series if ``publish_interval`` has passed since the last time.

        Rendering only at scrape would batch all the work of a scrape interval (at 1k events/s over
        15 s, every series) into the scrape; publishing every few tens of milliseconds keeps each flush
        well under a millisecond on the event loop and leaves a scrape only the final join.
        A series touched again before its flush is still rendered once. ``before_publish(budget)``:
        called before each publish, for an owner that keeps changes of its own to apply to the families
        first: all of them (``budget`` None), or at most ``budget``, returning whether none is left.
        ``defer``: runs a due publish later, as a step of its own (the service passes
        ``app.kube.priority.call_after_due_timers``); None: at once, inside the change that made it due.
        Under a watch firehose a publish (~1 ms) would otherwise lengthen the ingestion slice it falls in,
        which is how long a due timer or an arriving scrape waits (bench P5); a deferred publish applies the
        owner's changes ``_STEP_BUDGET`` at a time, a step each, at most ``_MAX_STEPS`` steps."""
        if flush_every < 0:
            raise ValueError("flush_every must be >= 0")
        if publish_interval < 0:
            raise ValueError("publish_interval must be >= 0")
        # Fixed order, so the output is stable.
        self.families: tuple[Family[Any], ...] = tuple(families)
        self._flush_every = flush_every
        self._publish_interval = publish_interval
        self._clock = clock
        self._next_publish = 0.0
        self._changes = 0
        self._before_publish = before_publish
        self._defer = defer
        self._deferred = False  # a publish is scheduled
        self._steps = 0  # steps the scheduled publish has taken
        # Per format, None while stale. The bodies are joined from the parts only when asked for: a gzip
        # scrape reads the parts alone.
        self._parts: list[tuple[Part, ...] | None] = [None] * len(Format)
        self._bodies: list[bytes | None] = [None] * len(Format)

    @property
    def series_count(self) -> int:
        return sum(len(f) for f in self.families)

    def changed(self) -> None:
        self.invalidate()
        self.tick()

    def tick(self, count: int = 1) -> None:
        """``count`` changes the owner keeps to apply at the next publish (``before_publish``): counted
        towards it like ``changed()``, without invalidating the bodies (a publish or a render will)."""
        if not self._flush_every:
            return
        self._changes += count
        if self._changes >= self._flush_every:
            self._changes = 0
            now = self._clock()
            if now >= self._next_publish:
                self._next_publish = now + self._publish_interval
                if self._defer is None:
                    self._publish()
                elif not self._deferred:
                    self._deferred = True
                    self._defer(self._deferred_publish)

    def _deferred_publish(self) -> None:
        # A render meanwhile flushed everything already: then this finds nothing to do.
        before = self._before_publish
        self._steps += 1
        if before is not None and not before(_STEP_BUDGET) and self._steps < _MAX_STEPS:
            assert self._defer is not None
            self._defer(self._deferred_publish)
            return
        self._deferred = False
        self._steps = 0
        self._flush()

    def _publish(self) -> None:
        if self._before_publish is not None:
            self._before_publish(None)
        self._flush()

    def _flush(self) -> None:
        for family in self.families:
            family.flush()

    def invalidate(self) -> None:
        parts = self._parts
        parts[0] = parts[1] = parts[2] = None
        bodies = self._bodies
        bodies[0] = bodies[1] = bodies[2] = None

    def text(self) -> bytes:
        """Every family in the text format 0.0.4; the same object while nothing changed."""
        return self.render(Format.TEXT)

    def openmetrics(self) -> bytes:
        """Every family in OpenMetrics 1.0, without the final ``# EOF`` (the caller ends the body)."""
        return self.render(Format.OPENMETRICS)

    def protobuf(self) -> bytes:
        """Every family with series as a delimited MetricFamily (empty families are left out)."""
        return self.render(Format.PROTOBUF)

    def render(self, fmt: Format) -> bytes:
        """The join of ``render_parts(fmt)``; the same object while nothing changed."""
        body = self._bodies[fmt]
        if body is None:
            body = self._bodies[fmt] = join_parts(self.render_parts(fmt))
        return body

    def render_parts(self, fmt: Format) -> tuple[Part, ...]:
        """The parts of ``fmt`` in order (family headers and blocks, objects the families keep while
        unchanged: bytes, or a ``DeflatedPart`` for a family that keeps its blocks compressed); the same
        tuple while nothing changed."""
        parts = self._parts[fmt]
        if parts is None:
            parts = self._parts[fmt] = self._collect(fmt)
        return parts

    def metrics(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.metric()

    def _collect(self, fmt: Format) -> tuple[Part, ...]:
        # One join over every header and block: unchanged blocks are not copied twice.
        parts: list[Part] = []
        for family in self.families:
            bodies = family.bodies(fmt)
            family.changed = False
            if fmt is Format.PROTOBUF:
                if bodies:  # Prometheus skips an empty MetricFamily; client_golang does not send one
                    parts.extend(pb.delimited(family.pb_header, bodies))
            else:
                parts.append(family.om_header if fmt is Format.OPENMETRICS else family.header)
                parts.extend(bodies)
        return tuple(parts)
