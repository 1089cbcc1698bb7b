"""The service under test, as ``trainer-metrics`` would run it, plus bench-only instrumentation.

``python -m bench.serviceproc --kubeconfig K [--port P] [--lag-probe] [--per-trainjob-max-jobs N]
[--streaming-list auto|on|off]`` does what ``app.cli.main`` does (load_settings → create_app → the product's
HttpServer, app/serving/server.py, without its probe port) with ``--no-leader-election`` (and the
per-TrainJob series on, capped at N, when N > 0; the informers' sync by ``TRAINER_METRICS_STREAMING_LIST``
when given); with ``--lag-probe`` it also runs an event-loop lag probe (a task sleeping 1 ms and recording
how late it wakes) and serves its reading at ``GET /bench/lag`` (``?reset=1`` clears it; ``?lags=1`` adds
every sample since the last reset, in seconds, under ``"lags"``). Nothing else differs from the real entry
point. It binds its port (by default 0: one the kernel picks) before its ready line, which says which port
it holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


class LagProbe:
    """Samples event-loop lag: sleep(interval) and measure the oversleep.

    Every sample is kept too (P5 draws the distribution), up to ``max_kept`` since the last reset: a
    reader that never resets must not grow the process it measures without bound."""

    def __init__(self, interval: float = 0.001, max_kept: int = 120_000) -> None:
        self.interval = interval
        self.max_kept = max_kept  # two minutes at 1 kHz; P5's window is ~8 s
        self.max_lag = 0.0
        self.samples = 0
        self.over_5ms = 0
        self.lags: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval)
            lag = loop.time() - before - self.interval
            self.samples += 1
            self.max_lag = max(self.max_lag, lag)
            if lag > 0.005:
                self.over_5ms += 1
            if len(self.lags) < self.max_kept:
                self.lags.append(lag)

    def reading(self, reset: bool, lags: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"max_lag": self.max_lag, "samples": self.samples, "over_5ms": self.over_5ms}
        if lags:
            out["lags"] = self.lags
        if reset:
            self.max_lag, self.samples, self.over_5ms, self.lags = 0.0, 0, 0, []
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serviceproc")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--port", type=int, default=0, help="0 (the default): a port the kernel picks")
    p.add_argument("--lag-probe", action="store_true")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument(
        "--per-trainjob-max-jobs",
        type=int,
        default=0,
        help="turn the per-TrainJob series on, with this cap (0: off, the default)",
    )
    p.add_argument("--streaming-list", choices=("auto", "on", "off"), default=None)
    p.add_argument(
        "--no-exact",
        action="store_true",
        help="P9's baseline: no born-at-zero hold and no hand-over journal (what PromQL-exact counting adds)",
    )
    args = p.parse_args(argv)
    t0 = time.monotonic()

    from fastapi.responses import JSONResponse

    from app.config import load_settings
    from app.main import create_app
    from app.serving.logging_setup import configure_logging

    extra: dict[str, object] = {"streaming_list": args.streaming_list} if args.streaming_list else {}
    if args.no_exact:
        extra.update(zero_hold_seconds=0.0, handover_journal_size=0)
    settings = load_settings(
        **extra,
        kubeconfig=args.kubeconfig,
        port=args.port,
        host="127.0.0.1",
        probe_port=None,
        leader_election=False,
        log_level=args.log_level,
        per_trainjob_series=args.per_trainjob_max_jobs > 0,
        per_trainjob_max_jobs=args.per_trainjob_max_jobs,
    )
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings, owns_process=True)  # one replica per process, as the CLI runs it
    probe = LagProbe()

    if args.lag_probe:

        @app.get("/bench/lag", include_in_schema=False)
        async def lag(reset: str = "", lags: str = "") -> JSONResponse:
            if probe.task is None:
                probe.task = asyncio.create_task(probe.run())
            return JSONResponse(probe.reading(reset == "1", lags == "1"))

    # The product's own server (app/serving/server.py, as app.cli runs it): its guarded listener and
    # protocol are part of what a scrape costs. No probe listener: several services run side by side.
    from app.replica.extra_telemetry import register_collector
    from app.serving.server import HttpServer

    server = HttpServer(app, settings)
    register_collector(app, server.telemetry)
    ready = {"ready": True, "import_seconds": time.monotonic() - t0, "port": server.port}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    asyncio.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
