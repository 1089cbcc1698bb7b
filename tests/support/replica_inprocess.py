"""One replica of the service in the test's own process and event loop: the in-process runner.

Its options are the process runner's (tests/support/replica_process.py): the ``Settings`` fields, plus how
it is served. ``start_replica`` builds the app ``trainer-metrics`` runs (``create_app``) and

* with ``lifespan=False`` (the default) starts its ``Service`` itself: the test holds it before it starts
  (``before_start``, a tap) and stops it (``stop``: ``Service.stop()``, or ``Service.kill()`` for a crash);
* with ``lifespan=True`` lets the app's lifespan start and stop it, as the CLI does (the embedded
  ``cluster`` of ``--simulate`` included); ``graceful_stop`` is then SIGTERM (app/serving/graceful.py: hand
  over while still serving, then shut down and release the Lease).

Its routes answer through ASGI (``http``, no socket) and, with ``serve=True``, over HTTP on loopback too:
on ``sock`` (a slot's held socket, tests/support/slots.py) or on ``settings.host:settings.port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from app.config import Settings
from app.main import ClusterFactory, create_app
from app.replica.service import Service
from app.serving.graceful import HandOverOnExit
from tests.support.samples import Samples, parse_samples
from tests.support.waiting import eventually

FAST_TIMINGS: dict[str, Any] = {
    "lease_duration_seconds": 1.5,
    "renew_deadline_seconds": 1.0,
    "retry_period_seconds": 0.2,
    "watch_timeout_min_seconds": 20,
    "watch_timeout_max_seconds": 30,
    "watch_inactivity_timeout_seconds": 5.0,
    # Born at zero for one scraper (the tests' own reads): a new series shows 0 on one served render,
    # then its values; a count is handed over as seen once a render showed it (app/handover/served.py).
    "zero_hold_seconds": 0.0,
}

# For tests that assert leadership never changes on its own (no takeover is part of the scenario): several
# replicas in one process on two cores kept busy by CPU burners have lagged a renew round past FAST_TIMINGS'
# 1 s renew deadline; the leader then steps down, as it must, and an unplanned term begins.
STEADY_TIMINGS: dict[str, Any] = {"lease_duration_seconds": 6.0, "renew_deadline_seconds": 4.0}

ASGIApp = Callable[..., Any]


def settings_for(kubeconfig: Path, identity: str, **overrides: Any) -> Settings:
    """The tests' settings: ``FAST_TIMINGS``, the Lease in ``default``, then ``overrides``."""
    values: dict[str, Any] = {
        "kubeconfig": str(kubeconfig),
        "identity": identity,
        "lease_namespace": "default",
        **FAST_TIMINGS,
    }
    values.update(overrides)
    return Settings(**values)


class _Server(HandOverOnExit, uvicorn.Server):
    """uvicorn with the real server's SIGTERM behaviour (hand over first) and without its signal handlers:
    several run at once in one process, and each would restore the handlers it found when it stops, in
    whatever order they stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Replica:
    service: Service
    http: httpx.AsyncClient  # its routes through ASGI, no socket
    app: FastAPI | None = None
    server: _Server | None = None
    serving: asyncio.Task[None] | None = None
    lifespan: bool = False

    @property
    def identity(self) -> str:
        return self.service.settings.identity

    @property
    def port(self) -> int:
        assert self.server is not None, "not served over HTTP"
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def metrics_text(self) -> str:
        resp = await self.http.get("/metrics")
        resp.raise_for_status()
        return resp.text

    async def samples(self) -> Samples:
        return parse_samples(await self.metrics_text())

    async def exporting(self) -> bool:
        return "kubeflow_trainer_" in await self.metrics_text()

    async def ready(self) -> bool:
        return (await self.http.get("/readyz")).status_code == 200

    async def stop(self, *, kill: bool = False) -> None:
        """``kill``: a crash (``Service.kill()``: no hand-over wait, no Lease release). Else the service stops
        (``Service.stop()``, or the lifespan's shutdown) before its HTTP server: a stop hands over while
        Prometheus still scrapes it."""
        try:
            if kill:
                await self.service.kill()
                if self.server is not None:
                    self.server.force_exit = True  # no lifespan shutdown, no release
            elif not self.lifespan:
                await self.service.stop()
        finally:
            if self.server is not None and self.serving is not None:
                self.server.should_exit = True
                with contextlib.suppress(Exception):
                    await self.serving
            if self.app is not None and not self.lifespan:
                self.app.state.service = None  # nothing may keep a stopped replica alive
            await self.http.aclose()

    async def graceful_stop(self) -> None:
        """SIGTERM to a served replica: hand over (still serving), then shut down and release the Lease."""
        assert self.server is not None and self.serving is not None, "not served over HTTP"
        await self.server.begin_graceful_stop()
        await self.serving
        await self.http.aclose()


async def start_replica(
    settings: Settings,
    *,
    serve: bool = False,
    sock: socket.socket | None = None,
    lifespan: bool = False,
    cluster: ClusterFactory | None = None,
    wrap: Callable[[FastAPI], ASGIApp] | None = None,
    before_start: Callable[[Service], None] | None = None,
) -> Replica:
    """Build and start one replica (see the module's docstring); ``wrap`` wraps the served ASGI app."""
    if lifespan and not serve:
        raise ValueError("the lifespan runs in the HTTP server: lifespan=True needs serve=True")
    app = create_app(settings, cluster=cluster)
    service: Service | None = None
    if not lifespan:
        service = Service(settings)
        if before_start is not None:
            before_start(service)
        await service.start()
        app.state.service = service
    server: _Server | None = None
    serving: asyncio.Task[None] | None = None
    if serve:
        config = uvicorn.Config(
            wrap(app) if wrap is not None else app,
            host=settings.host,
            port=settings.port,
            lifespan="on" if lifespan else "off",
            log_config=None,
            access_log=False,
        )
        server = _Server(config)
        task = serving = asyncio.create_task(
            server.serve(sockets=[sock] if sock is not None else None), name=f"http {settings.identity}"
        )
        running = server

        def started() -> bool:
            if task.done():
                task.result()
                raise RuntimeError(f"the HTTP server of {settings.identity} exited during start-up")
            return bool(running.started)

        await eventually(started, timeout=60, interval=0.01, what=f"the HTTP server of {settings.identity}")
    if service is None:
        service = app.state.service
        assert isinstance(service, Service)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica")
    return Replica(service, http, app, server, serving, lifespan)


@contextlib.asynccontextmanager
async def replica(kubeconfig: Path, identity: str = "replica-a", **overrides: Any) -> AsyncIterator[Replica]:
    """A replica with ``settings_for(kubeconfig, identity, **overrides)``, stopped on leaving."""
    r = await start_replica(settings_for(kubeconfig, identity, **overrides))
    try:
        yield r
    finally:
        await r.stop()
