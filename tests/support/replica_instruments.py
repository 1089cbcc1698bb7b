"""What the process runner (tests/support/replica_process.py) can add to a replica process, each an option:

* ``--lag-probe`` (the benchmarks): an event-loop lag probe, a task sleeping 1 ms and recording how late it
  wakes, read at ``GET /bench/lag`` (``?reset=1`` clears it; ``?lags=1`` adds every sample since the last
  reset, in seconds, under ``"lags"``); the probe starts at the first read;
* ``--memory`` (the chaos soak): ``GET /soak/memory[?trim=1]``, the process's allocator figures: glibc's heap
  (mallinfo2) and Python's allocated blocks (with ``trim``, after a full collection and ``malloc_trim(0)``,
  which returns the free heap pages to the kernel);
* ``--tap-fd M`` (the chaos soak): its tap (tests/chaos/tap.py) writes one JSON line per record to descriptor
  M, plus a ``status`` record every 0.1 s and an ``error`` record per ERROR log line; it keeps nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import sys
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app.replica.service import Service

STATUS_INTERVAL = 0.1


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


def add_lag_probe(app: FastAPI) -> LagProbe:
    probe = LagProbe()

    @app.get("/bench/lag", include_in_schema=False)
    async def lag(reset: str = "", lags: str = "") -> JSONResponse:
        if probe.task is None:
            probe.task = asyncio.create_task(probe.run())
        return JSONResponse(probe.reading(reset == "1", lags == "1"))

    return probe


def _mallinfo() -> dict[str, int]:
    """glibc's heap figures (mallinfo2): in use, free in the heap, mmapped."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "heap": info.arena,  # bytes the heaps take from the kernel (brk and arenas of other threads)
        "heap_in_use": info.uordblks,
        "heap_free": info.fordblks,
        "mmapped": info.hblkhd,
    }


def memory_reading(trim: bool) -> dict[str, Any]:
    if trim:
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    status = {}
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                status[key] = int(value.split()[0]) * 1024
    return {
        **status,
        **_mallinfo(),
        "python_blocks": sys.getallocatedblocks(),  # pymalloc's blocks in use (objects up to 512 bytes)
        "trimmed": trim,
    }


def add_memory_route(app: FastAPI) -> None:
    @app.get("/soak/memory", include_in_schema=False)
    async def memory(trim: str = "") -> JSONResponse:
        return JSONResponse(memory_reading(trim == "1"))


class TapWriter:
    """JSON lines to the soak's pipe. A record is written at once (a killed process loses none it made)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.broken = False

    def __call__(self, record: dict[str, Any]) -> None:
        if self.broken:
            return
        try:
            os.write(self.fd, orjson.dumps(record) + b"\n")
        except OSError:
            self.broken = True  # the soak has gone: carry on as a replica would


class ErrorRecords(logging.Handler):
    """ERROR log records as ``error`` records (the soak fails on any)."""

    def __init__(self, tap: TapWriter) -> None:
        super().__init__(logging.ERROR)
        self.tap = tap

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        self.tap({"k": "error", "text": text[:500]})


def install_soak_tap(fd: int) -> None:
    """The chaos soak's tap on this process's one replica, its records to descriptor ``fd``."""
    from tests.chaos.tap import attach_informers, install_tap, status_record

    # Who led when, and why a candidate waited: what a failed demotion or hand-over is read from afterwards.
    for name in ("app.kube.elector", "app.replica.service"):  # candidacy logs as the service
        logging.getLogger(name).setLevel(logging.INFO)
    tap = TapWriter(fd)
    logging.getLogger().addHandler(ErrorRecords(tap))
    start = Service.start

    async def tapped_start(service: Service) -> None:
        install_tap(service, tap)
        await start(service)
        attach_informers(service, tap)  # the informers exist now and have not run yet

        async def statuses() -> None:
            while True:
                tap(status_record(service))
                await asyncio.sleep(STATUS_INTERVAL)  # the status record's period

        service._spawn(statuses(), "soak status")

    Service.start = tapped_start  # type: ignore[method-assign,assignment]  # one replica per process
