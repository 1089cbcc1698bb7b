"""What Prometheus asked a replica for on ``/metrics``, and what it got."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ASGIApp = Callable[..., Any]


class MetricsRequestRecorder:
    """ASGI wrapper (``wrap(app)``) that records, for each ``/metrics`` request, the request's Accept and
    Accept-Encoding and the response's Content-Type and Content-Encoding."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None
        self.requests: list[dict[str, str]] = []

    def wrap(self, app: ASGIApp) -> MetricsRequestRecorder:
        self.app = app
        return self

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert self.app is not None, "wrap(app) first"
        if scope["type"] != "http" or scope.get("path") != "/metrics":
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        record = {
            "user_agent": headers.get("user-agent", ""),
            "accept": headers.get("accept", ""),
            "accept_encoding": headers.get("accept-encoding", ""),
        }

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
                record["status"] = str(message["status"])
                record["content_type"] = out.get("content-type", "")
                record["content_encoding"] = out.get("content-encoding", "")
                self.requests.append(record)
            await send(message)

        await self.app(scope, receive, recording_send)
