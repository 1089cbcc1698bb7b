"""The chaos soak's replicas, in the soak's own process or each in a process of its own.

``InProcessReplica``: a ``Service`` on the soak's event loop, served over HTTP on its slot by a uvicorn of
the soak (lifespan off: the soak starts and stops the service), its tap (tests/chaos/tap.py) calling the
soak's handler directly. ``ProcessReplica``: ``python -m tests.chaos.replica_proc``, the service as the CLI
runs it, on its slot's inherited socket; its tap records come over a pipe, its state from its ``status``
records; a kill is SIGKILL, a graceful stop SIGTERM. Both answer the same questions (``ReplicaHandle``), so
the soak's checks are the same in either mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn

from app.main import create_app
from app.replica.service import Service
from tests.chaos.tap import Record, attach_informers, install_tap
from tests.support.harness import Replica, settings_for
from tests.support.slots import SlotSockets
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
OnRecord = Callable[[Record], None]


def image_malloc_env() -> dict[str, str]:
    """The glibc malloc settings the image runs the service with (the Dockerfile's ``MALLOC_*`` ENV): they
    decide how much freed heap a process keeps, so its RSS, as in production."""
    with contextlib.suppress(OSError):
        text = (REPO / "Dockerfile").read_text()
        return dict(re.findall(r"\b(MALLOC_[A-Z_]+)=(\d+)", text))
    return {}


class ReplicaHandle:
    """One replica instance (one pod: its identity, its slot)."""

    identity: str
    slot: int
    started: float  # time.monotonic()
    resident: bool = False  # never killed or restarted (its memory is followed for the whole run)
    http: httpx.AsyncClient
    pid: int | None = None

    def leading(self) -> bool:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def watching(self) -> bool:
        raise NotImplementedError

    def trainjob_rvs(self) -> list[int]:
        raise NotImplementedError

    def pending(self) -> int:
        raise NotImplementedError

    def counts_seen(self) -> bool:
        """Every count it made is out of its born-at-zero hold and seen by every scraper."""
        raise NotImplementedError

    def problems(self) -> tuple[list[str], list[str]]:
        """(liveness problems, background tasks that ended)."""
        raise NotImplementedError

    async def stop(self, *, kill: bool) -> None:
        raise NotImplementedError


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: several run at once in this process, and each would restore
    the handlers it found when it stops, in whatever order they stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class InProcessReplica(ReplicaHandle):
    def __init__(self, service: Service, replica: Replica, slot: int) -> None:
        self.service = service
        self.replica = replica  # its routes through ASGI, no socket (tests/support/harness.py)
        self.identity = service.settings.identity
        self.slot = slot
        self.started = time.monotonic()
        self.http = replica.http
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._app: Any = None

    @classmethod
    async def start(
        cls,
        kubeconfig: Path,
        identity: str,
        slot: int,
        sockets: SlotSockets,
        on_record: OnRecord,
        **overrides: Any,
    ) -> InProcessReplica:
        settings = settings_for(kubeconfig, identity, **overrides)
        service = Service(settings)
        install_tap(service, on_record)
        await service.start()
        attach_informers(service, on_record)  # built by start(), which has not yielded since
        app = create_app(settings)
        app.state.service = service
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica")
        self = cls(service, Replica(service, http), slot)
        self._app = app
        # Served on its slot's held socket for Prometheus; lifespan off: the soak starts and stops it.
        config = uvicorn.Config(
            app, host=sockets.host, port=sockets.port(slot), lifespan="off", log_config=None, access_log=False
        )
        server = self._server = _Server(config)
        serving = self._serving = asyncio.create_task(
            server.serve(sockets=[sockets.serving(slot)]), name=f"http {identity}"
        )

        def started() -> bool:
            if serving.done():
                serving.result()
                raise RuntimeError(f"the HTTP server of {identity} did not start")
            return bool(server.started)

        await eventually(started, 30.0, interval=0.01, what=f"the HTTP server of {identity}")
        return self

    def leading(self) -> bool:
        return self.service.journal.leading

    def ready(self) -> bool:
        return not self.service.readiness_problems()

    def watching(self) -> bool:
        return all(i.watching for i in self.service.informers)

    def trainjob_rvs(self) -> list[int]:
        return [int(i.resource_version or 0) for i in self.service._trainjob_informers]

    def pending(self) -> int:
        return self.service.state.pending_count

    def counts_seen(self) -> bool:
        return self.service.metric_state.held_series == 0 and self.service.ledger.all_seen()

    def problems(self) -> tuple[list[str], list[str]]:
        dead = [task.get_name() for task in self.service._tasks if task.done()]
        return self.service.liveness_problems(), dead

    async def stop(self, *, kill: bool) -> None:
        """A kill: ``Service.kill()`` (no hand-over wait, no Lease release). Its HTTP server stops after
        the service: a graceful stop hands over while Prometheus still scrapes it."""
        try:
            if kill:
                await self.service.kill()
            else:
                await self.service.stop()
        finally:
            if self._server is not None and self._serving is not None:
                self._server.should_exit = True
                with contextlib.suppress(Exception):
                    await self._serving
            if self._app is not None:
                self._app.state.service = None  # nothing may keep a stopped replica alive
            await self.http.aclose()


class ProcessReplica(ReplicaHandle):
    """``tests/chaos/replica_proc.py`` in a child process."""

    def __init__(self, identity: str, slot: int, port: int, log_path: Path) -> None:
        self.identity = identity
        self.slot = slot
        self.started = time.monotonic()
        self.port = port
        self.log_path = log_path
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
        self.status: Record = {}
        self.errors: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.exit_code: int | None = None

    @classmethod
    async def start(
        cls,
        kubeconfig: Path,
        identity: str,
        slot: int,
        sockets: SlotSockets,
        on_record: OnRecord,
        *,
        log_dir: Path,
        env: dict[str, str] | None = None,
        **overrides: Any,
    ) -> ProcessReplica:
        """``env``: set in the process's environment on top of the image's malloc settings ("" unsets)."""
        self = cls(identity, slot, sockets.port(slot), log_dir / f"{identity}-slot-{slot}.log")
        values = {
            "kubeconfig": str(kubeconfig),
            "identity": identity,
            "lease_namespace": "default",
            "host": sockets.host,
            "probe_port": 0,  # its own probe listener, on a port the kernel picks (nobody scrapes it)
            "log_level": "WARNING",
            **overrides,
        }
        read_fd, write_fd = os.pipe()
        listen_fd = sockets.fd(slot)
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINER_METRICS_", "MALLOC_"))}
        environ.update(image_malloc_env())
        environ.update(env or {})
        environ = {k: v for k, v in environ.items() if v != ""}
        try:
            with self.log_path.open("ab") as log:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "tests.chaos.replica_proc",
                    "--listen-fd",
                    str(listen_fd),
                    "--tap-fd",
                    str(write_fd),
                    "--settings",
                    json.dumps(values),
                    pass_fds=(listen_fd, write_fd),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=REPO,
                    env=environ,
                )
        finally:
            os.close(write_fd)
        self.pid = self.proc.pid
        self._reader = asyncio.create_task(self._read(read_fd, on_record), name=f"tap {identity}")

        async def serving() -> bool:
            if self.proc is not None and self.proc.returncode is not None:
                raise RuntimeError(f"{identity} exited ({self.proc.returncode}): {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                return (await self.http.get("/livez")).status_code == 200
            return False

        await eventually(serving, 60.0, interval=0.05, what=f"{identity} serving")
        return self

    async def _read(self, fd: int, on_record: OnRecord) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            async for line in reader:
                record = orjson.loads(line)
                kind = record["k"]
                if kind == "status":
                    self.status = record
                elif kind == "error":
                    self.errors.append(record["text"])
                else:
                    on_record(record)
        finally:
            transport.close()

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def leading(self) -> bool:
        return bool(self.status.get("leading"))

    def ready(self) -> bool:
        return bool(self.status.get("ready"))

    def watching(self) -> bool:
        return bool(self.status.get("watching"))

    def trainjob_rvs(self) -> list[int]:
        return list(self.status.get("rvs", [0]))

    def pending(self) -> int:
        return int(self.status.get("pending", 0))

    def counts_seen(self) -> bool:
        return self.status.get("held") == 0 and bool(self.status.get("all_seen"))

    def problems(self) -> tuple[list[str], list[str]]:
        problems = list(self.status.get("liveness", []))
        if self.proc is not None and self.proc.returncode is not None and self.exit_code is None:
            problems.append(f"process exited ({self.proc.returncode})")
        return problems, list(self.status.get("dead", []))

    async def stop(self, *, kill: bool) -> None:
        """SIGKILL, or SIGTERM (the service hands over while still serving, then releases the Lease);
        returns once the process has exited and every record it wrote has been handled."""
        proc = self.proc
        assert proc is not None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 60.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        self.exit_code = proc.returncode
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 30.0)
        await self.http.aclose()
