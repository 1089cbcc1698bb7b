"""``python -m bench.lagprobe --seconds S [--lags]``: P5's control. An idle asyncio loop in its own process
that only sleeps 1 ms and records how late it wakes, printed as JSON at the end (``--lags``: with every
sample, in seconds, under ``"lags"``; P5 draws the distribution from them).

It runs beside the service during the P5 firehose window: the same host, the same replay server and
scraper competing for the cores, but no work of its own. What it sees is the stall the host alone imposes
(the process descheduled in the middle of a slice), which the service's own probe cannot tell apart from
its own work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any


async def probe(seconds: float, interval: float = 0.001) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    max_lag, over_5ms = 0.0, 0
    lags: list[float] = []  # 1 kHz x seconds: a few thousand floats, kept whole for the distribution
    while loop.time() < end:
        before = loop.time()
        await asyncio.sleep(interval)
        lag = loop.time() - before - interval
        lags.append(lag)
        max_lag = max(max_lag, lag)
        over_5ms += lag > 0.005
    return {"max_lag": max_lag, "samples": len(lags), "over_5ms": over_5ms, "lags": lags}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lagprobe")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--lags", action="store_true", help="print every lag sample too (seconds)")
    args = p.parse_args(argv)
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    result = asyncio.run(probe(args.seconds))
    if not args.lags:
        del result["lags"]
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
