"""The HTTP server: uvicorn, with the connection limits uvicorn does not have.

Why uvicorn plus a guard, and not another server. uvicorn 0.54 bounds the size of a request head
(``h11_max_incomplete_event_size``) and idle keep-alive connections (``timeout_keep_alive``), but not the time
a client takes to send its head: its keep-alive timer starts only after a response and is cancelled by the
first byte of the next request, so a client that connects and sends nothing, or one byte every few seconds,
holds its connection and file descriptor for ever. ``limit_concurrency`` does not help either: it answers 503
once a request head has arrived, so it never sees those connections at all. Other ASGI servers (hypercorn,
granian) have read timeouts, but switching would mean a new dependency in the image and redoing what uvicorn
gives us in one process (the live ``ssl.SSLContext`` that app/serving/tls.py reloads in place, the embedded
simulated cluster), and none of them makes room for probes and scrapers at a connection cap, which is the part
that matters under a flood. What is missing is small, so it is added below uvicorn, where every connection is
seen from its first instant, in ``app/serving/``, one job per module:

- ``guard.py``: ``ConnectionGuard``, the accounting: per-listener and per-client caps, displacement of
  waiting connections only, the header and response deadlines.
- ``listeners.py``: ``GuardedListener``, the listening socket whose ``accept()`` admits through the guard,
  and copes with running out of descriptors; ``bind_listener``.
- ``protocol.py``: ``GuardedH11Protocol``, uvicorn's h11 protocol reporting request and response edges, and
  refusing request heads over the size limit however they arrive, or framed by both Content-Length and
  Transfer-Encoding.
- ``head.py``: ``HeadAsGet``, HEAD served wherever GET is (installed with the routes).
- ``graceful.py``: ``HandOverOnExit``, the two-step stop, said at the signal.
- ``probe.py``: the probe-only listener (``probe_port``), so that a full main listener never fails the
  kubelet's probes.
- ``limits.py``: the file limit, raised to its hard limit, and the caps kept below it (``Limits``).
- ``logs.py``: asyncio's and uvicorn's warnings through a per-message rate limit.
- ``telemetry.py``: ``ConnectionTelemetry`` (``trainer_metrics_http_*``).

This module composes them: ``HttpServer`` binds the listeners with their guards and runs uvicorn on them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket

import uvicorn
from starlette.types import ASGIApp

from app.config import Settings
from app.serving.graceful import HandOverOnExit
from app.serving.guard import ConnectionGuard
from app.serving.limits import (
    PROBE_MAX_PER_CLIENT,
    Limits,
    ServerStartError,
    raise_file_limit,
)
from app.serving.listeners import bind_listener
from app.serving.logs import bounded_loop_errors, bounded_uvicorn_log
from app.serving.probe import ProbeListener
from app.serving.protocol import MAX_HEAD_BYTES, protocol_for
from app.serving.telemetry import ConnectionTelemetry
from app.serving.tls import CertificateReloader, uvicorn_tls_kwargs

log = logging.getLogger(__name__)


class _Server(HandOverOnExit, uvicorn.Server):
    """uvicorn's server, closing the probe listener only after its own shutdown (lifespan included), so
    that probes are answered until the very end. The first SIGTERM hands over while /metrics is still
    served (app/serving/graceful.py), then shuts down."""

    probe: ProbeListener | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            if self.probe is not None:
                await self.probe.close()


class HttpServer:
    """The main listener (every route) and the probe listener, with their guards.

    Construct it before the event loop starts: binding happens here, so a port in use or a bad host
    fails at once with ServerStartError. Then ``asyncio.run(server.serve())``.
    """

    def __init__(self, app: ASGIApp, settings: Settings, tls: CertificateReloader | None = None) -> None:
        self.limits = Limits.compute(settings, raise_file_limit())
        self.main_guard = ConnectionGuard(
            "main",
            max_connections=self.limits.max_connections,
            max_per_client=self.limits.max_per_client,
            header_timeout=settings.http_header_timeout_seconds,
        )
        self.guards = [self.main_guard]
        self.main_socket = bind_listener(settings.host, settings.port, self.main_guard, "port")
        self.probe_listener: ProbeListener | None = None
        if settings.probe_port is not None:
            probe_guard = ConnectionGuard(
                "probe",
                max_connections=self.limits.probe_max_connections,
                max_per_client=PROBE_MAX_PER_CLIENT,
                header_timeout=settings.http_header_timeout_seconds,
            )
            self.guards.append(probe_guard)
            try:
                probe_socket = bind_listener(settings.host, settings.probe_port, probe_guard, "probe_port")
            except ServerStartError:
                self.main_socket.close()
                raise
            self.probe_listener = ProbeListener(app, probe_socket, settings)
        self.telemetry = ConnectionTelemetry(self.guards)
        self.tls = tls
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=self.port,
            http=protocol_for(self.main_guard),
            ws="none",
            lifespan="on",
            log_config=None,
            access_log=False,
            # No proxy in front of us: X-Forwarded-For must not let a client pick the address that the
            # per-client caps count it under.
            proxy_headers=False,
            timeout_keep_alive=settings.http_keep_alive_timeout_seconds,
            timeout_graceful_shutdown=math.ceil(settings.renew_deadline_seconds),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            **uvicorn_tls_kwargs(tls),
        )
        self.server = _Server(config)
        self.server.probe = self.probe_listener

    @property
    def port(self) -> int:
        return int(self.main_socket.getsockname()[1])

    @property
    def probe_port(self) -> int | None:
        if self.probe_listener is None:
            return None
        return int(self.probe_listener.sock.getsockname()[1])

    @property
    def exit_signal(self) -> int:
        """The first exit signal the server received (0: none)."""
        return self.server.exit_signal

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        with bounded_loop_errors(loop), bounded_uvicorn_log():
            for guard in self.guards:
                guard.start(loop)
            try:
                if self.probe_listener is not None:
                    await self.probe_listener.start()
                scheme = "https" if self.tls is not None else "http"
                log.info(
                    "serving %s on port %d%s",
                    scheme,
                    self.port,
                    f", probes (http) on port {self.probe_port}" if self.probe_port is not None else "",
                    extra={
                        "max_connections": self.limits.max_connections,
                        "max_connections_per_client": self.limits.max_per_client,
                        "file_limit": self.limits.file_limit,
                    },
                )
                await self.server.serve(sockets=[self.main_socket])
            finally:
                for guard in self.guards:
                    guard.stop()
                if self.probe_listener is not None:
                    await self.probe_listener.close()
