"""Bearer-token authentication and authorization for /metrics, /debug/* and the API docs (/docs,
/openapi.json), delegated to Kubernetes.

The same contract as controller-runtime's metrics filter (``filters.WithAuthenticationAndAuthorization``):
the caller's token is authenticated by a TokenReview, and the user it names must be allowed ``get`` on the
non-resource URL (the request path) by a SubjectAccessReview. RBAC for Prometheus is then the usual

    ClusterRole: nonResourceURLs ["/metrics"], verbs ["get"]  →  bound to Prometheus' service account

and our own service account needs ``system:auth-delegator`` (create tokenreviews + subjectaccessreviews).

Decisions are cached (bounded LRU keyed by a keyed hash of the token, the verb and the path) so that a
scrape every few seconds costs one dictionary lookup, not two API round trips; denials are cached for a
shorter time so a freshly granted permission takes effect soon; API errors are never cached and answer 503:
when we cannot ask, nobody gets in.

Under attack (every request a fresh random token, so every request a cache miss) the API server must not
pay for it and legitimate scrapers must not wait behind it. So: a cached decision is always served; a miss
first needs a token from two token buckets, one for its client address
(``auth_reviews_per_client_per_second``) and one for everyone (``auth_reviews_per_second``), else it is
answered 503 with ``Retry-After`` at once; it then waits at most ``DEFAULT_SLOT_WAIT`` for one of
``DEFAULT_MAX_CONCURRENT_REVIEWS`` review slots (else 503), and the review itself (TokenReview plus
SubjectAccessReview) has one deadline of ``DEFAULT_REVIEW_TIMEOUT``. A request thus gets its answer, or a
503, within 6 s, and the reviews sent are bounded by the global bucket. ``ReviewStats`` counts what was
sent, served from the cache, refused and timed out (exported as ``trainer_metrics_auth_*``).

Plug in with ``install_auth(app, settings)`` (a no-op when ``auth_enabled`` is off), or directly with
``app.add_middleware(BearerAuth, reviewer=KubeReviewer(client, cache_seconds))``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.deps import running_service
from app.clientaddr import client_key
from app.config import Settings
from app.extra_telemetry import register_collector
from app.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# The API docs are protected with /debug: they describe the debug endpoints, and an open /docs would tell a
# caller without a token what to try.
DEFAULT_PROTECTED_PREFIXES: tuple[str, ...] = ("/metrics", "/debug", "/docs", "/openapi.json")

# A JWT with many claims is a few KiB; anything far larger is not a token worth forwarding to the API server.
MAX_TOKEN_BYTES = 16 * 1024
# At most this many reviews in flight: a flood of random tokens (each a cache miss) must not turn into a
# flood of TokenReviews against the API server. Extra requests wait their turn, for DEFAULT_SLOT_WAIT at most.
DEFAULT_MAX_CONCURRENT_REVIEWS = 16
DEFAULT_SLOT_WAIT = 1.0
DEFAULT_CACHE_ENTRIES = 4096
# For the whole review (both calls). Slot wait plus this stays below Prometheus' default 10 s scrape
# timeout, so a slow API shows as a 503, not as a scrape timeout.
DEFAULT_REVIEW_TIMEOUT = 5.0
DEFAULT_REVIEWS_PER_SECOND = 20.0
DEFAULT_REVIEWS_PER_CLIENT_PER_SECOND = 5.0
# Client addresses whose review budget is remembered; beyond it the least recent are forgotten (they get a
# fresh budget, and the global bucket still bounds them all).
MAX_CLIENT_BUCKETS = 4096
_UNAVAILABLE_RETRY_AFTER = 5
_UNAVAILABLE_LOG_INTERVAL = 10.0


# ---------------------------------------------------------------------------------------------- decision


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one review. ``status`` is the HTTP status to answer: 200 lets the request through."""

    status: int
    reason: str  # Kubernetes Status reason: "", "Unauthorized", "Forbidden", "ServiceUnavailable"
    message: str
    user: str = ""
    retry_after: int | None = None  # seconds, for a 503: the Retry-After header

    @property
    def allowed(self) -> bool:
        return self.status == 200


UNAUTHORIZED = Decision(401, "Unauthorized", "Unauthorized")
STARTING = Decision(
    503, "ServiceUnavailable", "authorization is not available yet: the service is starting", retry_after=1
)
BUSY = Decision(
    503, "ServiceUnavailable", "too many bearer tokens are being reviewed; retry later", retry_after=1
)


