"""``python -m tests.chaos.soak``: one soak run from the command line (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import tests.chaos.soak
from tests.chaos.soak.checks import check
from tests.chaos.soak.config import SoakConfig, long_run_config
from tests.chaos.soak.report import plot
from tests.chaos.soak.runner import run_soak_keeping
from tests.chaos.soak.table import render_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.soak", description=(tests.chaos.soak.__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of faults (default 10)")
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--rate", type=float, default=SoakConfig.rate, help="generator steps per second")
    parser.add_argument("--max-jobs", type=int, default=SoakConfig.max_jobs)
    parser.add_argument("--json", type=Path, help="also write the full report here")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="write rss.png and counted-vs-truth.png into DIR (matplotlib)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every replica on this process's event loop (the memory figures are then the whole process's)",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="tracemalloc: traced memory by part at warm-up and end (with --in-process)",
    )
    parser.add_argument(
        "--replica-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in each replica process's environment (after the image's MALLOC_* settings; an empty value "
        "unsets): e.g. --replica-env MALLOC_TRIM_THRESHOLD_= for glibc's default",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="Prometheus' data and the replicas' logs (default: a new temporary directory)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = long_run_config(args.minutes, seed=args.seed, processes=not args.in_process)
    cfg.rate, cfg.max_jobs, cfg.trace_memory = args.rate, args.max_jobs, args.trace_memory
    cfg.replica_env = dict(item.split("=", 1) for item in args.replica_env)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = os.getloadavg()
    cfg.progress_every = 60.0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trainer-metrics-soak-"))
    print(f"replica logs and Prometheus' data in {workdir}", file=sys.stderr, flush=True)
    report, soak = asyncio.run(run_soak_keeping(cfg, workdir))
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    print(f"chaos soak, {args.minutes:g} minutes of faults, seed {cfg.seed}, started {started}")
    print(f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {os.cpu_count()} cores")
    print(render_table(report))
    if args.plot:
        try:
            written = plot(soak, args.plot, f"{args.minutes:g}-minute soak, seed {cfg.seed}")
        except ImportError as exc:
            print(f"no plot: {exc} (matplotlib is in the project's test extra)")
        else:
            print("plots:", ", ".join(str(p) for p in written))
    failures = check(report, cfg)
    for f in failures:
        print("FAIL:", f)
    print("RESULT:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


def run_main() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run_main()
