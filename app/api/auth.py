"""Bearer-token authentication and authorization for /metrics and /debug/*, delegated to Kubernetes.

The same contract as controller-runtime's metrics filter (``filters.WithAuthenticationAndAuthorization``):
the caller's token is authenticated by a TokenReview, and the user it names must be allowed ``get`` on the
non-resource URL (the request path) by a SubjectAccessReview. RBAC for Prometheus is then the usual

    ClusterRole: nonResourceURLs ["/metrics"], verbs ["get"]  →  bound to Prometheus' service account

and our own service account needs ``system:auth-delegator`` (create tokenreviews + subjectaccessreviews).

Decisions are cached (bounded LRU keyed by a keyed hash of the token, the verb and the path) so that a
scrape every few seconds costs one dictionary lookup, not two API round trips; denials are cached for a
shorter time so a freshly granted permission takes effect soon; API errors are never cached and answer 503:
when we cannot ask, nobody gets in.

Plug in with ``install_auth(app, settings)`` (a no-op when ``auth_enabled`` is off), or directly with
``app.add_middleware(BearerAuth, reviewer=KubeReviewer(client, cache_seconds))``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import Settings
from app.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
DEFAULT_PROTECTED_PREFIXES: tuple[str, ...] = ("/metrics", "/debug")

# A JWT with many claims is a few KiB; anything far larger is not a token worth forwarding to the API server.
MAX_TOKEN_BYTES = 16 * 1024
# At most this many reviews in flight: a flood of random tokens (each a cache miss) must not turn into a
# flood of TokenReviews against the API server. Extra requests wait their turn.
DEFAULT_MAX_CONCURRENT_REVIEWS = 16
DEFAULT_CACHE_ENTRIES = 4096
DEFAULT_REVIEW_TIMEOUT = 5.0  # below Prometheus' default 10 s scrape timeout, so a slow API shows as 503
_UNAVAILABLE_LOG_INTERVAL = 10.0


# ---------------------------------------------------------------------------------------------- decision


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one review. ``status`` is the HTTP status to answer: 200 lets the request through."""

    status: int
    reason: str  # Kubernetes Status reason: "", "Unauthorized", "Forbidden", "ServiceUnavailable"
    message: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


UNAUTHORIZED = Decision(401, "Unauthorized", "Unauthorized")
STARTING = Decision(503, "ServiceUnavailable", "authorization is not available yet: the service is starting")


def _forbidden(user: str, verb: str, path: str, why: str) -> Decision:
    # The apiserver's wording (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters.forbiddenMessage).
    message = f'forbidden: User "{user}" cannot {verb} path "{path}"'
    if why:
        message += f": {why}"
    return Decision(403, "Forbidden", message, user)


class Reviewer(Protocol):
    async def review(self, token: str, path: str, verb: str = "get") -> Decision: ...


# ---------------------------------------------------------------------------------------------- reviewer


@dataclass(slots=True)
class ReviewStats:
    """Counters for tests and self-telemetry."""

    token_reviews: int = 0
    access_reviews: int = 0
    cache_hits: int = 0
    api_errors: int = 0


_CacheKey = tuple[bytes, str, str]


@dataclass(slots=True)
class _Cached:
    decision: Decision
    expires: float


