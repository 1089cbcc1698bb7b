"""``python -m bench.split_bound [--reps N] [--events N] [--batch N]``: what P1 could reach with ingestion
split over two processes, bounded.

Why: P1 (live ingest ÷ bare ``orjson.loads``) stays near 0.6 on this 2-vCPU host although each layer of the
per-event work has been cut (docs/benchmarks.md). Even a projection that costs nothing leaves it at 0.72, so
one process cannot reach 0.8 here; the one way left is to spread the per-event work over both cores. Before
anyone builds that, this measures how far it could go at best.

What runs, alternated in each repetition against one ``bench.replay`` stream (the lines P1 reads):
- ``one``: P1 itself (``bench.scenarios._informer_rate``: the informer, the rules and the counting in one
  process);
- ``split``: a forked child reads the watch as the informer does (``KubeClient.stream``, bounded reads,
  ``LineSplitter``), decodes each line into the status wire, projects it against its own copy of the cached
  projections, and sends the projections in pickled batches down a pipe; the parent applies each one to the
  real Cache and Ingest, whose handler is the TrainerState with the journal, the served ledger and the metric
  state (``bench.scenarios._offline_ingest``).

Each is divided by bare ``orjson.loads`` of the same lines, measured just before it in the same process.

The ``split`` figure is an upper bound, not a design. Its parent is a blocking loop on the pipe, with no event
loop, reflector or scrape to share the process with. Its child keeps a second copy of every TrainJob's
projection, a second per-TrainJob cost that P3 (≤ 512 B per TrainJob, ~500 B today) has no room for.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import pickle
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.common import print_medians


def _read_and_project(kubeconfig: str, lists: list[bytes], events: int, batch: int, out: Connection) -> None:
    """The child: ``events`` watch lines read, decoded and projected as the informer does, sent in batches of
    ``(event type, projection)``; an empty message ends the stream."""
    cache, _, _ = scenarios._offline_ingest(lists, rules=False)
    project = scenarios.line_projector(dict(cache.store))
    pending: list[tuple[str, Any]] = []

    def send(line: Any) -> None:
        pending.append(project(line))
        if len(pending) >= batch:
            out.send_bytes(pickle.dumps(pending, protocol=5))
            pending.clear()

    try:
        asyncio.run(scenarios.read_watch_lines(kubeconfig, events, send))
    finally:  # the parent stops at the end message; a short stream fails the child, which the parent reports
        if pending:
            out.send_bytes(pickle.dumps(pending, protocol=5))
        out.send_bytes(b"")


def split_rate(kubeconfig: str, lists: list[bytes], events: int, batch: int) -> tuple[float, Any]:
    """Events per second the parent applies, from its first event to its last, with the child reading and
    projecting; and the parent's Cache (what it ended with)."""
    cache, ingest, metric_state = scenarios._offline_ingest(lists)
    apply = ingest._apply
    fork = multiprocessing.get_context("fork")  # the child inherits the imports and the LIST bodies
    receive, send = fork.Pipe(duplex=False)
    child = fork.Process(target=_read_and_project, args=(kubeconfig, lists, events, batch, send))
    child.start()
    send.close()
    applied, first, last = 0, 0.0, 0.0
    try:
        while message := receive.recv_bytes():
            for etype, obj in pickle.loads(message):
                apply(etype, obj)
                applied += 1
                if applied == 1:
                    first = time.perf_counter()
            last = time.perf_counter()
    finally:
        child.join(30)
    if child.exitcode != 0 or applied != events:
        raise RuntimeError(f"split: the child exited {child.exitcode} after {applied} of {events} events")
    metric_state.render_text()  # the state really holds what it was fed
    return (applied - 1) / (last - first), cache


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = scenarios.Sizes.make(quick=False)
    p.add_argument("--reps", type=int, default=6, help="repetitions of the alternated pair (default 6)")
    p.add_argument("--events", type=int, default=sizes.p1_events, help="watch events per run (default P1's)")
    p.add_argument("--batch", type=int, default=256, help="projections a message (default 256)")
    args = p.parse_args()
    logging.getLogger("app.trainer.state").setLevel(logging.ERROR)  # the replay's few malformed jobs
    rows: dict[str, list[float]] = {"one": [], "split": []}
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        kubeconfig = str(Path(tmp) / "replay.kubeconfig")
        replay, info = scenarios.start_replay(
            Path(tmp), kubeconfig, "split-replay", sizes.p1_jobs, "--events", str(args.events + 10)
        )
        try:
            lines = asyncio.run(scenarios._fetch_lines(info["url"], args.events))
            lists = asyncio.run(scenarios._fetch_lists(info["url"]))
            for rep in range(args.reps):
                for mode in ("one", "split") if rep % 2 == 0 else ("split", "one"):
                    orjson_rate, _ = scenarios._decode_rates(lines)
                    if mode == "one":
                        rate = asyncio.run(scenarios._informer_rate(kubeconfig, args.events))
                    else:
                        rate, _ = split_rate(kubeconfig, lists, args.events, args.batch)
                    rows[mode].append(rate / orjson_rate)
                    print(
                        f"{rep + 1}/{args.reps} {mode}: {rate:,.0f} ev/s, bare orjson {orjson_rate:,.0f}, "
                        f"ratio {rate / orjson_rate:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            replay.stop()
    print_medians(rows)


if __name__ == "__main__":
    main()
