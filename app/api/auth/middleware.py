"""The ASGI middleware that asks for a bearer token on protected paths, and how it is installed.

Everything that is not protected (probes, ``/``) passes untouched at the cost of one prefix check; a
protected request without a usable ``Authorization: Bearer`` header is answered 401 without a review; the
rest are answered by the reviewer's decision, as the apiserver would (a metav1.Status body).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.auth.budget import ReviewLimiter
from app.api.auth.decision import UNAUTHORIZED, Decision, Reviewer
from app.api.auth.reviewer import LazyKubeReviewer
from app.api.auth.telemetry import AuthTelemetry
from app.api.deps import running_service
from app.config import Settings
from app.kube.client import KubeClient
from app.replica.extra_telemetry import register_collector
from app.serving.clientaddr import client_key

# The API docs are protected with /debug: they describe the debug endpoints, and an open /docs would tell a
# caller without a token what to try.
DEFAULT_PROTECTED_PREFIXES: tuple[str, ...] = ("/metrics", "/debug", "/docs", "/openapi.json")

# A JWT with many claims is a few KiB; anything far larger is not a token worth forwarding to the API server.
MAX_TOKEN_BYTES = 16 * 1024


def bearer_token(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The token of the first ``Authorization: Bearer <token>`` header, as the apiserver parses it."""
    for name, value in headers:
        if name != b"authorization":  # ASGI servers lower-case header names
            continue
        scheme, _, token = value.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        token = token.strip()
        if not token or len(token) > MAX_TOKEN_BYTES:
            return None
        try:
            return token.decode("ascii")  # tokens are base64url / JWT: anything else is not one
        except UnicodeDecodeError:
            return None
    return None


def status_body(decision: Decision) -> bytes:
    """A metav1.Status, as the apiserver answers 401/403."""
    return orjson.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": decision.message,
            "reason": decision.reason,
            "code": decision.status,
        }
    )


@dataclass(slots=True)
class _Prefixes:
    prefixes: tuple[str, ...] = field(default_factory=tuple)

    def match(self, path: str) -> bool:
        if "//" in path:
            # Not a route we serve, but judge it as its normalized form so no spelling slips past us.
            path = "/" + "/".join(p for p in path.split("/") if p)
        return any(path == p or path.startswith(p + "/") for p in self.prefixes)


class BearerAuth:
    """Pure ASGI middleware: requests under ``protected_prefixes`` need a token the reviewer allows.

    Everything else (probes, ``/``, the API docs) passes untouched and costs one prefix check.
    """

    def __init__(
        self,
        app: ASGIApp,
        reviewer: Reviewer,
        protected_prefixes: Sequence[str] = DEFAULT_PROTECTED_PREFIXES,
    ) -> None:
        self.app = app
        self.reviewer = reviewer
        self._protected = _Prefixes(tuple(p.rstrip("/") for p in protected_prefixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self._protected.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope["headers"])
        method = str(scope.get("method", "GET")).lower()
        # HEAD reads what GET reads, less the body: authorized as "get" (as the apiserver does for resources),
        # which the RBAC granting a scraper "get" on the path covers.
        verb = "get" if method == "head" else method
        path: str = scope["path"]
        if token is None:
            decision = UNAUTHORIZED
        else:
            decision = await self.reviewer.review(token, path, verb, client_key(scope.get("client")))
        if decision.allowed:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation; no routes use it
            return
        body = status_body(decision)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        if decision.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="trainer-metrics"'))  # RFC 6750 §3
        if decision.retry_after is not None:
            headers.append((b"retry-after", str(decision.retry_after).encode()))
        await send({"type": "http.response.start", "status": decision.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def install_auth(app: Starlette, settings: Settings) -> LazyKubeReviewer | None:
    """Protect /metrics and /debug/* when ``settings.auth_enabled``; returns the reviewer (None when off).

    Reviews go through the running service's ``KubeClient`` (app/api/deps.py); until the service has
    started, protected paths answer 503.
    """
    if not settings.auth_enabled:
        return None

    def client() -> KubeClient | None:
        service = running_service(app)
        return service.client if service is not None else None

    limiter = ReviewLimiter(settings.auth_reviews_per_second, settings.auth_reviews_per_client_per_second)
    reviewer = LazyKubeReviewer(
        client,
        settings.auth_cache_seconds,
        limiter=limiter,
        outage_grace_seconds=settings.auth_outage_grace_seconds,
    )
    app.add_middleware(BearerAuth, reviewer=reviewer)
    register_collector(app, AuthTelemetry(reviewer.stats))
    return reviewer
