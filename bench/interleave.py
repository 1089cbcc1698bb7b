"""``python -m bench.interleave [--reps N] [--events N] [--read-bytes N,N...]``: where live P1's remainder is.

Why: live P1 runs below what its parts measured apart predict (the read path + orjson, and the pipeline from
memory; docs/benchmarks.md). This splits the difference. Each repetition runs, against one ``bench.replay``
stream, each rate divided by bare ``orjson.loads`` of lines fetched just before it in the same process:

- ``memory``: the pipeline from memory (``bench.scenarios._offline_rate``);
- ``read``: the informer's read path with nothing after it but ``orjson.loads`` (``_socket_orjson_rate``);
- ``two-phase``: the read path keeping every line as ``bytes``, then the same pipeline over the kept
  lines; the two phases are timed and added, so what differs from ``direct`` is only that no read comes
  between two events;
- ``direct@N``: the read path (N-byte reads) handing each line to the pipeline's ``process_line`` at once,
  without the Informer (no yields, no priority checks), at each ``--read-bytes``;
- ``informer``: P1 itself (``_informer_rate``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.common import print_medians


def direct_rate(kubeconfig: str, lists: list[bytes], events: int, read_bytes: int) -> tuple[float, Any]:
    """Lines per second through the read path straight into the pipeline; and the pipeline's Cache."""
    cache, ingest, metric_state = scenarios._offline_ingest(lists)
    seconds = asyncio.run(scenarios.read_watch_lines(kubeconfig, events, ingest.process_line, read_bytes))
    metric_state.render_text()  # the state really holds what it was fed
    return (events - 1) / seconds, cache


def two_phase_rate(kubeconfig: str, lists: list[bytes], events: int, read_bytes: int) -> tuple[float, Any]:
    """Lines per second reading every line first and then running the pipeline over them, both phases timed;
    and the pipeline's Cache."""
    cache, ingest, metric_state = scenarios._offline_ingest(lists)
    kept: list[bytes] = []
    keep = kept.append
    reading = asyncio.run(
        scenarios.read_watch_lines(kubeconfig, events, lambda line: keep(bytes(line)), read_bytes)
    )
    processing = events / scenarios._lines_rate(ingest.process_line, kept)
    metric_state.render_text()
    return events / (reading + processing), cache


def _runs(
    kubeconfig: str, lists: list[bytes], events: int, read_sizes: list[int]
) -> dict[str, Callable[[list[bytes]], float]]:
    """Each run by name: a function of the lines fetched for the repetition, returning its rate."""
    from app.kube.reflector import READ_BYTES

    def direct(read_bytes: int) -> Callable[[list[bytes]], float]:
        return lambda lines: direct_rate(kubeconfig, lists, events, read_bytes)[0]

    return {
        "memory": lambda lines: scenarios._offline_rate(lists, lines),
        "read": lambda lines: asyncio.run(scenarios._socket_orjson_rate(kubeconfig, events)),
        "two-phase": lambda lines: two_phase_rate(kubeconfig, lists, events, READ_BYTES)[0],
        **{f"direct@{n}": direct(n) for n in read_sizes},
        "informer": lambda lines: asyncio.run(scenarios._informer_rate(kubeconfig, events)),
    }


def _read_sizes(text: str) -> list[int]:
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive byte counts separated by commas, got {text!r}")
    return sizes


def main() -> None:
    from app.kube.reflector import READ_BYTES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = scenarios.Sizes.make(quick=False)
    p.add_argument("--reps", type=int, default=6, help="repetitions (default 6)")
    p.add_argument("--events", type=int, default=sizes.p1_events, help="watch events per run (default P1's)")
    p.add_argument(
        "--read-bytes",
        type=_read_sizes,
        default=[READ_BYTES],
        help=f"comma-separated read sizes for the direct loop (default the informer's, {READ_BYTES})",
    )
    args = p.parse_args()
    logging.getLogger("app.trainer.state").setLevel(logging.ERROR)  # the replay's few malformed jobs
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-interleave-") as tmp:
        kubeconfig = str(Path(tmp) / "replay.kubeconfig")
        # Every run reads ``events`` lines of an endless stream: no run can end early.
        replay, info = scenarios.start_replay(
            Path(tmp), kubeconfig, "interleave-replay", sizes.p1_jobs, "--forever"
        )
        try:
            lists = asyncio.run(scenarios._fetch_lists(info["url"]))
            runs = _runs(kubeconfig, lists, args.events, args.read_bytes)
            for rep in range(args.reps):
                lines = asyncio.run(scenarios._fetch_lines(info["url"], args.events))
                orjson_rate, _ = scenarios._decode_rates(lines)
                order = list(runs) if rep % 2 == 0 else list(reversed(runs))
                for name in order:
                    ratio = runs[name](lines) / orjson_rate
                    rows.setdefault(name, []).append(ratio)
                print(
                    f"{rep + 1}/{args.reps} bare orjson {orjson_rate:,.0f}: "
                    + ", ".join(f"{name} {rows[name][-1]:.2f}" for name in runs),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            replay.stop()
    print_medians(rows)


if __name__ == "__main__":
    main()
