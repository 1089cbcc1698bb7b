"""``python -m bench.instructions [--lines N] [--tree DIR] [--kinds K,...]``: P1's per-event work counted in
instructions, layer by layer.

Why: on this shared host a time ratio between two versions of the pipeline swings by ±15 % from one
minute to the next (docs/benchmarks.md), so a change worth 3-5 % cannot be told from noise in time.
Instructions executed, counted by valgrind's callgrind, are the same run after run. They are not time:
orjson's tight C loop retires several instructions per cycle and the interpreter fewer, so the instruction
ratio is not P1's ratio; it says how much work a change removed, not how fast the result runs.

What is counted, per watch line, each as (a run over ``N`` lines) - (the same run over none), so that
start-up, imports and the LISTs cancel out:
- ``orjson``: bare ``orjson.loads`` of each line (P1's reference);
- ``msgspec``: the typed decode of an update (``WatchEvent[TrainJobStatusWire]``, ``_typed_decode``);
- ``project``: the decode and the projection (``bench.scenarios._offline_layers``);
- ``ingest``: the whole Ingest and Cache with a handler that does nothing (the same);
- ``pipeline``: P1's pipeline from memory (``bench.scenarios._offline_rate``: Decoder, Cache, Ingest,
  TrainerState, journal, served ledger, metric state, then one render);
- ``plain``: the same pipeline without PromQL-exact counting (P9's baseline: no journal, no served ledger,
  no zero hold). Its count ÷ ``pipeline``'s is P9's ratio (ingest with ÷ without) in instructions.
Each of ``msgspec`` to ``pipeline`` includes the one before it, so the differences are the layers: projection,
ingest and cache, rules and counting.

The lines and LISTs come from ``bench.replay`` (the stream P1 reads), saved once per run; by default as many
lines as P1 reads, so each job gets P1's mix of events (about 30 over its four status variants, one of them
its first terminal edge; fewer lines weigh that edge more). ``--tree`` counts another checkout's ``app``
(e.g. a ``git worktree`` of the previous commit) over the same lines, with this checkout's ``bench`` (the
same harness for both).
Needs ``valgrind`` (Debian: ``apt-get install valgrind``); about 7 minutes at the default, two counts at a
time.
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

# Run under callgrind: load the saved lines, then do one kind of work over the first N of them. ``app`` comes
# from the tree counted, ``bench`` always from this checkout (argv[5]), so any two trees are counted by the
# same harness.
_WORKER = """
import importlib.util, logging, pickle, sys
sys.path.insert(0, sys.argv[1])
spec = importlib.util.spec_from_file_location(
    "bench", sys.argv[5] + "/bench/__init__.py", submodule_search_locations=[sys.argv[5] + "/bench"]
)
sys.modules["bench"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["bench"])
logging.getLogger("app.trainer.state").setLevel(logging.ERROR)
import orjson
from bench import scenarios
lists, lines = pickle.load(open(sys.argv[2], "rb"))
kind, lines = sys.argv[3], lines[: int(sys.argv[4])]
if kind in ("pipeline", "plain"):
    scenarios._offline_rate(lists, lines, exact=kind == "pipeline")
else:
    if kind == "orjson":
        process = orjson.loads
    elif kind == "msgspec":
        process = scenarios._typed_decode()
    else:
        process = scenarios._offline_layers(lists)[kind == "ingest"]
    for line in lines:
        process(line)
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
        str(ROOT),
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


KINDS = ("orjson", "msgspec", "project", "ingest", "pipeline", "plain")
# The layer each kind adds to the one before it (orjson is the reference, not a layer).
_LAYERS = {"project": "projection", "ingest": "ingest and cache", "pipeline": "rules and counting"}


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown kinds {unknown or text!r}; choose from {','.join(KINDS)}")
    return tuple(k for k in KINDS if k in kinds)


def _figures(tree: Path, lines: int, counts: dict[tuple[str, int], int]) -> dict[str, object]:
    kinds = [k for k in KINDS if (k, lines) in counts]
    per_line = {kind: (counts[(kind, lines)] - counts[(kind, 0)]) / lines for kind in kinds}
    figures: dict[str, object] = {
        "tree": str(tree),
        "lines": lines,
        "instructions_per_line": {k: round(v) for k, v in per_line.items()},
    }
    figures["layers_per_line"] = {
        layer: round(per_line[k] - per_line[before])
        for k, layer in _LAYERS.items()
        if k in per_line and (before := KINDS[KINDS.index(k) - 1]) in per_line
    }
    if "pipeline" in per_line:
        if "orjson" in per_line:
            figures["orjson_over_pipeline"] = round(per_line["orjson"] / per_line["pipeline"], 4)
        if "msgspec" in per_line:
            figures["pipeline_after_decode_per_line"] = round(per_line["pipeline"] - per_line["msgspec"])
        if "plain" in per_line:
            figures["plain_over_pipeline"] = round(per_line["plain"] / per_line["pipeline"], 4)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p1_events = scenarios.Sizes.make(quick=False).p1_events
    p.add_argument(
        "--lines",
        type=int,
        default=p1_events,
        help=f"watch lines per count (default {p1_events}, as many as P1 reads; fewer weigh each job's "
        "first terminal edge more: 10000 lines count ~101k instructions a line for the pipeline, 60000 ~86k)",
    )
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout whose app/ is counted (default: this)")
    p.add_argument(
        "--kinds", type=_kinds, default=KINDS, help=f"what to count (default: all of {','.join(KINDS)})"
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        print(f"saving {args.lines} lines from bench.replay ...", file=sys.stderr, flush=True)
        data = _save_lines(Path(tmp), args.lines)
        # The longest first, so that the two at a time finish together.
        jobs = [(kind, n) for n in (args.lines, 0) for kind in reversed(args.kinds)]
        print(f"{len(jobs)} callgrind runs, two at a time ...", file=sys.stderr, flush=True)
        counts: dict[tuple[str, int], int] = {}

        def count(job: tuple[str, int]) -> None:
            counts[job] = _count(tree, data, *job)
            print(f"  {len(counts)}/{len(jobs)}: {job[0]} over {job[1]} lines", file=sys.stderr, flush=True)

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(count, jobs))
    figures = _figures(tree, args.lines, counts)
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
