"""Every guarantee the soak checks, read from its report as failure messages."""

from __future__ import annotations

from typing import Any

from tests.chaos.soak.config import FAULT_KINDS, SoakConfig


def check(report: dict[str, Any], cfg: SoakConfig) -> list[str]:
    """Every guarantee the soak checks, as failure messages (empty: all held)."""
    out = []
    out += report["count_violations"]
    if report["overlapping_terms"]:
        out.append(f"leader terms overlapped: {report['overlapping_terms']}")
    if report["gauge_differences"]:
        out.append(f"trainjobs gauge differs from the truth: {report['gauge_differences']}")
    if report["liveness_problems"] or report["dead_tasks"]:
        out.append(f"liveness: {report['liveness_problems']} {report['dead_tasks']}")
    if report["error_log_records"] or report["loop_exceptions"]:
        out.append(f"errors logged: {report['error_log_records'][:5]} {report['loop_exceptions'][:5]}")
    out += memory_failures(report, cfg)
    if report["stopped_services_alive"]:
        out.append(f"stopped replicas not freed: {report['stopped_services_alive']}")
    if report["harness_problems"]:
        out.append(f"harness: {report['harness_problems']}")
    if report["counts_outside_terms"]:
        out.append(f"counts recorded outside any leader term: {report['counts_outside_terms']}")
    if report["doubles_unexplained"]:
        out.append(f"edges counted again for no documented cause: {report['doubles_by_cause']}")
    if report["unexplained_suspects"]:
        out.append(
            f"{report['unexplained_suspects']} edges counted above the published watermark were neither "
            f"counted again by the next leader nor shown by a served render: "
            f"{report['unexplained_suspect_examples'][:3]}"
        )
    if report["lease_watermark_decreases"]:
        out.append(f"Lease watermark went down: {report['lease_watermark_decreases'][:5]}")
    promql = report.get("promql") or {}
    if promql.get("checked") and (promql["lost"] or promql["over_allowance"] or promql["born_above_zero"]):
        out.append(
            f"PromQL: lost {promql['lost']}, over allowance {promql['over_allowance']}, "
            f"series born above 0: {promql['born_above_zero']}"
        )
    inv = report.get("promql_invariants") or {}
    if promql.get("checked") and not inv.get("checked"):
        out.append("PromQL: the stored series were not read")
    if inv.get("went_down"):
        out.append(f"PromQL: served counts went down outside a term start: {inv['went_down_examples'][:3]}")
    if inv.get("over_counted"):
        out.append(f"PromQL: targets seen above what they counted: {inv['over_counted_examples'][:3]}")
    for kind in FAULT_KINDS:
        if not report["episodes_by_kind"].get(kind):
            out.append(f"fault kind {kind} never injected")
    out += readiness_failures(report)
    return out


def memory_failures(report: dict[str, Any], cfg: SoakConfig) -> list[str]:
    """Process mode: each resident process's RSS grows at most ``memory_growth_limit`` after the warm-up,
    and, once the window after its bounded structures were full spans ``slope_min_window``, its slope is
    under ``slope_limit``. In-process, the whole process (simulator, generator, checks and replicas) is
    reported and not checked: only a process of its own measures the service."""
    if report["mode"] != "processes":
        return []
    out = []
    residents = [p for p in report["processes"] if p["resident"]]
    if len(residents) < min(cfg.residents, cfg.replicas):
        out.append(f"memory: {len(residents)} resident processes measured")
    for proc in residents:
        name = proc["identity"]
        if proc["rss_growth"] is None:
            out.append(f"memory: no RSS reading of {name} after the warm-up")
        elif proc["rss_growth"] > cfg.memory_growth_limit:
            out.append(
                f"memory: RSS of {name} grew {100 * proc['rss_growth']:.1f} % after the warm-up "
                f"({proc['rss_warm_mb']} -> {proc['rss_end_mb']} MB)"
            )
        slope = proc["rss_slope_mb_per_min"]
        if proc["slope_from_full"] and proc["slope_window_s"] >= cfg.slope_min_window:
            if slope is None or slope > cfg.slope_limit:
                out.append(
                    f"memory: RSS slope of {name} {slope} MB/min over the last {proc['slope_window_s']} s "
                    f"(structures full from {proc['full_at_s']} s)"
                )
        elif cfg.fault_seconds >= cfg.slope_min_window * 2 + cfg.warmup_seconds:
            out.append(f"memory: no {cfg.slope_min_window:g} s window with {name}'s structures full")
    return out


def readiness_failures(report: dict[str, Any]) -> list[str]:
    out = []
    if not report["stalls"]:
        out.append("no stall long enough to check readiness")
    for s in report["stalls"]:
        for identity, frac in s["not_ready_fraction"].items():
            if frac < 0.8:
                out.append(
                    f"stall {s['start']}-{s['end']}: {identity} not ready in only {frac:.0%} of samples"
                )
        for identity, ok in s["ready_again_later"].items():
            if not ok:
                out.append(f"stall {s['start']}-{s['end']}: {identity} never ready again after the stall")
    return out
