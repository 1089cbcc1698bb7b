"""One trainer-metrics replica in a process of its own, for the chaos soak (tests/chaos/soak.py).

``python -m tests.chaos.replica_proc --listen-fd N --tap-fd M --settings JSON``

It runs what ``app.cli.main`` runs: ``create_app(owns_process=True)`` behind ``app.serving.server.HttpServer``
(the connection guard, the probe listener on a port of its own, uvicorn, SIGTERM hands over before shutting
down), with two differences:

* the main listener is the soak's slot socket, inherited as descriptor N (bound by the soak before any
  replica started and held by it for the whole run, tests/support/slots.py), not one it binds itself;
* the soak's tap (tests/chaos/tap.py) writes one JSON line per record to descriptor M, plus a ``status``
  record every 0.1 s, and an ``error`` record per ERROR log line. It keeps nothing;
  ``GET /soak/memory[?trim=1]`` answers the process's allocator figures: glibc's heap (mallinfo2) and
  Python's allocated blocks (with ``trim``, after a full collection and ``malloc_trim(0)``, which returns
  the free heap pages to the kernel). The soak reads RSS from /proc itself, and the sizes of the bounded
  structures from ``/debug/snapshot``.

Logs (WARNING and above; the elector's and the service's INFO too) go to stderr, which the soak sends to a
file per replica. The soak starts it with the image's glibc malloc settings (the Dockerfile's ``MALLOC_*``),
which decide how much freed heap it keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import socket
import sys
from typing import Any

import orjson
from fastapi.responses import JSONResponse

from app.config import load_settings
from app.main import create_app
from app.replica.extra_telemetry import register_collector
from app.replica.service import Service
from app.serving.listeners import GuardedListener
from app.serving.logging_setup import configure_logging
from app.serving.server import HttpServer
from tests.chaos.tap import Record, attach_informers, install_tap, status_record

STATUS_INTERVAL = 0.1


class TapWriter:
    """JSON lines to the soak's pipe. A record is written at once (a killed process loses none it made)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.broken = False

    def __call__(self, record: Record) -> None:
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.replica_proc")
    p.add_argument("--listen-fd", type=int, required=True)
    p.add_argument("--tap-fd", type=int, required=True)
    p.add_argument("--settings", required=True, help="Settings fields as a JSON object")
    args = p.parse_args(argv)
    values: dict[str, Any] = json.loads(args.settings)
    # The main listener is the inherited slot socket; port 0 only for the one HttpServer binds and drops.
    settings = load_settings(**{**values, "port": 0})
    configure_logging("WARNING", "text")
    # Who led when, and why a candidate waited: what a failed demotion or hand-over is read from afterwards.
    for name in ("app.kube.elector", "app.replica.service"):  # candidacy logs as the service
        logging.getLogger(name).setLevel(logging.INFO)
    tap = TapWriter(args.tap_fd)
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

    app = create_app(settings, owns_process=True)

    @app.get("/soak/memory", include_in_schema=False)
    async def memory(trim: str = "") -> JSONResponse:
        return JSONResponse(memory_reading(trim == "1"))

    server = HttpServer(app, settings)
    spare, listener = (
        server.main_socket,
        GuardedListener(socket.AF_INET, socket.SOCK_STREAM, 0, args.listen_fd),
    )
    listener.setup(server.main_guard)
    server.main_socket = listener
    spare.close()
    register_collector(app, server.telemetry)
    asyncio.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
