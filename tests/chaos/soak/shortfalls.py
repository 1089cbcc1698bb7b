"""Where a PromQL-visible loss happened: per leader term and counter series, what the term counted that the
next leader does not count again (everything at or below the next term's floor of its stream) against the
increments Prometheus stored from that term's target during it. A term whose stored increments fall short
lost counts that no other term makes up for; the entry names the term, how it ended, how many of the
missing counts lay between the watermark published when it ended and the next floor (a floor above what
was published), and the scrapes of its target around its end, so a failing run explains itself.

A hint, not a verdict: a term's counts include the events it replayed at its take-over, and an earlier
term's scrapes may have shown one of them already (the crash bound); a term that ended before a scrape
showed such replays is listed although nothing was lost. The report prints the list only when PromQL lost
counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tests.chaos.soak.ledger import COUNTERS
from tests.chaos.soak.terms import POD_STREAM, Term
from tests.support.promql_visible import visible_increase

# A term's target may be scraped a little after its end: its last render can reach Prometheus then.
_AFTER_END = 1.5
_BEFORE_START = 0.5


SeriesCount = Counter[tuple[str, tuple[str, ...]]]


def _recounted(term: Term, following: Term | None) -> tuple[SeriesCount, SeriesCount]:
    """Per series: the events of ``term`` above the watermark published when it ended that the next term
    counts again (above its floor: they need not be visible from ``term``), and those it does not (at or
    below its floor)."""
    again: SeriesCount = Counter()
    skipped: SeriesCount = Counter()
    for stream in ("", POD_STREAM):
        floor = None if following is None else following.floor_of(stream)
        for rv, series in term.risk_of(stream):
            (again if floor is None or rv > floor else skipped).update(series)
    return again, skipped


def _samples(
    raw: Mapping[str, Sequence[Mapping[str, Any]]], name: str, pod: str, start: float, end: float
) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    labels = COUNTERS[name][0]
    out: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for series in raw.get(name, ()):
        metric = series["metric"]
        if metric.get("pod") != pod:
            continue
        points = [(float(t), float(v)) for t, v in series["values"] if start <= float(t) <= end]
        if points:
            out.setdefault(tuple(metric.get(label, "") for label in labels), []).extend(points)
    return out


def shortfalls(
    terms: Sequence[Term],
    raw: Mapping[str, Sequence[Mapping[str, Any]]],
    scrapes: Mapping[str, Sequence[tuple[float, float, float]]],
) -> list[dict[str, Any]]:
    """Every (term, series) whose stored increments are below what only that term counted. ``raw``: the
    stored samples per counter name (``Soak.raw_series``); ``scrapes``: per target (``pod`` label), its
    (time, up, scrape duration) samples."""
    out: list[dict[str, Any]] = []
    ordered = sorted(terms, key=lambda t: t.started)
    for i, term in enumerate(ordered):
        if term.stopped_wall is None:
            continue
        pod = f"slot-{term.slot}"
        start, end = term.started_wall - _BEFORE_START, term.stopped_wall + _AFTER_END
        again, skipped = _recounted(term, ordered[i + 1] if i + 1 < len(ordered) else None)
        for name in COUNTERS:
            stored = _samples(raw, name, pod, start, end)
            for key, counted in term.counted.get(name, {}).items():
                must_show = counted - again.get((name, key), 0)
                points = sorted(stored.get(key, []))
                visible = visible_increase(v for _, v in points)
                if visible + 1e-6 >= must_show:
                    continue
                near_end = [
                    [round(t - term.stopped_wall, 2), up, round(duration, 3)]
                    for t, up, duration in scrapes.get(pod, ())
                    if term.stopped_wall - 10.0 <= t <= end
                ]
                out.append(
                    {
                        "term": term.identity,
                        "pod": pod,
                        "how": term.how,
                        "started_s": term.started,
                        "stopped_s": term.stopped,
                        "name": name,
                        "key": "|".join(key),
                        "counted": counted,
                        "recounted_next": again.get((name, key), 0),
                        "at_risk_below_next_floor": skipped.get((name, key), 0),
                        "visible": visible,
                        "last_stored": [round(points[-1][0] - term.stopped_wall, 2), points[-1][1]]
                        if points
                        else None,
                        "scrapes_near_end": near_end,
                    }
                )
    return out
