"""RegistryRenderer: the self-telemetry exposition reuses a family's bytes while the family is unchanged,
and prints exactly what prometheus_client (and our protobuf encoder) print for the whole registry."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary
from prometheus_client import exposition as text_exposition
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.registry import Collector

from app.metrics.protobuf import encode_registry
from app.metrics.registry_render import (
    RegistryRenderer,
    openmetrics_family,
    protobuf_family,
    text_family,
)


def _registry() -> tuple[CollectorRegistry, Counter, Gauge, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("demo_events", "Events seen.", ["kind"], registry=registry)
    gauge = Gauge("demo_level", 'A "level"\nwith a newline and a \\ backslash.', registry=registry)
    histogram = Histogram("demo_seconds", "Durations.", ["path"], buckets=(0.1, 1.0), registry=registry)
    Summary("demo_size_bytes", "Sizes.", registry=registry).observe(3)
    Info("demo_build", "Build.", registry=registry).info({"version": "1.2.3"})
    counter.labels(kind='quote"and\\back').inc()
    gauge.set(2.5)
    histogram.labels(path="/metrics").observe(0.05)
    return registry, counter, gauge, histogram


def _whole(registry: CollectorRegistry) -> dict[str, bytes]:
    om = om_exposition.generate_latest(registry)
    return {
        "text": text_exposition.generate_latest(registry),
        "openmetrics": om.removesuffix(b"# EOF\n"),
        "protobuf": encode_registry(registry),
    }


RENDERERS = {"text": text_family, "openmetrics": openmetrics_family, "protobuf": protobuf_family}


@pytest.mark.parametrize("fmt", sorted(RENDERERS))
def test_same_bytes_as_the_whole_registry_rendered_at_once_before_and_after_changes(fmt: str) -> None:
    registry, counter, gauge, histogram = _registry()
    renderer = RegistryRenderer(registry, RENDERERS[fmt])
    assert renderer.render() == _whole(registry)[fmt]
    counter.labels(kind="other").inc(4)
    histogram.labels(path="/metrics").observe(7)
    assert renderer.render() == _whole(registry)[fmt]
    gauge.set(-1)
    assert renderer.render() == _whole(registry)[fmt]


def test_only_the_families_that_changed_are_rendered_again() -> None:
    registry, counter, gauge, _ = _registry()
    renderer = RegistryRenderer(registry, text_family)
    renderer.render()
    families = renderer.rendered
    assert families == 5

    renderer.render()
    assert renderer.rendered == families  # nothing changed: every family's bytes reused

    gauge.set(7)
    counter.labels(kind="new").inc()
    body = renderer.render()
    assert renderer.rendered == families + 2
    assert b"demo_level 7.0\n" in body
    assert b'demo_events_total{kind="new"} 1.0\n' in body


class _InPlace(Collector):
    """A collector that hands out the same Metric object every time, changed in place."""

    def __init__(self) -> None:
        self.metric = GaugeMetricFamily("demo_in_place", "Changed in place.", labels=["a"])
        self.metric.add_metric(["x"], 1)

    def collect(self) -> Iterable[Metric]:
        return (self.metric,)


def test_a_family_changed_in_place_is_never_served_from_its_old_bytes() -> None:
    registry = CollectorRegistry()
    collector = _InPlace()
    registry.register(collector)
    renderer = RegistryRenderer(registry, text_family)
    assert b'demo_in_place{a="x"} 1.0' in renderer.render()
    collector.metric.samples[0] = collector.metric.samples[0]._replace(value=2.0)
    assert b'demo_in_place{a="x"} 2.0' in renderer.render()


class _Switching(Collector):
    def __init__(self) -> None:
        self.names = ["demo_a", "demo_b"]

    def collect(self) -> Iterable[Metric]:
        for name in self.names:
            family = GaugeMetricFamily(name, "Comes and goes.")
            family.add_metric([], 1)
            yield family


def test_families_that_appear_and_disappear() -> None:
    registry = CollectorRegistry()
    collector = _Switching()
    registry.register(collector)
    renderer = RegistryRenderer(registry, text_family)
    assert renderer.render() == text_exposition.generate_latest(registry)
    collector.names = ["demo_b", "demo_c"]
    assert renderer.render() == text_exposition.generate_latest(registry)
    collector.names = []
    assert renderer.render() == b""