def _forbidden(user: str, verb: str, path: str, why: str) -> Decision:
    # The apiserver's wording (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters.forbiddenMessage).
    message = f'forbidden: User "{user}" cannot {verb} path "{path}"'
    if why:
        message += f": {why}"
    return Decision(403, "Forbidden", message, user)


class Reviewer(Protocol):
    async def review(self, token: str, path: str, verb: str = "get", client: str = "") -> Decision: ...


# ---------------------------------------------------------------------------------------------- reviewer


@dataclass(slots=True)
class ReviewStats:
    """Counters for tests and self-telemetry."""

    token_reviews: int = 0  # TokenReviews sent
    access_reviews: int = 0  # SubjectAccessReviews sent
    cache_hits: int = 0
    api_errors: int = 0  # reviews that failed (timeouts included): answered 503
    timeouts: int = 0  # reviews past their deadline
    # Cache misses answered 503 without a review: over the client's or everyone's rate, or no slot in time.
    refused: dict[str, int] = field(default_factory=lambda: {"client_rate": 0, "rate": 0, "slot_wait": 0})


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    __slots__ = ("_last", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self._last = burst, now

    def take(self, now: float) -> float:
        """0 if a token was taken, else the seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class ReviewLimiter:
    """Review budgets: one bucket per client address and one for all; a review needs a token from both."""

    def __init__(
        self,
        per_second: float = DEFAULT_REVIEWS_PER_SECOND,
        per_client_per_second: float = DEFAULT_REVIEWS_PER_CLIENT_PER_SECOND,
        *,
        max_clients: int = MAX_CLIENT_BUCKETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.per_second = per_second
        self.per_client_per_second = per_client_per_second
        # Bursts of one second's worth (at least one review).
        self._all = TokenBucket(per_second, max(1.0, per_second), clock())
        self._clients: OrderedDict[str, TokenBucket] = OrderedDict()
        self._max_clients = max_clients

    def admit(self, client: str) -> tuple[str, float] | None:
        """None: go ahead. Else (reason, seconds to wait): over the client's budget or everyone's."""
        now = self._clock()
        bucket = self._clients.get(client)
        if bucket is None:
            rate = self.per_client_per_second
            bucket = self._clients[client] = TokenBucket(rate, max(1.0, rate), now)
            while len(self._clients) > self._max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(client)
        wait = bucket.take(now)
        if wait:
            return "client_rate", wait
        wait = self._all.take(now)
        if wait:
            bucket.tokens += 1  # not spent: this review is not sent
            return "rate", wait
        return None


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
        slot_wait: float = DEFAULT_SLOT_WAIT,
        limiter: ReviewLimiter | None = None,
        stats: ReviewStats | None = None,
        audiences: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._allow_ttl = max(0.0, cache_seconds)
        # Shorter for denials (controller-runtime: 5 min allow, 30 s deny): a new RoleBinding works soon.
        self._deny_ttl = self._allow_ttl / 6 if deny_cache_seconds is None else max(0.0, deny_cache_seconds)
        self._max_entries = max_entries
        self._timeout = timeout
        self._slot_wait = slot_wait
        self._limiter = limiter  # None: no rate limit (tests); install_auth always sets one
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
        self.stats = stats if stats is not None else ReviewStats()

    def _key(self, token: str, verb: str, path: str) -> _CacheKey:
        digest = hashlib.blake2b(token.encode(), key=self._salt, digest_size=16).digest()
        return (digest, verb, path)

    async def review(self, token: str, path: str, verb: str = "get", client: str = "") -> Decision:
        """The decision for ``token`` on ``verb path``; ``client`` is the caller's address (client_key)."""
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
            # Only a review that will really be sent spends budget; joining one in flight is free.
            over = self._limiter.admit(client) if self._limiter is not None else None
            if over is not None:
                reason, wait = over
                self.stats.refused[reason] += 1
                return Decision(
                    503,
                    "ServiceUnavailable",
                    "too many bearer tokens to review from this client"
                    if reason == "client_rate"
                    else "too many bearer tokens to review; retry later",
                    retry_after=max(1, math.ceil(wait)),
                )
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

    def cache_keys(self) -> list[_CacheKey]:
        """What the cache is keyed by, oldest first: (keyed hash of the token, verb, path), never a token."""
        return list(self._cache)

    async def _review_and_cache(self, key: _CacheKey, token: str, path: str, verb: str) -> Decision:
        try:
            async with asyncio.timeout(self._slot_wait):
                await self._semaphore.acquire()
        except TimeoutError:
            # Reviews are slow and the slots are full: fail fast rather than queue past the deadline.
            self.stats.refused["slot_wait"] += 1
            return BUSY
        try:
            async with asyncio.timeout(self._timeout):
                decision = await self._review(token, path, verb)
        except (TimeoutError, ApiError) as exc:
            # Never cached: the next request asks again, and nobody gets in while we cannot ask.
            self.stats.api_errors += 1
            if isinstance(exc, TimeoutError) or (exc.status == 0 and exc.reason == "Timeout"):
                self.stats.timeouts += 1
                exc = ApiError(0, "Timeout", f"no answer within {self._timeout:g} s")
            return self._unavailable(exc)
        except Exception:  # a malformed answer or a bug must fail closed, not with a 500 stack trace
            self.stats.api_errors += 1
            log.exception("reviewing a bearer token failed")
            return Decision(
                503,
                "ServiceUnavailable",
                "authorization failed; see the exporter's log",
                retry_after=_UNAVAILABLE_RETRY_AFTER,
            )
        finally:
            self._semaphore.release()
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
            503,
            "ServiceUnavailable",
            "cannot verify the bearer token: the Kubernetes API is unavailable",
            retry_after=_UNAVAILABLE_RETRY_AFTER,
        )


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if isinstance(value, dict):
        return value
    # ApiError so that a nonsense answer is treated like an unreachable API: 503, not cached.
    raise ApiError(200, "InvalidResponse", f"{what} is not an object")


