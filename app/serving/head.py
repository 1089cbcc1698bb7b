"""``HEAD`` served as ``GET`` on every route (RFC 9110 §9.3.2: a server that serves GET should serve HEAD).

FastAPI registers GET routes for GET alone, so a ``curl -I`` or a load balancer's ``HEAD`` check got 405.
The route runs as for GET; the server (uvicorn) sends the response's headers, Content-Length included,
without its body, because the scope it keeps still says ``HEAD``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HeadAsGet:
    """Pure ASGI middleware: a ``HEAD`` request reaches the application as a ``GET``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: the server's own scope keeps HEAD
        await self.app(scope, receive, send)