class KubeReviewer:
    """TokenReview + SubjectAccessReview through a ``KubeClient``, with a bounded decision cache."""

    def __init__(
        self,
        client: KubeClient,
        cache_seconds: float = 30.0,
        *,
        deny_cache_seconds: float | None = None,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        timeout: float = DEFAULT_REVIEW_TIMEOUT,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT_REVIEWS,
        audiences: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._allow_ttl = max(0.0, cache_seconds)
        # Shorter for denials (controller-runtime: 5 min allow, 30 s deny): a new RoleBinding works soon.
        self._deny_ttl = self._allow_ttl / 6 if deny_cache_seconds is None else max(0.0, deny_cache_seconds)
        self._max_entries = max_entries
        self._timeout = timeout
        self._audiences = list(audiences)
        self._clock = clock
        self._semaphore = asyncio.Semaphore(max_concurrent)
        # Cache keys hold a keyed hash, never the token: a heap dump must not yield usable credentials.
        self._salt = os.urandom(16)
        self._cache: OrderedDict[_CacheKey, _Cached] = OrderedDict()
        # Single flight: concurrent requests with the same token and path (an HA Prometheus pair scraping
        # together) share one review instead of each sending their own.
        self._inflight: dict[_CacheKey, asyncio.Task[Decision]] = {}
        self._last_unavailable_log = -_UNAVAILABLE_LOG_INTERVAL
        self.stats = ReviewStats()

    def _key(self, token: str, verb: str, path: str) -> _CacheKey:
        digest = hashlib.blake2b(token.encode(), key=self._salt, digest_size=16).digest()
        return (digest, verb, path)

    async def review(self, token: str, path: str, verb: str = "get") -> Decision:
        key = self._key(token, verb, path)
        cached = self._cache.get(key)
        if cached is not None:
            if self._clock() < cached.expires:
                self._cache.move_to_end(key)
                self.stats.cache_hits += 1
                return cached.decision
            del self._cache[key]
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._review_and_cache(key, token, path, verb))
            self._inflight[key] = task
            task.add_done_callback(self._forget(key))
        # shield: a scraper that disconnects must not cancel the review others are waiting for.
        return await asyncio.shield(task)

    def _forget(self, key: _CacheKey) -> Callable[[asyncio.Task[Decision]], None]:
        def done(task: asyncio.Task[Decision]) -> None:
            if self._inflight.get(key) is task:
                del self._inflight[key]

        return done

    def clear(self) -> None:
        self._cache.clear()

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    async def _review_and_cache(self, key: _CacheKey, token: str, path: str, verb: str) -> Decision:
        try:
            async with self._semaphore:
                decision = await self._review(token, path, verb)
        except ApiError as exc:
            # Never cached: the next request asks again, and nobody gets in while we cannot ask.
            self.stats.api_errors += 1
            return self._unavailable(exc)
        except Exception:  # a malformed answer or a bug must fail closed, not with a 500 stack trace
            self.stats.api_errors += 1
            log.exception("reviewing a bearer token failed")
            return Decision(503, "ServiceUnavailable", "authorization failed; see the exporter's log")
        ttl = self._allow_ttl if decision.allowed else self._deny_ttl
        if ttl > 0:
            self._cache[key] = _Cached(decision, self._clock() + ttl)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return decision

    async def _review(self, token: str, path: str, verb: str) -> Decision:
        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        self.stats.token_reviews += 1
        answer = await self._client.request_json(
            "POST",
            TOKEN_REVIEW_PATH,
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
            timeout=self._timeout,
        )
        status = _object(_object(answer, "TokenReview").get("status"), "TokenReview status")
        if status.get("authenticated") is not True:
            # The reason (expired, wrong audience...) is for our log only; clients just learn "Unauthorized".
            log.debug("bearer token not authenticated: %s", status.get("error") or "unknown token")
            return UNAUTHORIZED
        user = _object(status.get("user"), "TokenReview status.user")
        username = str(user.get("username") or "")
        groups = [str(g) for g in user.get("groups") or []]
        sar_spec: dict[str, Any] = {"nonResourceAttributes": {"path": path, "verb": verb}}
        if username:
            sar_spec["user"] = username
        if groups:
            sar_spec["groups"] = groups
        if user.get("uid"):
            sar_spec["uid"] = str(user["uid"])
        if isinstance(user.get("extra"), dict) and user["extra"]:
            sar_spec["extra"] = user["extra"]
        self.stats.access_reviews += 1
        answer = await self._client.request_json(
            "POST",
            SUBJECT_ACCESS_REVIEW_PATH,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": sar_spec,
            },
            timeout=self._timeout,
        )
        sar_status = _object(
            _object(answer, "SubjectAccessReview").get("status"), "SubjectAccessReview status"
        )
        if sar_status.get("allowed") is True and sar_status.get("denied") is not True:
            return Decision(200, "", "", username)
        why = str(sar_status.get("reason") or sar_status.get("evaluationError") or "")
        log.debug("user %r denied %s %s: %s", username, verb, path, why)
        return _forbidden(username, verb, path, why)

    def _unavailable(self, exc: ApiError) -> Decision:
        now = time.monotonic()
        if now - self._last_unavailable_log >= _UNAVAILABLE_LOG_INTERVAL:
            self._last_unavailable_log = now
            if exc.status in (401, 403):
                hint = " (does the exporter's service account have system:auth-delegator?)"
            else:
                hint = ""
            log.warning("cannot review bearer tokens, answering 503: %s%s", exc, hint)
        return Decision(
            503, "ServiceUnavailable", "cannot verify the bearer token: the Kubernetes API is unavailable"
        )


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if isinstance(value, dict):
        return value
    # ApiError so that a nonsense answer is treated like an unreachable API: 503, not cached.
    raise ApiError(200, "InvalidResponse", f"{what} is not an object")


class LazyKubeReviewer:
    """A ``KubeReviewer`` on whatever client the running service holds (it is created in the lifespan,
    after the app and its middleware). A new client (service restarted) gets a new, empty cache."""

    def __init__(
        self, get_client: Callable[[], KubeClient | None], cache_seconds: float, **kwargs: Any
    ) -> None:
        self._get_client = get_client
        self._cache_seconds = cache_seconds
        self._kwargs = kwargs
        self._client: KubeClient | None = None
        self._reviewer: KubeReviewer | None = None

    @property
    def current(self) -> KubeReviewer | None:
        return self._reviewer

    async def review(self, token: str, path: str, verb: str = "get") -> Decision:
        client = self._get_client()
        if client is None:
            return STARTING
        if client is not self._client or self._reviewer is None:
            self._client = client
            self._reviewer = KubeReviewer(client, self._cache_seconds, **self._kwargs)
        return await self._reviewer.review(token, path, verb)


# ---------------------------------------------------------------------------------------------- middleware


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
        verb = str(scope.get("method", "GET")).lower()
        path: str = scope["path"]
        decision = UNAUTHORIZED if token is None else await self.reviewer.review(token, path, verb)
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
        await send({"type": "http.response.start", "status": decision.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _HasState(Protocol):
    @property
    def state(self) -> Any: ...

    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None: ...


def install_auth(app: _HasState, settings: Settings) -> LazyKubeReviewer | None:
    """Protect /metrics and /debug/* when ``settings.auth_enabled``; returns the reviewer (None when off).

    Reviews go through the running service's ``KubeClient`` (``app.state.service.client``); until the
    service has started, protected paths answer 503.
    """
    if not settings.auth_enabled:
        return None

    def client() -> KubeClient | None:
        service = getattr(app.state, "service", None)
        found = getattr(service, "client", None)
        return found if isinstance(found, KubeClient) else None

    reviewer = LazyKubeReviewer(client, settings.auth_cache_seconds)
    app.add_middleware(BearerAuth, reviewer=reviewer)
    return reviewer
