"""What the reviews cost and how they ended: ``ReviewStats`` and its export, ``trainer_metrics_auth_*``.

Counted by the reviewer (reviews sent, cache hits, refusals, timeouts) and read by Prometheus, so that an
operator can tell a flood of bad tokens (refusals) from an API server that does not answer (timeouts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(slots=True)
class ReviewStats:
    """Counters for tests and self-telemetry."""

    token_reviews: int = 0  # TokenReviews sent
    access_reviews: int = 0  # SubjectAccessReviews sent
    cache_hits: int = 0
    api_errors: int = 0  # reviews that failed (timeouts included): answered 503
    timeouts: int = 0  # reviews past their deadline
    # Requests let through on a recent grant past its cache time, the API being unreachable.
    outage_grace: int = 0
    # Cache misses answered 503 without a review: over the client's or everyone's rate, or no slot in time.
    refused: dict[str, int] = field(default_factory=lambda: {"client_rate": 0, "rate": 0, "slot_wait": 0})


class AuthTelemetry(Collector):
    """``trainer_metrics_auth_*``: reviews sent, decisions served from the cache, refusals, timeouts."""

    def __init__(self, stats: ReviewStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        sent = CounterMetricFamily(
            "trainer_metrics_auth_reviews_sent",
            "Reviews sent to the Kubernetes API, by kind (token: TokenReview, access: SubjectAccessReview).",
            labels=["kind"],
        )
        sent.add_metric(["token"], s.token_reviews)
        sent.add_metric(["access"], s.access_reviews)
        refused = CounterMetricFamily(
            "trainer_metrics_auth_refused",
            "Uncached bearer tokens answered 503 without a review: over the client's review rate "
            "(client_rate), over the overall one (rate), or no review slot within 1 s (slot_wait).",
            labels=["reason"],
        )
        for reason, n in s.refused.items():
            refused.add_metric([reason], n)
        yield sent
        yield CounterMetricFamily(
            "trainer_metrics_auth_cache_hits", "Requests decided from the cache.", value=s.cache_hits
        )
        yield refused
        yield CounterMetricFamily(
            "trainer_metrics_auth_review_timeouts",
            "Reviews without an answer within their deadline (answered 503).",
            value=s.timeouts,
        )
        yield CounterMetricFamily(
            "trainer_metrics_auth_outage_grace",
            "Requests let through, the Kubernetes API being unreachable, on a decision it allowed within "
            "auth_outage_grace_seconds past its cache time (docs/security.md).",
            value=s.outage_grace,
        )
        yield CounterMetricFamily(
            "trainer_metrics_auth_review_errors",
            "Reviews that failed, timeouts included (answered 503, not cached).",
            value=s.api_errors,
        )
