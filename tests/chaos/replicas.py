"""The chaos soak's replicas, in the soak's own process or each in a process of its own.

``InProcessReplica``: a replica of the in-process runner (tests/support/replica_inprocess.py) on the soak's
event loop, served over HTTP on its slot (lifespan off: the soak starts and stops the service), its tap
(tests/chaos/tap.py) calling the soak's handler directly. ``ProcessReplica``: one of the process runner
(tests/support/replica_process.py), the service as the CLI runs it, on its slot's inherited socket; its tap
records come over a pipe, its state from its ``status`` records; a kill is SIGKILL, a graceful stop SIGTERM.
Both answer the same questions (``ReplicaHandle``), so the soak's checks are the same in either mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.chaos.tap import Record, attach_informers, install_tap
from tests.support import replica_process
from tests.support.replica_inprocess import Replica, settings_for, start_replica
from tests.support.slots import SlotSockets
from tests.support.waiting import eventually

OnRecord = Callable[[Record], None]


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

    def pod_rvs(self) -> list[int]:
        """The pods informers' resourceVersions (none before a pods informer is built)."""
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


class InProcessReplica(ReplicaHandle):
    def __init__(self, replica: Replica, slot: int) -> None:
        self.replica = replica
        self.service = replica.service
        self.identity = replica.identity
        self.slot = slot
        self.started = time.monotonic()
        self.http = replica.http

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
        settings = settings_for(kubeconfig, identity, host=sockets.host, port=sockets.port(slot), **overrides)
        replica = await start_replica(
            settings,
            serve=True,
            sock=sockets.serving(slot),  # its slot's held socket, for Prometheus
            before_start=lambda service: install_tap(service, on_record),
        )
        attach_informers(replica.service, on_record)  # built by start(), which has not yielded since
        return cls(replica, slot)

    def leading(self) -> bool:
        return self.service.journal.leading

    def ready(self) -> bool:
        return not self.service.readiness_problems()

    def watching(self) -> bool:
        return all(i.watching for i in self.service.informers)

    def trainjob_rvs(self) -> list[int]:
        return [int(i.resource_version or 0) for i in self.service._trainjob_informers]

    def pod_rvs(self) -> list[int]:
        watches = self.service.pods.pod_watches
        return [int(w.informer.resource_version or 0) for w in watches if w.informer is not None]

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
        await self.replica.stop(kill=kill)


class ProcessReplica(ReplicaHandle):
    """A replica process (tests/support/replica_process.py) with the soak's tap and memory readings."""

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
        settings = {
            "kubeconfig": str(kubeconfig),
            "identity": identity,
            "lease_namespace": "default",
            "host": sockets.host,
            "port": 0,  # the main listener is the slot's inherited socket
            "probe_port": 0,  # its own probe listener, on a port the kernel picks (nobody scrapes it)
            "log_level": "WARNING",
            **overrides,
        }
        read_fd, write_fd = os.pipe()
        listen_fd = sockets.fd(slot)
        environ = replica_process.environment(
            settings,
            extra={**replica_process.image_malloc_env(), **(env or {})},
            base={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")},
        )
        try:
            with self.log_path.open("ab") as log:
                self.proc = await asyncio.create_subprocess_exec(
                    *replica_process.command(listen_fd=listen_fd, tap_fd=write_fd, memory=True),
                    pass_fds=(listen_fd, write_fd),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=replica_process.REPO,
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

    def pod_rvs(self) -> list[int]:
        return list(self.status.get("pod_rvs", []))

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
