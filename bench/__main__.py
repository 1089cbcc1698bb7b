"""``python -m bench [--quick] [--output DIR] [--only P1,P5,...] [--reps N] [--strict] [--p8-jobs N]
[--plot]``

Runs the performance scenarios (P1-P9) against the simulated cluster (and a replay server for the watch
firehose), each in its own process, and writes ``benchmarks.md`` and ``benchmarks.json`` into ``--output``
(default: docs/ for a full run of every scenario; a new temporary directory for ``--quick`` or ``--only``,
whose report must not replace the full one in docs/). ``--quick``: small sizes, one repetition, never fails
on a target (CI smoke test).
P8 (bench/p8.py) runs 1,000,000 TrainJobs in full mode (1,000 quick); ``--p8-jobs N`` sets another size.
``--strict``: exit 1 when a target is missed (full mode only). ``--plot``: also draw PNGs into img/ of
``--output`` (bench/plot.py: memory, sync time and scrape p99 against TrainJobs, P5's stall distribution),
linked from benchmarks.md; the size sweep's points are the small cluster, a ~10k one
(``scenarios.mid_cluster``), the big cluster and P8's paginated LIST, as far as those steps ran.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import p8, report, scenarios
from bench.common import ROOT, machine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repetition, no timing assertions")
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="directory for benchmarks.md/.json (default: docs/ for a full run, else a new temporary one)",
    )
    p.add_argument("--only", default="", help="comma-separated scenarios, e.g. P1,P5 (default: all)")
    p.add_argument(
        "--reps", type=int, default=0, help="repetitions (default: 5 for P1, 3 otherwise; quick 1)"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if a target is missed (full mode)")
    p.add_argument(
        "--p8-jobs", type=int, default=0, help="TrainJobs for P8 (default: 1,000,000; quick 1,000)"
    )
    p.add_argument(
        "--plot",
        action="store_true",
        help="draw PNGs into --output/img (matplotlib) and link them from the report",
    )
    args = p.parse_args(argv)

    sizes = scenarios.Sizes.make(args.quick)
    if args.reps:
        sizes.reps = args.reps
    only = {s.strip().upper() for s in args.only.split(",") if s.strip()}
    args.output = report_dir(args.output, quick=args.quick, only=only)

    def want(*ids: str) -> bool:
        return not only or bool(only & set(ids))

    res = scenarios.Results()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        # (label, the scenarios a step serves, the step): a step runs when --only names one of them.
        steps: list[tuple[str, tuple[str, ...], Callable[[], None]]] = [
            ("P1", ("P1",), lambda: scenarios.p1_ingest(sizes, work, res)),
            ("P5", ("P5",), lambda: scenarios.p5_stall(sizes, work, res)),
            (
                "P2/P3/P4/P6/P7",
                ("P2", "P3", "P4", "P6", "P7"),
                lambda: scenarios.services_at_scale(_reps3(sizes), work, res),
            ),
            # The size sweep's ~10k point between the small and the big cluster: one service process.
            ("P2/P3/P4 sweep", ("P2", "P3", "P4"), lambda: scenarios.mid_cluster(sizes, work, res)),
            # One repetition unless asked: at a million TrainJobs each costs minutes and gigabytes.
            ("P8", ("P8",), lambda: p8.p8_million(sizes, work, res, jobs=args.p8_jobs, reps=args.reps or 1)),
        ]
        for label, ids, step in steps:
            if want(*ids):
                t = time.monotonic()
                print(f"bench: {label} ...", flush=True)
                step()
                print(f"bench: {label} done in {time.monotonic() - t:.0f} s", flush=True)
    big, small = res.notes.get("big_cluster"), res.notes.get("small_cluster")
    clusters = ""
    if big:
        clusters = (
            f"big: {big['trainjobs']:,} TrainJobs, {big['runtimes']} runtimes, "
            f"{big['namespaces']} namespaces (sim built in {big['build_seconds']} s)"
        )
    if small:
        clusters += f"; small: {small['trainjobs']:,} TrainJobs (same label sets)"
    mid = res.notes.get("mid_cluster")
    if mid:
        clusters += "; " if clusters else ""
        clusters += f"sweep: {mid['trainjobs']:,} TrainJobs (sim built in {mid['build_seconds']} s)"
    p8_cluster = res.notes.get("p8_cluster")
    if p8_cluster:
        clusters += "; " if clusters else ""
        clusters += (
            f"P8: {p8_cluster['trainjobs']:,} TrainJobs (sim built in {p8_cluster['build_seconds']} s, "
            f"sim RSS {res.notes['p8_sim_rss_built'] / 2**20:,.0f} MiB; P8 wall time "
            f"{res.notes['p8_wall_seconds']:.0f} s)"
        )
    meta = {
        "command": "python -m bench "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "quick": args.quick,
        "reps": sizes.reps,
        "wall_seconds": time.monotonic() - started,
        "clusters": clusters,
    }
    plots = _plot(res, args.output, meta) if args.plot else []
    md, js, misses = report.write(res, args.output, meta, plots)
    print(md.read_text(encoding="utf-8").split("\nRun details")[0])
    print(f"bench: wrote {md} and {js}")
    if misses:
        print("bench: targets missed: " + "; ".join(misses))
    return 1 if misses and args.strict and not args.quick else 0


def report_dir(output: Path | None, *, quick: bool, only: set[str]) -> Path:
    """Where the report goes: ``output`` when given; docs/ for a full run of every scenario; otherwise a new
    temporary directory, so that a smoke test or a partial run never replaces the full report in docs/."""
    if output is not None:
        return output
    if quick or only:
        return Path(tempfile.mkdtemp(prefix="bench-report-"))
    return ROOT / "docs"


def _plot(res: scenarios.Results, out_dir: Path, meta: dict[str, Any]) -> list[Path]:
    """The PNGs of ``--plot``; a failure to draw costs the plots, never the measured run's report."""
    from bench import plot

    try:
        figures = {k: f.as_dict() for k, f in res.figures.items()}
        # Beside the report, under img/ as docs/ keeps its images.
        written = plot.draw(res.notes, figures, out_dir / "img", subtitle=plot.subtitle(meta))
    except Exception as exc:  # e.g. matplotlib missing (it comes with the project's test extra)
        print(f"bench: no plots: {exc!r}")
        return []
    drawn = {p.name for p in written}
    print("bench: plots drawn: " + (", ".join(sorted(drawn)) or "none"))
    skipped = [name for name in plot.PLOTS if name not in drawn]
    if skipped:
        print("bench: plots skipped (no data in this run): " + ", ".join(skipped))
    return written


def _reps3(sizes: scenarios.Sizes) -> scenarios.Sizes:
    """The process-level scenarios cost tens of seconds per repetition: 3 at full size."""
    if sizes.quick or sizes.reps <= 3:
        return sizes
    import dataclasses

    return dataclasses.replace(sizes, reps=3)


if __name__ == "__main__":
    sys.exit(main())
