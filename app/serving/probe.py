"""The probe-only listener: /livez, /healthz and /readyz on their own port, plain HTTP, small cap.

A main listener full of attackers' connections must never fail the kubelet's probes, so the probes get a
socket and a guard of their own. It is served by uvicorn's protocol without uvicorn's Server, which would
run the lifespan a second time and fight the main server for the signal handlers.
"""

from __future__ import annotations

import asyncio
import time

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

from app.config import Settings
from app.serving.listeners import GuardedListener
from app.serving.protocol import MAX_HEAD_BYTES, protocol_for

PROBE_PATHS = frozenset({"/livez", "/healthz", "/readyz"})


class ProbeOnly:
    """ASGI app for the probe listener: the probe paths of ``app``; 404 for anything else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # lifespan is off on this listener; websockets are not served
        body = b"not found: this listener serves /livez, /healthz and /readyz only\n"
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class ProbeListener:
    """The probe paths on their own socket, served by uvicorn's protocol without uvicorn's Server (which
    would run the lifespan a second time and fight the main server for the signal handlers)."""

    def __init__(self, app: ASGIApp, sock: GuardedListener, settings: Settings) -> None:
        self.sock = sock
        self.config = uvicorn.Config(
            ProbeOnly(app),
            http=protocol_for(sock.guard),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,
            timeout_keep_alive=settings.http_keep_alive_timeout_seconds,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        self.config.load()
        self.state = ServerState()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        protocol = self.config.http_protocol_class

        def factory() -> asyncio.Protocol:
            return protocol(config=self.config, server_state=self.state, app_state={})  # type: ignore[call-arg]

        self._server = await loop.create_server(factory, sock=self.sock, backlog=128)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        self._server = None
        for connection in list(self.state.connections):
            connection.shutdown()
        # Probes are answered in microseconds; do not wait long for a client that does not read.
        deadline = time.monotonic() + 1.0
        while self.state.connections and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
