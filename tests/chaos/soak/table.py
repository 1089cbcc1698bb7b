"""The report as a table for a person."""

from __future__ import annotations

import json
import statistics
from typing import Any

from tests.chaos.soak.config import FAULT_KINDS


def render_table(report: dict[str, Any]) -> str:
    lines = []

    def row(name: str, value: Any) -> None:
        lines.append(f"{name:<40} {value}")

    row("mode", report["mode"])
    row("faults / settle (s)", f"{report['fault_seconds']} / {report['settle_seconds']}")
    row("generator steps", report["generator_steps"])
    row("TrainJobs created / finished", f"{report['trainjobs_created']} / {report['lifecycles_finished']}")
    u = report["unobservable_edges"]
    row(
        "edges no replica could see (excluded)",
        f"created {u['created']}, finished {u['finished']}, pod failures {u.get('pod_failed', 0)}",
    )
    pods = report.get("pod_failures") or {}
    if pods:
        j = report["pod_failures_unjoined"]
        row(
            "pod failures: truth / expected, pods at end",
            f"{pods['truth_total']} / {pods['expected_total']}, {pods['pods_end']}",
        )
        row(
            "  seen without their TrainJob (excluded)",
            f"by every replica {j['unjoined_everywhere']}, by some {j['unjoined_somewhere']} (allowed once)",
        )
    row("live TrainJobs at end (max_jobs)", f"{report['live_trainjobs_end']} ({report['max_jobs']})")
    for kind in FAULT_KINDS:
        row(f"  episodes: {kind}", report["episodes_by_kind"].get(kind, 0))
    row("  leaders demoted (residents)", report["demotions"])
    row("sim fault counters", json.dumps(report["sim_fault_counters"]))
    row("leader terms / replicas started", f"{report['leader_terms']} / {report['replicas_started']}")
    row("hand-overs not exact (kills etc.)", f"{report['non_exact_handovers']} of {len(report['handovers'])}")
    for name, c in report["counters"].items():
        short = name.removeprefix("kubeflow_trainer_trainjob_")
        row(
            f"  {short}",
            f"truth {c['truth_total']:g}, counted {c['counted_total']:g}, lost {c['lost']:g}, "
            f"double-count allowance {c['allowance_total']:g}, over allowance {c['over_allowance']:g}",
        )
    row("edges counted again, by cause", json.dumps(report["doubles_by_cause"]))
    row("at-risk edges not replayed (suspects)", report["at_risk_not_recounted"])
    row(
        "  suspects by class / unexplained",
        f"{json.dumps(report['suspects_by_class'])} / {report['unexplained_suspects']}",
    )
    row("uncertain edges settled at the floor", json.dumps(report["uncertain_settled"]))
    p = report.get("promql") or {}
    if p.get("checked"):
        row(
            "PromQL-visible vs truth (whole run)",
            f"{json.dumps(p['totals_visible_truth'])}; lost {len(p['lost'])} series, over allowance "
            f"{len(p['over_allowance'])}, born above 0: {p['born_above_zero']}",
        )
    else:
        row("PromQL-visible vs truth (whole run)", "not checked (no prometheus binary)")
    inv = report.get("promql_invariants") or {}
    if inv.get("checked"):
        row(
            "PromQL series / samples / targets",
            f"{inv['series']} / {inv['samples']} / {inv['targets']}",
        )
        row(
            "  served counts that went down",
            f"{inv['went_down']} (resets where a term started: {inv['resets_at_term_starts']})",
        )
        row("  targets seen above what they counted", inv["over_counted"])
    if report.get("promql_shortfalls") and (report.get("promql") or {}).get("lost"):
        # A hint where to look, not a verdict: a term that replayed counts an earlier term's scrapes had
        # shown (the crash bound) may show here too.
        row("  terms stored below their own counts", report["promql_shortfall_terms"])
        for s in report["promql_shortfalls"][:10]:
            row("   ", json.dumps(s))
    row("gauge series / differences", f"{report['gauge_series']} / {len(report['gauge_differences'])}")
    row(
        "Lease writes / watermark decreases",
        f"{report['lease_writes']} / {len(report['lease_watermark_decreases'])}",
    )
    row("liveness problems / dead tasks", f"{report['liveness_problems']} / {report['dead_tasks']}")
    row("ERROR log records", len(report["error_log_records"]))
    fractions = [min(s["not_ready_fraction"].values(), default=1.0) for s in report["stalls"]]
    row(
        "stalls checked (not calm) / min not-ready share",
        f"{len(fractions)} ({report['stalls_not_checked']}) / {min(fractions, default=None)}",
    )
    if report["mode"] == "processes":
        malloc = " ".join(f"{k}={v}" for k, v in report["replica_malloc_env"].items()) or "glibc defaults"
        lines.append(f"memory of each trainer-metrics process ({malloc}):")
        lines.append(
            "  RSS in MB; slopes over the window (s) after its bounded structures were full, in MB/min (RSS, "
            "glibc heap in use)"
        )
        lines.append("  and blocks/min (Python); trim: RSS at the end after malloc_trim(0); R: resident")
        lines.append(
            f"  {'process':<18} {'life (s)':<13} {'first':>6} {'warm':>6} {'end':>6} {'peak':>6} "
            f"{'growth':>7} {'full at':>7} {'window':>6} {'RSS':>7} {'heap':>7} {'blocks':>7} {'trim':>6}  "
            "structures at end"
        )
        churned = [p for p in report["processes"] if not p["resident"]]
        for proc in [p for p in report["processes"] if p["resident"]]:
            name = f"{proc['identity']}{' (R)' if proc['resident'] else ''}"
            life = f"{proc['started_s']:g}-{proc['stopped_s'] if proc['stopped_s'] is not None else 'end'}"
            growth = "" if proc["rss_growth"] is None else f"{100 * proc['rss_growth']:+.1f}%"
            end = proc.get("structures_end", {})
            sizes = (
                f"journal {end.get('journal_entries')}, tombstones {end.get('tombstones')}, terminal "
                f"{end.get('terminal_entries')}, cached {end.get('cached_objects')}, series "
                f"{end.get('metric_series')}"
                if end
                else ""
            )
            lines.append(
                f"  {name:<18} {life:<13} {_mb(proc['rss_first_mb'])} {_mb(proc['rss_warm_mb'])} "
                f"{_mb(proc['rss_end_mb'])} {_mb(proc['rss_peak_mb'])} {growth:>7} "
                f"{_mb(proc['full_at_s'], 7)} {proc['slope_window_s']:>6g} "
                f"{_signed(proc['rss_slope_mb_per_min'])} "
                f"{_signed(proc.get('heap_in_use_slope_mb_per_min'))} "
                f"{_signed(proc.get('python_blocks_per_min'), 0)} {_mb(proc.get('trimmed_end_mb'))}  {sizes}"
            )
        for proc in [p for p in report["processes"] if p["resident"] and "heap_trims" in p]:
            lines.append(
                f"  {proc['identity']}: {proc['heap_trims']} periodic heap trims (app/replica/heap_trim.py), "
                f"mean {proc['heap_trim_mean_ms']} ms, the longest under {proc['heap_trim_max_le_ms']} ms"
            )
        if churned:
            lives = [p["life_s"] for p in churned]
            ends = [p["rss_end_mb"] for p in churned if p["rss_end_mb"] is not None]
            growths = [p["rss_growth"] for p in churned if p["rss_growth"] is not None]
            lines.append(
                f"  {len(churned)} other processes (killed or restarted), lived "
                f"{min(lives):.0f}-{max(lives):.0f} s (median {statistics.median(lives):.0f}): "
                f"RSS at the end median {statistics.median(ends) if ends else '-'}, "
                f"max {max(ends, default='-')} MB, growth after "
                f"the warm-up at most {100 * max(growths, default=0):+.1f} %"
            )
        row(
            "this (the soak's) process RSS warm / end", f"{report['rss_warm_mb']} / {report['rss_end_mb']} MB"
        )
    else:
        row(
            "RSS warm / end / peak (MB), whole process",
            f"{report['rss_warm_mb']} / {report['rss_end_mb']} / {report['rss_peak_mb']}",
        )
        row(
            "trimmed RSS warm / end / growth",
            f"{report['rss_trimmed_warm_mb']} / {report['rss_trimmed_end_mb']} MB / "
            f"{100 * (report['rss_trimmed_growth'] or 0):.1f} %",
        )
        for point in ("warm", "end"):
            m = report["memory"].get(point)
            if m:
                traced = ", ".join(f"{k} {v}" for k, v in m.get("traced_mb", {}).items())
                row(
                    f"  memory at {point} ({m['t']} s)",
                    f"journal {m['journal_entries']}, tombstones {m['tombstones']}, "
                    f"cached {m['cached_objects']}, sim history {m['sim_history_events']}"
                    + (f"; traced MB: {traced}" if traced else ""),
                )
        row(
            "stopped replicas / still alive at end",
            f"{report['replicas_stopped']} / {report['stopped_services_alive'] or 'none'}",
        )
    row("harness problems", report["harness_problems"] or "none")
    return "\n".join(lines)


def _mb(value: float | None, width: int = 6) -> str:
    return f"{'-' if value is None else f'{value:g}':>{width}}"


def _signed(value: float | None, digits: int = 3, width: int = 7) -> str:
    return f"{'-' if value is None else f'{value:+.{digits}f}':>{width}}"
