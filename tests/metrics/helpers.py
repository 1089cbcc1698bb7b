"""Shared builders for the metrics tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import JobAdmitted, JobCreated, JobFinished, JobStarted, PodFailed

REF = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"


def created(
    rv: int,
    *,
    ns: str = "team-a",
    ref: str = REF,
    nodes: int = 1,
    accel_class: str = "none",
    accel: int = 0,
    uid: str | None = None,
) -> JobCreated:
    return JobCreated(rv, uid or f"uid-{rv}", ns, ref, nodes, accel_class, accel)


def finished(
    rv: int,
    *,
    result: str = "succeeded",
    reason: str = "none",
    ref: str = REF,
    lifetime: float | None = 120.0,
    uid: str | None = None,
) -> JobFinished:
    return JobFinished(rv, uid or f"uid-{rv}", result, reason, ref, lifetime)


def started(rv: int, *, ref: str = REF, seconds: float = 42.0, uid: str | None = None) -> JobStarted:
    return JobStarted(rv, uid or f"uid-{rv}", ref, seconds)


def admitted(rv: int, *, ref: str = REF, seconds: float = 300.0, uid: str | None = None) -> JobAdmitted:
    return JobAdmitted(rv, uid or f"uid-{rv}", ref, seconds)


def pod_failed(
    rv: int, *, ref: str = REF, reason: str = "OOMKilled", uid: str | None = None, pod_uid: str | None = None
) -> PodFailed:
    return PodFailed(
        rv,
        uid or f"uid-{rv}",
        pod_uid or f"pod-{rv}",
        "default",
        ref,
        reason,
        key=f"default/job-{rv}",
        at=1.0e9,
    )


def reference_text(state: TrainerMetricState) -> bytes:
    """What prometheus_client prints for the same state, through the Collector."""
    registry = CollectorRegistry()
    registry.register(state.collector())
    return generate_latest(registry)


def reference_openmetrics(state: TrainerMetricState) -> bytes:
    """prometheus_client's OpenMetrics for the same state, without its # EOF."""
    registry = CollectorRegistry()
    registry.register(state.collector())
    body: bytes = generate_openmetrics(registry)
    return body.removesuffix(b"# EOF\n")


Samples = set[tuple[str, tuple[tuple[str, str], ...], float]]


def samples(text: bytes | str) -> Samples:
    """Every sample of a text exposition as (name, sorted labels, value); duplicates would collapse,
    so the caller also compares counts via sample_count."""
    if isinstance(text, bytes):
        text = text.decode()
    out: Samples = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.add((s.name, tuple(sorted(s.labels.items())), s.value))
    return out


def sample_count(text: bytes) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(text.decode()))


def families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def value(text: bytes, sample_name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == sample_name and s.labels == labels:
                return float(s.value)
    return None


def feed(state: Any, events: Iterable[JobCreated | JobFinished]) -> None:
    for event in events:
        state.on_countable(event)


@dataclass
class Telemetry:
    """The journal's telemetry hooks, recorded."""

    leader: list[bool] = field(default_factory=list)
    replayed: int = 0
    skipped: int = 0
    overflowed: int = 0

    def set_leader(self, leading: bool) -> None:
        self.leader.append(leading)

    def handover_replayed(self, count: int) -> None:
        self.replayed += count

    def handover_skipped(self, count: int) -> None:
        self.skipped += count

    def journal_overflowed(self, count: int) -> None:
        self.overflowed += count
