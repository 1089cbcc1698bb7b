"""A replica's ``/metrics`` as samples: parsed, summed, grouped, and read once born-at-zero holds are over."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from tests.support.replica_inprocess import Replica

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and all(dict(labels).get(k) == m for k, m in match.items())
    )


def by_labels(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            d = dict(labels)
            k = tuple(d.get(key, "") for key in keys)
            out[k] = out.get(k, 0.0) + v
    return out


_COUNTED_PREFIX = "kubeflow_trainer_"


async def scrape_counts(r: Replica, *, max_renders: int = 5) -> Samples:
    """``/metrics`` as a scraper sees it once born-at-zero holds are over (app/metrics/series_cache.py).

    A new counter/histogram series shows 0 on its first served render and its real values once
    ``zero_hold_seconds`` (0 in these tests) have passed since then. Reads until two consecutive renders
    agree on every Trainer sample (the first read serves the 0 and releases the hold; usually the second
    and third agree) and returns the last one. Gauges are not held, so for a check about "the first
    scrape" of a gauge use ``Replica.samples()``.
    """

    def trainer(s: Samples) -> Samples:
        return {k: v for k, v in s.items() if k[0].startswith(_COUNTED_PREFIX)}

    prev = await r.samples()
    for _ in range(max_renders - 1):
        cur = await r.samples()
        if trainer(cur) == trainer(prev):
            return cur
        prev = cur
    raise AssertionError(f"/metrics of {r.identity} did not settle in {max_renders} renders")
