"""Self-telemetry of informers, exported by every replica.

The informer's hot path only bumps plain ints on a slotted ``InformerCounters``; a custom Collector turns
them into metric families at scrape time (no prometheus_client child lookups or locks per event), and
computes ages from the informers' clock timestamps when scraped. Labels are bounded: ``informer`` is
"<resource>" or "<resource>/<namespace>" from configuration, the others come from fixed vocabularies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

# Fixed label vocabularies, so cardinality never depends on what the API server sends.
RELIST_REASONS = (
    "expired",  # 410: watch ERROR event, HTTP 410 on watch, or an expired continue token
    "too_large_rv",  # 504 "Too large resource version" on a LIST with our RV: consistent read instead
    "watch_error",  # other ERROR event inside a watch stream
    "watch_failed",  # watch request answered with an HTTP error (5xx, 401, ...)
    "oversized_line",  # a watch line above max_object_bytes was skipped
    "internal",  # an unexpected exception in the informer itself
)
WATCH_RESTART_REASONS = (
    "closed",  # clean end of stream (server timeoutSeconds, LB cut-off): re-watch at once
    "inactivity",  # nothing received within inactivity_timeout: treated as a dead connection
    "reset",  # connection broke mid-stream
    "refused",  # could not connect / no response
    "throttled",  # 429
    "short",  # closed within a second with nothing received
    "expired",  # 410 (ERROR event or HTTP): relist
    "error",  # other ERROR event or HTTP error: backoff + relist
    "oversized_line",  # a line above max_object_bytes: skipped, then relist
)
SKIP_REASONS = ("malformed", "too_large", "handler_error")
SYNC_METHODS = ("list", "streaming")  # a paginated LIST, or a streaming list (watch with sendInitialEvents)


class InformerCounters:
    """Monotonic counts kept by one informer. Plain attribute increments on the hot path."""

    __slots__ = (
        "added",
        "bookmark",
        "deleted",
        "error",
        "lists",
        "modified",
        "relists",
        "skipped",
        "sync_failures",
        "watch_restarts",
    )

    def __init__(self) -> None:
        self.added = 0
        self.modified = 0
        self.deleted = 0
        self.bookmark = 0
        self.error = 0
        self.lists = 0  # complete lists applied (the first and every relist): each ends a transient peak
        self.relists = dict.fromkeys(RELIST_REASONS, 0)
        self.watch_restarts = dict.fromkeys(WATCH_RESTART_REASONS, 0)
        self.skipped = dict.fromkeys(SKIP_REASONS, 0)
        self.sync_failures = dict.fromkeys(SYNC_METHODS, 0)

    def events(self) -> tuple[tuple[str, int], ...]:
        return (
            ("ADDED", self.added),
            ("MODIFIED", self.modified),
            ("DELETED", self.deleted),
            ("BOOKMARK", self.bookmark),
            ("ERROR", self.error),
        )


class InformerView(Protocol):
    """What the collector reads from an informer at scrape time."""

    @property
    def name(self) -> str: ...
    @property
    def synced(self) -> bool: ...
    @property
    def stale(self) -> bool: ...
    @property
    def streaming_list(self) -> bool: ...
    @property
    def last_event(self) -> float: ...  # clock() of the last event, bookmark or completed list
    def __len__(self) -> int: ...


class InformerTelemetry(Collector):
    """One per registry; every informer registers itself and gets its counters back."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock  # the informers' clock: ages are differences of its readings
        self._informers: dict[str, tuple[InformerView, InformerCounters]] = {}
        if registry is not None:
            registry.register(self)

    def register(self, informer: InformerView) -> InformerCounters:
        if informer.name in self._informers:
            raise ValueError(f"informer {informer.name!r} is already registered")
        counters = InformerCounters()
        self._informers[informer.name] = (informer, counters)
        return counters

    def unregister(self, name: str) -> None:
        self._informers.pop(name, None)

    def lists_applied(self) -> int:
        """Complete lists applied by every registered informer so far (heap trims follow them)."""
        return sum(counters.lists for _, counters in self._informers.values())

    def counters(self, name: str) -> InformerCounters | None:
        entry = self._informers.get(name)
        return entry[1] if entry else None

    def describe(self) -> Iterator[Metric]:
        # Declares the families without sampling informers (registration must not depend on their state).
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        synced, objects, events, relists, restarts, age, stale, skipped, streaming, failures = families
        now = self._clock()
        for name, (informer, c) in list(self._informers.items()):
            synced.add_metric([name], 1.0 if informer.synced else 0.0)
            objects.add_metric([name], float(len(informer)))
            stale.add_metric([name], 1.0 if informer.stale else 0.0)
            age.add_metric([name], max(0.0, now - informer.last_event))
            for event_type, count in c.events():
                events.add_metric([name, event_type], count)
            for reason, count in c.relists.items():
                relists.add_metric([name, reason], count)
            for reason, count in c.watch_restarts.items():
                restarts.add_metric([name, reason], count)
            for reason, count in c.skipped.items():
                skipped.add_metric([name, reason], count)
            streaming.add_metric([name], 1.0 if informer.streaming_list else 0.0)
            for method, count in c.sync_failures.items():
                failures.add_metric([name, method], count)
        return iter(families)

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
    ]:
        p = "trainer_metrics_informer_"
        return (
            GaugeMetricFamily(
                p + "synced", "1 once the informer's initial list completed.", labels=["informer"]
            ),
            GaugeMetricFamily(p + "objects", "Objects held in the informer cache.", labels=["informer"]),
            CounterMetricFamily(p + "events", "Watch events received, by type.", labels=["informer", "type"]),
            CounterMetricFamily(
                p + "relists",
                "LISTs after the initial one (410 Expired, broken watches, errors), by reason.",
                labels=["informer", "reason"],
            ),
            CounterMetricFamily(
                p + "watch_restarts",
                "Watch streams that ended and were restarted, by reason.",
                labels=["informer", "reason"],
            ),
            GaugeMetricFamily(
                p + "last_event_age_seconds",
                "Seconds since the last watch event, bookmark or completed list.",
                labels=["informer"],
            ),
            GaugeMetricFamily(
                p + "stale",
                "1 when nothing was received within the inactivity timeout (or not connected that long).",
                labels=["informer"],
            ),
            CounterMetricFamily(
                p + "skipped_objects",
                "Objects or lines skipped: malformed, too large, or a handler that raised.",
                labels=["informer", "reason"],
            ),
            GaugeMetricFamily(
                p + "streaming_list",
                "1 while syncs use the streaming list (watch with sendInitialEvents); 0 for the paginated "
                "LIST, configured or fallen back to.",
                labels=["informer"],
            ),
            CounterMetricFamily(
                p + "sync_failures",
                "Syncs (initial or relist) that failed before completing and were retried, by method: a "
                "paginated LIST, or a streaming list.",
                labels=["informer", "method"],
            ),
        )
