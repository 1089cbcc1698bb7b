"""Self-telemetry exported by every replica (leader or not), under ``trainer_metrics_``.

It lives on its own small CollectorRegistry (not prometheus_client's global REGISTRY, so tests and
several app instances in one process do not collide). The informer telemetry
(app/kube/informer_telemetry.py) registers on the same registry: pass ``SelfTelemetry.registry``.
"""

from __future__ import annotations

import platform
from enum import StrEnum

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from app import __version__
from app.version import revision as source_revision

__all__ = ["Limit", "SelfTelemetry"]


class Limit(StrEnum):
    """The safety limits whose hits are counted, by the ``limit`` label value.

    A str, so that the layers below (app/kube, app/trainer), which must not import Prometheus code,
    report a hit with the plain value through their ``on_limit(str)`` hook; ``limit_hit`` rejects any
    other value, so a typo there fails loudly instead of exporting a new series.
    """

    UNKNOWN_RUNTIME_REFS = "unknown_runtime_refs"  # distinct runtime refs beyond the cap: "unknown"
    OBJECT_TOO_LARGE = "object_too_large"  # objects larger than max_object_bytes, skipped
    DEBUG_PAGE_SIZE = "debug_page_size"  # /debug/terminal pages above terminal_page_max, refused
    ACCELERATOR_CLASSES = "accelerator_classes"  # accelerator classes beyond the cap: "other"
    FAILURE_REASONS = "failure_reasons"  # well-formed failure reasons beyond the cap: "other"
    REQUESTED_QUANTITY = "requested_quantity"  # TrainJobs requesting above the ceilings: out of histograms
    HANDOVER_HISTORY = "handover_history"  # preempted jobs beyond what the Lease carries
    HANDOVER_UNCOVERED = "handover_uncovered"  # take-overs whose journal began above the floor (gap.py)
    POD_SERIES = "pod_series"  # pods beyond pod_series_max_pods: no pod_info series


# A `*_created` series per counter doubles the self-telemetry series for no operational value (the
# process start time is exported already). Process-wide, which is what we want in this service.
disable_created_metrics()  # type: ignore[no-untyped-call]


class SelfTelemetry:
    """The exporter's own metrics; implements the CountJournal's telemetry hooks."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        version: str = __version__,
        revision: str | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.leader = Gauge(
            "trainer_metrics_leader",
            "1 while this replica leads and exports the Trainer metrics, else 0.",
            registry=reg,
        )
        self.leader_transitions = Counter(
            "trainer_metrics_leader_transitions",
            "Times this replica started or stopped leading.",
            registry=reg,
        )
        self.build_info = Gauge(
            "trainer_metrics_build_info",
            "Build information (always 1): the version, the git revision (as --version prints it) and "
            "the Python version.",
            ("version", "revision", "python_version"),
            registry=reg,
        )
        built_from = revision if revision is not None else source_revision()
        self.build_info.labels(version, built_from, platform.python_version()).set(1)
        self.handover_replayed_events = Counter(
            "trainer_metrics_handover_replayed_events",
            "Remembered countable events counted when this replica took over leadership.",
            registry=reg,
        )
        self.handover_skipped_events = Counter(
            "trainer_metrics_handover_skipped_events",
            "Countable events skipped while leading because the previous leader had counted them.",
            registry=reg,
        )
        self.journal_overflow = Counter(
            "trainer_metrics_journal_overflow",
            "Countable events dropped from the hand-over journal because it was full.",
            registry=reg,
        )
        self.limit_hits = Counter(
            "trainer_metrics_limit_hits",
            "Times a safety limit was hit, by limit.",
            ("limit",),
            registry=reg,
        )
        for limit in Limit:
            self.limit_hits.labels(limit)  # export 0 from the start, so rate() and alerts see the series
        # How long each malloc_trim held the allocator (app/replica/heap_trim.py): the loop may wait that
        # long for malloc meanwhile.
        self.heap_trim_duration = Histogram(
            "trainer_metrics_heap_trim_duration_seconds",
            "Duration of each periodic malloc_trim that gives freed heap back to the kernel.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=reg,
        )
        # Own instances of the standard collectors: the module-level ones sit on the global REGISTRY.
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
        self._leading = False

    # --- CountJournal hooks ------------------------------------------------------------------------

    def set_leader(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            self.leader_transitions.inc()
        self.leader.set(1 if leading else 0)

    def handover_replayed(self, count: int) -> None:
        self.handover_replayed_events.inc(count)

    def handover_skipped(self, count: int) -> None:
        self.handover_skipped_events.inc(count)

    def journal_overflowed(self, count: int) -> None:
        self.journal_overflow.inc(count)

    # --- other engineers' hooks --------------------------------------------------------------------

    def limit_hit(self, limit: Limit | str, count: int = 1) -> None:
        """Count a safety-limit hit; ``limit`` is a :class:`Limit` or its value."""
        try:
            known = Limit(limit)
        except ValueError:
            raise ValueError(f"unknown limit {limit!r}") from None
        self.limit_hits.labels(known).inc(count)
