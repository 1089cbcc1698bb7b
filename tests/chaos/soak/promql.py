"""What Prometheus stored of the run, read once it settled (``read_visible_counts``) and checked: the
increments PromQL sees against the truth, and the invariants of every served series per target."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx

from tests.chaos.soak.ledger import COUNTERS, MONOTONIC, Values
from tests.chaos.soak.terms import Term
from tests.support import promql_visible
from tests.support.waiting import eventually

if TYPE_CHECKING:
    from tests.chaos.soak.runner import Soak


def promql_report(soak: Soak, truth: Values, allowance: Values) -> dict[str, Any]:
    """The increments PromQL can see over the whole run against the same truth (edges no replica could
    see taken off) and the same allowance as the leaders' own counts: never below, above only by it."""
    if not soak.promql.get("checked"):
        return {"checked": False, "born_above_zero": None}
    result = promql_visible.compare(soak.promql["visible"], truth, allowance, names=tuple(COUNTERS))
    return {
        "checked": True,
        "range_s": soak.promql["range_s"],
        "totals_visible_truth": result.totals,
        "lost": _keyed(result.lost),
        "over_allowance": _keyed(result.over_allowance),
        "extra_within_allowance": sum(sum(keys.values()) for keys in result.extra.values())
        - sum(sum(keys.values()) for keys in result.over_allowance.values()),
        "born_above_zero": soak.promql["born_above_zero"],
    }


def promql_invariants(soak: Soak, terms: list[Term]) -> dict[str, Any]:
    """Per series and per target, from every sample Prometheus stored of the served counters and
    histogram counts (``MONOTONIC``): a series goes down only where its replica started a new leader
    term (each term counts from zero), and what PromQL sees of a target (one replica instance) is
    never more than what that instance counted. Both fail when two targets share an address: one
    replica's samples then interleave with another's under one ``pod`` label."""
    if not soak.raw_series:
        return {"checked": False}
    starts: dict[str, list[float]] = {}  # pod label -> wall times its replica started a term
    for term in terms:
        starts.setdefault(f"slot-{term.slot}", []).append(term.started_wall)
    went_down: list[dict[str, Any]] = []
    at_term_starts = 0
    for d in promql_visible.decreases(soak.raw_series):
        pod = dict(d.labels).get("pod", "")
        (t1, v1), (t2, v2) = d.before, d.after
        if any(t1 - 1.0 <= s <= t2 + 1.0 for s in starts.get(pod, [])):
            at_term_starts += 1
            continue
        went_down.append({"name": d.name, "labels": dict(d.labels), "from": [t1, v1], "to": [t2, v2]})
    by_pod: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, series_list in soak.raw_series.items():
        for series in series_list:
            pod = str(series["metric"].get("pod"))
            by_pod.setdefault(pod, {}).setdefault(name, []).append(series)
    pods = sorted(by_pod, key=lambda pod: (len(pod), pod))
    over_counted: list[dict[str, Any]] = []
    for pod in pods:
        slot = int(pod.removeprefix("slot-")) if pod.removeprefix("slot-").isdigit() else -1
        counted = soak.slot_counted.get(slot, {})
        visible = promql_visible.increments_of(by_pod[pod], MONOTONIC)
        for name, by_key in visible.items():
            for key, value in by_key.items():
                mine = counted.get(name, {}).get(key, 0.0)
                if value > mine + 1e-6:
                    over_counted.append(
                        {
                            "pod": pod,
                            "name": name,
                            "key": "|".join(key),
                            "visible": value,
                            "counted": mine,
                        }
                    )
    return {
        "checked": True,
        "series": sum(len(by) for by in soak.raw_series.values()),
        "samples": sum(len(series["values"]) for by in soak.raw_series.values() for series in by),
        "targets": len(pods),
        "resets_at_term_starts": at_term_starts,
        "went_down": len(went_down),
        "went_down_examples": went_down[:20],
        "over_counted": len(over_counted),
        "over_counted_examples": over_counted[:20],
    }


_SCRAPE_SERIES = ("up", "scrape_duration_seconds")


def _scrapes(
    up: list[dict[str, Any]], durations: list[dict[str, Any]]
) -> dict[str, list[tuple[float, float, float]]]:
    """Per target (``pod`` label): its scrapes as (time, up, duration)."""
    seconds = {str(s["metric"].get("pod")): {float(t): float(v) for t, v in s["values"]} for s in durations}
    out: dict[str, list[tuple[float, float, float]]] = {}
    for series in up:
        pod = str(series["metric"].get("pod"))
        took = seconds.get(pod, {})
        out[pod] = [(float(t), float(v), took.get(float(t), float("nan"))) for t, v in series["values"]]
    return out


def _keyed(table: dict[str, dict[tuple[str, ...], float]]) -> dict[str, dict[str, float]]:
    return {name: {"|".join(key): value for key, value in keys.items()} for name, keys in table.items()}


async def read_visible_counts(soak: Soak, leader: str | None, since_wall: float) -> None:
    """Once the leader's last counts are out of their hold and seen: a scrape after that, then the
    increments PromQL can see over the whole run (``soak.promql``, compared in ``report``), and every
    counted series' samples (``soak.raw_series``: the invariants per target)."""
    prom = soak.prom
    if prom is None or leader is None:
        return
    handle = soak.live[leader]
    if not await soak.wait_for(handle.counts_seen, 30.0):
        soak.problems.append("the final leader's counts were not all scraped within 30 s")
    slot = soak.slot_of[leader]
    expr = f'timestamp(up{{pod="slot-{slot}"}}) and up{{pod="slot-{slot}"}} == 1'
    after = time.time()

    def scraped() -> float | None:
        result = prom.query(expr)
        stamp = float(result[0]["value"][1]) if result else 0.0
        return stamp if stamp > after else None

    try:
        at: float = await eventually(
            lambda: asyncio.to_thread(scraped), 20.0, interval=0.2, what="a scrape of the final leader"
        )
    except AssertionError:
        soak.problems.append("no scrape of the final leader after the run settled")
        return
    seconds = int(at - since_wall) + 10

    def query() -> tuple[dict[str, list[dict[str, Any]]], int]:
        raw = {name: promql_visible.raw_series(prom, name, at, seconds) for name in MONOTONIC}
        for name in _SCRAPE_SERIES:
            raw[name] = promql_visible.raw_series(prom, name, at, seconds)
        return raw, len(promql_visible.born_above_zero(prom, at, seconds))

    if prom.http is not None:
        # Every sample of a long run (about 150,000 a name an hour): more than the client's 10 s.
        prom.http.timeout = httpx.Timeout(600.0)
    try:
        raw, born = await asyncio.to_thread(query)
    except Exception as exc:  # the report must come out of an unattended run
        soak.problems.append(f"reading the stored series from Prometheus failed: {exc!r}"[:500])
        return
    soak.scrapes = _scrapes(raw.pop("up"), raw.pop("scrape_duration_seconds"))
    soak.raw_series = raw
    table = promql_visible.increments_of(soak.raw_series, names=tuple(COUNTERS))
    soak.promql = {"checked": True, "visible": table, "born_above_zero": born, "range_s": seconds}
