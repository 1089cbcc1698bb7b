"""``python -m bench.instructions [--lines N] [--tree DIR]``: P1's per-event work counted in instructions.

Why: on this shared host a time ratio between two versions of the pipeline swings by ±15 % from one
minute to the next (docs/benchmarks.md), so a change worth 3-5 % cannot be told from noise in time.
Instructions executed, counted by valgrind's callgrind, are the same run after run. They are not time:
orjson's tight C loop retires several instructions per cycle and the interpreter fewer, so the instruction
ratio is not P1's ratio; it says how much work a change removed, not how fast the result runs.

What is counted, per watch line, each as (a run over ``N`` lines) - (the same run over none), so that
start-up, imports and the LISTs cancel out:
- ``orjson``: bare ``orjson.loads`` of each line (P1's reference);
- ``msgspec``: the typed decode (``WatchEvent[TrainJobWire]``);
- ``pipeline``: P1's pipeline from memory (``bench.scenarios._offline_rate``: Decoder, Cache, Ingest,
  TrainerState, journal, served ledger, metric state, then one render).

The lines and LISTs come from ``bench.replay`` (the stream P1 reads), saved once per run. ``--tree`` counts
another checkout's ``app`` (e.g. a ``git worktree`` of the previous commit) over the same lines.
Needs ``valgrind`` (Debian: ``apt-get install valgrind``); about a minute per count, two at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import scenarios
from bench.common import PYTHON, ROOT

_COLLECTED = re.compile(rb"Collected : (\d+)")

# Run under callgrind: load the saved lines, then do one kind of work over the first N of them.
_WORKER = """
import logging, pickle, sys
sys.path.insert(0, sys.argv[1])
logging.getLogger("app.trainer.state").setLevel(logging.ERROR)
import msgspec, orjson
from bench import scenarios
from app.kube.decode import WatchEvent
from app.trainer.wire import TrainJobWire
lists, lines = pickle.load(open(sys.argv[2], "rb"))
kind, lines = sys.argv[3], lines[: int(sys.argv[4])]
if kind == "pipeline":
    scenarios._offline_rate(lists, lines)
elif kind == "msgspec":
    decode = msgspec.json.Decoder(WatchEvent[TrainJobWire]).decode
    for line in lines:
        decode(line)
else:
    for line in lines:
        orjson.loads(line)
"""


def _count(tree: Path, data: Path, kind: str, lines: int) -> int:
    """Instructions callgrind counts for the worker doing ``kind`` over ``lines`` lines."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        PYTHON,
        "-c",
        _WORKER,
        str(tree),
        str(data),
        kind,
        str(lines),
    ]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, check=False)
    match = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"callgrind run failed ({kind}, {lines} lines): {done.stderr.decode()[-2000:]}")
    return int(match.group(1))


def _save_lines(work: Path, lines: int) -> Path:
    """``lines`` watch lines and the three LISTs of P1's replay (full mode's job count), pickled."""
    jobs = scenarios.Sizes.make(quick=False).p1_jobs
    replay, info = scenarios.start_replay(
        work, str(work / "replay.kubeconfig"), "instructions-replay", jobs, "--events", str(lines + 10)
    )
    try:
        saved = asyncio.run(scenarios._fetch_lines(info["url"], lines))
        lists = asyncio.run(scenarios._fetch_lists(info["url"]))
    finally:
        replay.stop()
    data = work / "lines.pickle"
    data.write_bytes(pickle.dumps((lists, saved)))
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--lines",
        type=int,
        default=10_000,
        help="watch lines per count (default 10000; several times the replay's 2000 jobs: the first pass "
        "over them is not typical, 2000 lines count ~60k instructions a line for the pipeline against ~100k)",
    )
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout whose app/ is counted (default: this)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        print(f"saving {args.lines} lines from bench.replay ...", file=sys.stderr, flush=True)
        data = _save_lines(Path(tmp), args.lines)
        jobs = [(kind, n) for kind in ("orjson", "msgspec", "pipeline") for n in (0, args.lines)]
        print(
            f"{len(jobs)} callgrind runs, two at a time (about a minute each) ...",
            file=sys.stderr,
            flush=True,
        )
        with ThreadPoolExecutor(2) as pool:
            counts = dict(zip(jobs, pool.map(lambda job: _count(tree, data, *job), jobs), strict=True))
    per_line = {
        kind: (counts[(kind, args.lines)] - counts[(kind, 0)]) / args.lines
        for kind in ("orjson", "msgspec", "pipeline")
    }
    figures = {
        "tree": str(tree),
        "lines": args.lines,
        "instructions_per_line": {k: round(v) for k, v in per_line.items()},
        "orjson_over_pipeline": round(per_line["orjson"] / per_line["pipeline"], 4),
        "pipeline_after_decode_per_line": round(per_line["pipeline"] - per_line["msgspec"]),
    }
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
