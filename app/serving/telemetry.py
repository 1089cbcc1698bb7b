"""``trainer_metrics_http_*``: the guards' numbers as Prometheus metrics.

Connections, caps, refusals and closes per listener: what an operator looks at to tell a flood (refusals,
evictions) from a slow client (timeouts) or a descriptor shortage (accept errors).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.serving.guard import ConnectionGuard


class ConnectionTelemetry(Collector):
    """``trainer_metrics_http_*``: connections, caps, refusals and closes per listener."""

    def __init__(self, guards: list[ConnectionGuard]) -> None:
        self._guards = guards

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            "trainer_metrics_http_connections", "Open client connections, by listener.", labels=["listener"]
        )
        cap = GaugeMetricFamily(
            "trainer_metrics_http_connections_max",
            "Connections a listener holds at most (after the file limit).",
            labels=["listener"],
        )
        refused = CounterMetricFamily(
            "trainer_metrics_http_connections_refused",
            "Connections closed on arrival: the listener (capacity) or the client (per_client) at its cap "
            "with no waiting connection to displace.",
            labels=["listener", "reason"],
        )
        closed = CounterMetricFamily(
            "trainer_metrics_http_connections_closed",
            "Connections closed by the server: evicted (displaced at a cap while waiting for a request), "
            "header_timeout, response_timeout.",
            labels=["listener", "reason"],
        )
        errors = CounterMetricFamily(
            "trainer_metrics_http_accept_errors",
            "accept() failures (out of file descriptors or memory).",
            labels=["listener"],
        )
        for g in self._guards:
            open_.add_metric([g.name], g.open_connections)
            cap.add_metric([g.name], g.max_connections)
            for reason, n in g.stats.refused.items():
                refused.add_metric([g.name, reason], n)
            for reason, n in g.stats.closed.items():
                closed.add_metric([g.name, reason], n)
            errors.add_metric([g.name], g.stats.accept_errors)
        yield from (open_, cap, refused, closed, errors)
