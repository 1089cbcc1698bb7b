"""``python -m bench [--quick] [--output DIR] [--only P1,P5,...] [--reps N] [--strict]``

Runs the performance scenarios of issue #6 against the simulated cluster (and a replay server for the watch
firehose), each in its own process, and writes ``benchmarks.md`` and ``benchmarks.json`` into ``--output``
(default: docs/). ``--quick``: small sizes, one repetition, never fails on a target (CI smoke test).
``--strict``: exit 1 when a target is missed (full mode only).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import report, scenarios
from bench.common import ROOT, machine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repetition, no timing assertions")
    p.add_argument("--output", type=Path, default=ROOT / "docs", help="directory for benchmarks.md/.json")
    p.add_argument("--only", default="", help="comma-separated scenarios, e.g. P1,P5 (default: all)")
    p.add_argument(
        "--reps", type=int, default=0, help="repetitions (default: 5 for P1, 3 otherwise; quick 1)"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if a target is missed (full mode)")
    args = p.parse_args(argv)

    sizes = scenarios.Sizes.make(args.quick)
    if args.reps:
        sizes.reps = args.reps
    only = {s.strip().upper() for s in args.only.split(",") if s.strip()}

    def want(*ids: str) -> bool:
        return not only or bool(only & set(ids))

    res = scenarios.Results()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        steps = [
            (("P1",), lambda: scenarios.p1_ingest(sizes, work, res)),
            (("P5",), lambda: scenarios.p5_stall(sizes, work, res)),
            (("P2", "P3", "P4", "P6", "P7"), lambda: scenarios.services_at_scale(_reps3(sizes), work, res)),
        ]
        for ids, step in steps:
            if want(*ids):
                t = time.monotonic()
                print(f"bench: {'/'.join(ids)} ...", flush=True)
                step()
                print(f"bench: {'/'.join(ids)} done in {time.monotonic() - t:.0f} s", flush=True)
    big, small = res.notes.get("big_cluster"), res.notes.get("small_cluster")
    clusters = ""
    if big:
        clusters = (
            f"big: {big['trainjobs']:,} TrainJobs, {big['runtimes']} runtimes, "
            f"{big['namespaces']} namespaces (sim built in {big['build_seconds']} s)"
        )
    if small:
        clusters += f"; small: {small['trainjobs']:,} TrainJobs (same label sets)"
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
    md, js, misses = report.write(res, args.output, meta)
    print(md.read_text(encoding="utf-8").split("\nRun details")[0])
    print(f"bench: wrote {md} and {js}")
    if misses:
        print("bench: targets missed: " + "; ".join(misses))
    return 1 if misses and args.strict and not args.quick else 0


def _reps3(sizes: scenarios.Sizes) -> scenarios.Sizes:
    """The process-level scenarios cost tens of seconds per repetition: 3 at full size."""
    if sizes.quick or sizes.reps <= 3:
        return sizes
    import dataclasses

    return dataclasses.replace(sizes, reps=3)


if __name__ == "__main__":
    sys.exit(main())
