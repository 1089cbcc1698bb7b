"""The self-telemetry registry's exposition, each family's bytes kept while its samples are unchanged.

prometheus_client renders every sample of every family on every scrape, validating and escaping each
name and label as it goes: ~130 samples of self-telemetry cost ~1.5 ms a scrape, more than the cached
Trainer part and its gzip together. Between two scrapes most families are unchanged (build info,
limits, informer state, the Lease), so each family's rendering is kept with the family it was made from
and reused while a new collection compares equal (``Metric.__eq__``: name, help, type, unit and every
sample with its labels, value, timestamp and exemplar). What changes (process CPU, event counts) is
rendered by prometheus_client itself, one family at a time: the output is byte for byte what
``generate_latest`` prints for the whole registry, since it prints the families one after another.

Collecting still runs every collector on every scrape: the values must be read to know what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import exposition as _text_exposition
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as _om_exposition
from prometheus_client.registry import Collector

from app.metrics.protobuf import encode_registry

__all__ = ["RegistryRenderer", "openmetrics_family", "protobuf_family", "text_family"]

_EOF = b"# EOF\n"

# prometheus_client ships these untyped; pin their types once here for mypy --strict.
_generate_text: Callable[[Collector], bytes] = _text_exposition.generate_latest
_generate_openmetrics: Callable[[Collector], bytes] = _om_exposition.generate_latest


class _One(Collector):
    """A collector of one already collected family (what the per-family renderers are given)."""

    __slots__ = ("_metric",)

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterable[Metric]:
        return (self._metric,)


def text_family(metric: Metric) -> bytes:
    """One family in the text format 0.0.4, as ``generate_latest`` prints it."""
    return _generate_text(_One(metric))


def openmetrics_family(metric: Metric) -> bytes:
    """One family in OpenMetrics 1.0, without the ``# EOF`` that ends a whole body."""
    return _generate_openmetrics(_One(metric)).removesuffix(_EOF)


def protobuf_family(metric: Metric) -> bytes:
    """One family as a delimited MetricFamily (nothing for an empty one), as ``encode_registry`` does."""
    return encode_registry(_One(metric))


class RegistryRenderer:
    """Renders ``registry`` with ``render_family`` (one family's bytes), reusing a family's last bytes
    while it compares equal to the family they were rendered from. Runs on one thread (the event loop)."""

    def __init__(self, registry: Collector, render_family: Callable[[Metric], bytes]) -> None:
        self._registry = registry
        self._render_family = render_family
        self._last: dict[str, tuple[Metric, bytes]] = {}
        self.rendered = 0  # families rendered afresh (tests, debugging)

    def render(self) -> bytes:
        last = self._last
        now: dict[str, tuple[Metric, bytes]] = {}
        parts: list[bytes] = []
        for metric in self._registry.collect():
            kept = last.get(metric.name)
            # The same object may have been changed in place since: only an equal *other* object proves
            # the kept bytes still describe it.
            if kept is None or kept[0] is metric or kept[0] != metric:
                kept = (metric, self._render_family(metric))
                self.rendered += 1
            now[metric.name] = kept
            parts.append(kept[1])
        self._last = now
        return b"".join(parts)
