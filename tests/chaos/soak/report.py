"""The soak's report: what the leaders counted against the truth, hand-overs, readiness in stalls, memory."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubesim.apiserver.core import PODS
from kubesim.trainer.kinds import TRAINJOBS
from tests.chaos.memory import plot as plot_memory
from tests.chaos.soak.config import waits
from tests.chaos.soak.doubles import DOCUMENTED_DOUBLES
from tests.chaos.soak.ledger import (
    ACCEL_COUNT,
    COUNTERS,
    CREATED,
    FINISHED,
    LIFETIME_COUNT,
    NODES_COUNT,
    POD_FAILURES,
    Values,
    _add_into,
)
from tests.chaos.soak.promql import promql_invariants, promql_report
from tests.chaos.soak.shortfalls import shortfalls
from tests.chaos.soak.terms import POD_STREAM, Term
from tests.support.replica_process import image_malloc_env

STREAMS = ("", POD_STREAM)  # the TrainJob stream and the pods stream of one watch over all namespaces

if TYPE_CHECKING:
    from tests.chaos.soak.runner import Soak
    from tests.chaos.soak.visibility import Visibility


def build_report(
    soak: Soak,
    *,
    start_truth: Any,
    end_truth: Any,
    gauge: dict[tuple[str, ...], float],
    leader: str | None,
    steps: int,
    fault_seconds: float,
    settle_seconds: float,
    rss_end: int,
    leader_flags: dict[str, float],
    stopped_alive: list[str],
) -> dict[str, Any]:
    """The report of a settled run (``table.render_table`` prints it, ``checks.check`` reads it)."""
    cfg = soak.cfg
    created = end_truth.created_since(start_truth)
    finished = end_truth.finished_since(start_truth)
    truth, unobservable_counts, unobservable_uids = expected_counts(soak, start_truth, end_truth)
    # Pod failures a replica saw while it did not cache their TrainJob: not counted by it.
    unjoined_off, unjoined_allowance, unjoined_counts = soak.visibility.unjoined(start_truth.resource_version)
    for name, by_key in unjoined_off.items():
        for key, n in by_key.items():
            truth[name][key] = truth[name].get(key, 0) - n
    ordered = sorted(soak.recorder.terms, key=lambda t: t.started)
    terms = hand_overs(soak, ordered)
    doubles, handovers, allowance = terms.doubles, terms.handovers, terms.allowance
    # An at-risk failure the next leader found Failed in its first list without its TrainJob cached: not
    # counted by it (app/trainer/pod_failures.py); the old leader's count no scrape showed is the only one.
    # So is one whose pod was gone before the next leader's first pods list ("uncovered").
    for suspect in terms.not_recounted:
        uid = suspect["uid"]
        if suspect["class"] == "uncovered" or (
            suspect["class"] == "unjoined" and not soak.visibility.pod_seen.get(uid, (set(), set()))[1]
        ):
            edges = soak.visibility.pod_edges.get(uid)
            for name, key in edges[1] if edges is not None else ():
                truth[name][key] = truth[name].get(key, 0) - 1
    _add_into(allowance, unjoined_allowance)
    promql = promql_report(soak, truth, allowance)
    short = shortfalls(ordered, soak.raw_series, soak.scrapes)
    differences, violations, per_counter = compare_counts(terms.summed, truth, allowance)
    truth_jobs = {k: float(v) for k, v in end_truth.jobs.items() if v}
    gauge_diff = {
        "|".join(k): gauge.get(k, 0.0) - truth_jobs.get(k, 0.0)
        for k in gauge.keys() | truth_jobs.keys()
        if gauge.get(k, 0.0) != truth_jobs.get(k, 0.0)
    }
    by_kind = Counter(e["kind"] for e in soak.episodes)
    lifecycles = sum(finished.values())
    return {
        "config": {k: v for k, v in asdict(cfg).items()},
        "waits": waits(cfg).as_dict(),
        "fault_seconds": round(fault_seconds, 1),
        "settle_seconds": round(settle_seconds, 1),
        "generator_steps": steps,
        "prefill_steps": getattr(soak, "prefill_steps", 0),
        "lifecycles_finished": lifecycles,
        "unobservable_edges": unobservable_counts,
        "unobservable_examples": unobservable_uids,
        "pod_failures_unjoined": unjoined_counts,
        "pod_failures": {
            "truth_total": sum(end_truth.pod_failures_since(start_truth).values()),
            "expected_total": sum(truth[POD_FAILURES].values()),
            "pods_end": len(soak.sim.store.list(PODS, None)[0]),
        },
        "relists_per_replica": {
            f"{sp.identity}#{i}": len(sp.relists) for i, sp in enumerate(soak.visibility.spans)
        },
        "trainjobs_created": sum(created.values()),
        "trainjobs_deleted": sum(created.values())
        - sum(end_truth.jobs.values())
        + sum(start_truth.jobs.values()),
        "live_trainjobs_end": sum(end_truth.jobs.values()),
        "max_jobs": cfg.max_jobs,
        "episodes_by_kind": dict(sorted(by_kind.items())),
        "sim_fault_counters": dict(sorted(soak.sim.faults.counters.items())),
        "leader_terms": len(ordered),
        "handovers": handovers,
        "doubles_by_cause": dict(Counter(d["cause"] for d in doubles)),
        "uncertain_settled": dict(soak.doubles.settled),
        "doubles_not_crash_bound": [d for d in doubles if d["cause"] != "crash bound"][:50],
        "doubles_unexplained": sum(1 for d in doubles if d["cause"] not in DOCUMENTED_DOUBLES),
        "non_exact_handovers": sum(1 for h in handovers if not h["exact"]),
        "kills": by_kind.get("leader_kill", 0),
        "overlapping_terms": terms.overlaps,
        "counters": per_counter,
        "differences": differences,
        "allowance": {n: {"|".join(k): v for k, v in s.items()} for n, s in allowance.items()},
        "count_violations": violations,
        "final_leader": leader,
        "leader_flags_scraped": leader_flags,
        "gauge_series": len(truth_jobs),
        "gauge_differences": gauge_diff,
        "liveness_problems": soak.liveness,
        "dead_tasks": soak.dead_tasks,
        "error_log_records": soak.error_records if hasattr(soak, "error_records") else [],
        "loop_exceptions": soak.loop_errors,
        **rss_figures(soak, rss_end),
        "mode": "processes" if cfg.processes else "in-process",
        "processes": process_summaries(soak),
        "demotions": soak.demotions,
        "replica_malloc_env": (
            {
                k: v
                for k, v in {**image_malloc_env(), **cfg.replica_env}.items()
                if k.startswith("MALLOC_") and v
            }
            if cfg.processes
            else {}
        ),
        "replica_exits": soak.exits,
        "counted_vs_truth": [
            (round(t), round(c / truth, 4) if truth else None) for t, truth, c in soak.ratios[::6]
        ],
        # Replicas stopped or killed during the soak; those of them still alive (not garbage) at the end.
        "replicas_stopped": len(soak.stopped_services),
        "stopped_services_alive": stopped_alive,
        "memory": soak.memory,
        "service_traced_growth": _traced_growth(soak.memory, "service"),
        "stalls": stall_checks(soak),
        "stalls_not_checked": soak.uncalm_stalls,
        "readiness_samples": len(soak.readiness),
        "harness_problems": soak.problems,
        "promql": promql,
        "promql_invariants": promql_invariants(soak, ordered),
        "promql_shortfalls": short[:30],
        "promql_shortfall_terms": len({(s["term"], s["started_s"]) for s in short}),
        "at_risk_not_recounted": len(terms.not_recounted),
        "at_risk_not_recounted_examples": terms.not_recounted[:50],
        "suspects_by_class": dict(Counter(s["class"] for s in terms.not_recounted)),
        "unexplained_suspects": sum(1 for s in terms.not_recounted if s["class"] == "lost"),
        "unexplained_suspect_examples": [s for s in terms.not_recounted if s["class"] == "lost"][:20],
        "counts_outside_terms": soak.recorder.outside_terms,
        "lease_writes": soak.lease_writes,
        "lease_watermark_decreases": soak.watermark_decreases,
        "replicas_started": soak.replica_seq,
        "store_trainjobs_end": len(soak.sim.store.list(TRAINJOBS, None)[0]),
    }


def expected_counts(soak: Soak, start_truth: Any, end_truth: Any) -> tuple[Values, dict[str, int], list[str]]:
    """What the leaders should have counted over the run, per series: the truth's deltas (the replicas
    started before the first TrainJob was created), less the edges no replica could observe (how many, and
    some of them)."""
    created = end_truth.created_since(start_truth)
    finished = end_truth.finished_since(start_truth)
    truth: Values = {name: {} for name in (*COUNTERS, ACCEL_COUNT)}
    for key, n in end_truth.pod_failures_since(start_truth).items():
        truth[POD_FAILURES][key] = n
    for (ns, ref), n in created.items():
        truth[CREATED][(ns, ref)] = truth[CREATED].get((ns, ref), 0) + n
        truth[NODES_COUNT][(ref,)] = truth[NODES_COUNT].get((ref,), 0) + n
    # One observation per accelerator class a job requests: the truth's running total, not
    # requests_since (prune_truth drops the records of deleted jobs from truth.requests).
    for ref, n in end_truth.accelerator_observations_since(start_truth).items():
        truth[ACCEL_COUNT][(ref,)] = truth[ACCEL_COUNT].get((ref,), 0) + n
    for (result, reason, ref), n in finished.items():
        truth[FINISHED][(result, reason, ref)] = n
        truth[LIFETIME_COUNT][(result, ref)] = truth[LIFETIME_COUNT].get((result, ref), 0) + n
    # Edges no replica could observe (created/finished and deleted inside a relist gap of every replica
    # that ran) are not countable: take exactly those off, and report how many.
    unobservable, unobservable_counts, unobservable_uids = soak.visibility.unobservable(
        start_truth.resource_version
    )
    for name, by_key in unobservable.items():
        for key, n in by_key.items():
            truth[name][key] = truth[name].get(key, 0) - n
    return truth, unobservable_counts, unobservable_uids


@dataclass
class HandOvers:
    summed: Values  # what all terms counted together
    allowance: Values  # what may be counted twice: the documented bounds
    handovers: list[dict[str, Any]]
    overlaps: list[str]
    doubles: list[dict[str, Any]]  # DoubleCounts.classify
    not_recounted: list[dict[str, Any]]  # at-risk edges no leader counted again


def _suspect_class(soak: Soak, prev: Term, term: Term, edge: tuple[int, str, str, int], stream: str) -> str:
    """Why an at-risk edge of ``prev`` was not counted again by ``term``: "shown" when a served render of
    ``prev`` showed its count (PromQL has it); "unjoined" for a pod's failure ``term`` saw without its
    TrainJob cached (app/trainer/pod_failures.py: not counted by it, as the truth allows, ``unjoined``);
    "uncovered" for a pod's failure whose pod was deleted before ``term``'s first pods list, which came
    after the failure: a successor whose journal starts above the floor, with nothing that could show it
    the failure (docs/leadership.md, "The same window on the pods stream"); else "lost" (PromQL never sees
    it): unexplained."""
    rv, kind, uid, since = edge
    if prev.was_shown(rv, since, stream):
        return "shown"
    visibility = soak.visibility
    if kind == "pod_failed" and (
        term.identity in visibility.pod_seen.get(uid, (set(), set()))[1]
        or term.identity in visibility.listed_unjoined.get(uid, set())
    ):
        return "unjoined"
    if kind == "pod_failed" and _gone_before_first_list(visibility, term.identity, uid, rv):
        return "uncovered"
    return "lost"


def _gone_before_first_list(visibility: Visibility, identity: str, uid: str, rv: int) -> bool:
    """``identity``'s first pods list came after a failure at ``rv`` and did not hold the pod (Failed is
    terminal: had it been there, it would have been Failed), so it was deleted before: that replica could
    never see the failure, live or listed."""
    firsts = [s.initial_rv for s in visibility.spans if s.identity == identity and s.stream == POD_STREAM]
    first = next((r for r in firsts if r is not None), None)
    return first is not None and rv < first and identity not in visibility.listed.get(uid, set())


def hand_overs(soak: Soak, ordered: list[Term]) -> HandOvers:
    """The terms in order: their sum, and the allowance of each non-graceful hand-over."""
    summed: Values = {}
    allowance: Values = {}
    handovers: list[dict[str, Any]] = []
    overlaps: list[str] = []

    def relisted(identity: str, edge_rv: int, seen_rv: int, stream: str = "") -> bool:
        return any(
            before < edge_rv and seen_rv <= listed
            for span in soak.visibility.spans
            if span.identity == identity and span.stream == stream
            for before, listed in span.relists
        )

    doubles = soak.doubles.classify(ordered, relisted)
    not_recounted: list[dict[str, Any]] = []
    for i, term in enumerate(ordered):
        if term.counted is not None:
            _add_into(summed, term.counted)
        if i == 0:
            continue
        prev = ordered[i - 1]
        if prev.stopped is None or prev.stopped > term.started:
            overlaps.append(
                f"{prev.identity} [{prev.started}, {prev.stopped}] / {term.identity} @ {term.started}"
            )
        exact = all(
            prev.final_watermark_of(stream) is None
            or (term.floor_of(stream) if term.floor_of(stream) is not None else -1)
            >= (prev.final_watermark_of(stream) or 0)
            for stream in STREAMS
        )
        risky = []
        for stream in STREAMS:
            stream_floor = term.floor_of(stream)
            stream_floor = stream_floor if stream_floor is not None else -1
            risky += [series for rv, series in prev.risk_of(stream) if rv > stream_floor]
        for series in risky:
            for name, key in series:
                allowance.setdefault(name, {})[key] = allowance.get(name, {}).get(key, 0) + 1
        handovers.append(
            {
                "from": prev.identity,
                "to": term.identity,
                "how": prev.how,
                "gap_s": round(term.started - (prev.stopped or term.started), 3),
                "old_watermark": prev.final_watermark,
                "new_floor": term.floor,
                "old_pod_watermark": prev.final_watermark_of(POD_STREAM),
                "new_pod_floor": term.floor_of(POD_STREAM),
                "exact": exact,
                "may_double_count": len(risky),
            }
        )
        # Edges the old term counted above the watermark it published and above the next term's floor that
        # no leader counted again (the suspects): the next leader should have replayed them, from its
        # journal or, when its journal began above the floor, rebuilt from the TrainJobs listed at both
        # (app/handover/gap.py). Each is classified (``_suspect_class``): shown, unjoined, else lost
        # (unexplained). The replayed ones (counted again) are not suspects: the crash bound's doubles.
        for stream in STREAMS if prev.how != "graceful" else ():
            stream_floor = term.floor_of(stream)
            stream_floor = stream_floor if stream_floor is not None else -1
            for rv, kind, uid, since in prev.risk_edges_of(stream):
                if rv > stream_floor and soak.recorder.times_counted[(kind, uid)] == 1:
                    not_recounted.append(
                        {
                            "kind": kind,
                            "uid": uid,
                            "rv": rv,
                            "since": since,
                            "by": prev.identity,
                            "how": prev.how,
                            "stopped": prev.stopped,
                            "published_at_stop": prev.published_at_stop
                            if stream == ""
                            else prev.pod_published_at_stop,
                            "next_floor": term.floor_of(stream),
                            "to": term.identity,
                            "class": _suspect_class(soak, prev, term, (rv, kind, uid, since), stream),
                            # What the next leader's informer of the stream could see of it: its first
                            # list's rv and relists (an edge at or below the first list came in it), and
                            # whether it saw a pod fail live or in a relist, with its TrainJob or without.
                            "next_lists": [
                                [span.initial_rv, span.relists[:5]]
                                for span in soak.visibility.spans
                                if span.identity == term.identity and span.stream == stream
                            ],
                            "next_saw_fail": [
                                "joined" if term.identity in seen[0] else "unjoined"
                                for seen in [soak.visibility.pod_seen.get(uid, (set(), set()))]
                                if term.identity in seen[0] | seen[1]
                            ]
                            + (
                                ["listed unjoined"]
                                if term.identity in soak.visibility.listed_unjoined.get(uid, set())
                                else []
                            ),
                        }
                    )
    # The second documented bound: an edge a follower's relist surfaced with a newer rv than the edge,
    # above the floor it took over from (verified per edge against that replica's relists).
    seen_late = [d for d in doubles if d["cause"] == "seen late with a newer rv"]
    for d in seen_late:
        for name, key in d["series"]:
            allowance.setdefault(name, {})[key] = allowance.get(name, {}).get(key, 0) + 1
    return HandOvers(summed, allowance, handovers, overlaps, doubles, not_recounted)


def compare_counts(
    summed: Values, truth: Values, allowance: Values
) -> tuple[dict[str, dict[str, float]], list[str], dict[str, dict[str, float]]]:
    """Per series, what the leaders counted against the truth: never below it, above only by the allowance.
    Returns (differences, violations, totals per counter)."""
    differences: dict[str, dict[str, float]] = {}
    violations: list[str] = []
    per_counter: dict[str, dict[str, float]] = {}
    for name in (*COUNTERS, ACCEL_COUNT):
        keys = summed.get(name, {}).keys() | truth[name].keys()
        over = under = 0.0
        for key in sorted(keys):
            got = summed.get(name, {}).get(key, 0.0)
            want = truth[name].get(key, 0.0)
            diff = got - want
            if diff:
                differences.setdefault(name, {})["|".join(key)] = diff
            allowed = allowance.get(name, {}).get(key, 0)
            if diff < 0:
                under += -diff
                violations.append(f"{name}{key}: lost {-diff:g} (counted {got:g}, truth {want:g})")
            elif diff > allowed:
                over += diff - allowed
                violations.append(f"{name}{key}: {diff:g} over the truth, allowance {allowed} (got {got:g})")
        per_counter[name] = {
            "truth_total": sum(truth[name].values()),
            "counted_total": sum(summed.get(name, {}).values()),
            "allowance_total": sum(allowance.get(name, {}).values()),
            "lost": under,
            "over_allowance": over,
        }
    return differences, violations, per_counter


def stall_checks(soak: Soak) -> list[dict[str, Any]]:
    """Readiness during stalls: in [stall start + timeout + 0.5 s, stall end], replicas alive throughout."""
    cfg = soak.cfg
    checks = []
    for start, end, resource in soak.stalls:
        lo = start + cfg.inactivity_timeout + 0.5
        if end - lo < 0.3:
            continue
        per: dict[str, list[int]] = {}
        for t, identity, status in soak.readiness:
            if lo <= t <= end:
                per.setdefault(identity, []).append(status)
        recovered = {}
        for identity in per:
            # "True again after it recovered": recovery can wait for the informer's backoff (capped at
            # 30 s) when other faults overlap the stall, so any later 200 counts, not a fixed window.
            later = [s for t, i, s in soak.readiness if i == identity and t > end]
            recovered[identity] = 200 in later
        checks.append(
            {
                "start": start,
                "end": end,
                "resource": resource,
                "not_ready_fraction": {
                    i: round(sum(1 for s in v if s == 503) / len(v), 3) for i, v in per.items() if v
                },
                "ready_again_later": recovered,
            }
        )
    return checks


def rss_figures(soak: Soak, rss_end: int) -> dict[str, Any]:
    """This (the soak's) process's RSS: after the warm-up, at the end, its peak, trimmed."""
    cfg = soak.cfg
    after_warmup = [b for t, b in soak.rss if t >= cfg.warmup_seconds]
    warm_at = next((t for t, _ in soak.rss if t >= cfg.warmup_seconds), 0.0)
    rss_warm = statistics.median(after_warmup[:5]) if after_warmup else (soak.rss[0][1] if soak.rss else 0)
    trimmed_warm, trimmed_end = soak.trimmed.get("warm", 0), soak.trimmed.get("end", 0)
    return {
        "rss_warm_mb": round(rss_warm / 2**20, 1),
        "rss_end_mb": round(rss_end / 2**20, 1),
        "rss_growth": round((rss_end - rss_warm) / rss_warm, 4) if rss_warm else None,
        "rss_peak_mb": round(max((b for _, b in soak.rss), default=0) / 2**20, 1),
        "rss_trimmed_warm_mb": round(trimmed_warm / 2**20, 1),
        "rss_trimmed_end_mb": round(trimmed_end / 2**20, 1),
        "rss_trimmed_growth": round((trimmed_end - trimmed_warm) / trimmed_warm, 4) if trimmed_warm else None,
        "rss_warm_at_s": round(warm_at, 1),
        "rss_mb_every_10s": [
            (round(t), round(b / 2**20, 1)) for i, (t, b) in enumerate(soak.rss) if i % 10 == 0
        ],
    }


def process_summaries(soak: Soak) -> list[dict[str, Any]]:
    """Process mode: each replica process's memory (memory.py ``ProcessMemory.summary``), the slope over
    the last half of the run after the warm-up (at most the last 30 minutes)."""
    end = soak.t()
    window = min(soak.cfg.slope_window, max(0.0, (end - soak.cfg.warmup_seconds) / 2))
    return [proc.summary(soak.cfg.warmup_seconds, window) for proc in soak.processes]


def plot(soak: Soak, directory: Path, title: str) -> list[Path]:
    """PNGs of each replica process's RSS and of counted (and PromQL-visible) vs truth over time."""
    increments: list[tuple[float, float]] = []  # (soak seconds, created increments PromQL sees there)
    for series in soak.raw_series.get(CREATED, []):
        values = [(float(ts) - soak.wall0, float(v)) for ts, v in series["values"]]
        for (_, before), (t, after) in itertools.pairwise(values):
            increments.append((t, after - before if after >= before else after))
    increments.sort()
    ratios: list[tuple[float, float | None, float | None]] = []
    seen, i = 0.0, 0
    for t, truth, counted in soak.ratios:
        while i < len(increments) and increments[i][0] <= t:
            seen += increments[i][1]
            i += 1
        if truth <= 0:
            continue
        ratios.append((t, counted / truth, seen / truth if increments else None))
    return plot_memory(soak.processes, ratios, directory, title)


def _traced_growth(memory: dict[str, dict[str, Any]], part: str) -> float | None:
    warm = memory.get("warm", {}).get("traced_mb", {}).get(part)
    end = memory.get("end", {}).get("traced_mb", {}).get(part)
    return round((end - warm) / warm, 4) if warm and end is not None else None