class LazyKubeReviewer:
    """A ``KubeReviewer`` on whatever client the running service holds (it is created in the lifespan,
    after the app and its middleware). A new client (service restarted) gets a new, empty cache; the
    statistics and the review budgets carry over."""

    def __init__(
        self,
        get_client: Callable[[], KubeClient | None],
        cache_seconds: float,
        *,
        limiter: ReviewLimiter | None = None,
        **kwargs: Any,
    ) -> None:
        self._get_client = get_client
        self._cache_seconds = cache_seconds
        self._kwargs = kwargs
        self.limiter = limiter
        self.stats = ReviewStats()
        self._client: KubeClient | None = None
        self._reviewer: KubeReviewer | None = None

    @property
    def current(self) -> KubeReviewer | None:
        return self._reviewer

    async def review(self, token: str, path: str, verb: str = "get", client: str = "") -> Decision:
        kube = self._get_client()
        if kube is None:
            return STARTING
        if kube is not self._client or self._reviewer is None:
            self._client = kube
            self._reviewer = KubeReviewer(
                kube, self._cache_seconds, limiter=self.limiter, stats=self.stats, **self._kwargs
            )
        return await self._reviewer.review(token, path, verb, client)


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
    reviewer = LazyKubeReviewer(client, settings.auth_cache_seconds, limiter=limiter)
    app.add_middleware(BearerAuth, reviewer=reviewer)
    register_collector(app, AuthTelemetry(reviewer.stats))
    return reviewer


class AuthTelemetry(Collector):
    """``trainer_metrics_auth_*``: reviews sent, decisions served from the cache, refusals, timeouts."""

    def __init__(self, stats: ReviewStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        sent = CounterMetricFamily(
            "trainer_metrics_auth_reviews_sent",
            "Reviews sent to the Kubernetes API, by kind (token: TokenReview, access: SubjectAccessReview).",
            labels=["kind"],
        )
        sent.add_metric(["token"], s.token_reviews)
        sent.add_metric(["access"], s.access_reviews)
        refused = CounterMetricFamily(
            "trainer_metrics_auth_refused",
            "Uncached bearer tokens answered 503 without a review: over the client's review rate "
            "(client_rate), over the overall one (rate), or no review slot within 1 s (slot_wait).",
            labels=["reason"],
        )
        for reason, n in s.refused.items():
            refused.add_metric([reason], n)
        yield sent
        yield CounterMetricFamily(
            "trainer_metrics_auth_cache_hits", "Requests decided from the cache.", value=s.cache_hits
        )
        yield refused
        yield CounterMetricFamily(
            "trainer_metrics_auth_review_timeouts",
            "Reviews without an answer within their deadline (answered 503).",
            value=s.timeouts,
        )
        yield CounterMetricFamily(
            "trainer_metrics_auth_review_errors",
            "Reviews that failed, timeouts included (answered 503, not cached).",
            value=s.api_errors,
        )
