"""The reviewer: TokenReview then SubjectAccessReview through a ``KubeClient``, bounded in time and count.

The caller's token is authenticated by a TokenReview, and the user it names must be allowed ``verb`` on
the non-resource URL (the request path) by a SubjectAccessReview, as controller-runtime's metrics filter
does. A cached decision is always served; a miss first needs budget (app/api/auth/budget.py), then waits
at most ``DEFAULT_SLOT_WAIT`` for one of ``DEFAULT_MAX_CONCURRENT_REVIEWS`` review slots, and the review
itself (both calls) has one deadline of ``DEFAULT_REVIEW_TIMEOUT``: a request gets its answer, or a 503,
within 6 s. API errors are never cached and answer 503: when we cannot ask, nobody gets in, except an
identity the API allowed on this path recently: while the API cannot be reached (no answer, a timeout, 429
or 5xx), a grant is honoured for ``outage_grace_seconds`` past its cache time (docs/security.md, "When the
API server is down"). Denials are never extended, and each such use is counted (``stats.outage_grace``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.api.auth.budget import ReviewLimiter
from app.api.auth.cache import DEFAULT_CACHE_ENTRIES, CacheKey, DecisionCache
from app.api.auth.decision import BUSY, STARTING, UNAUTHORIZED, Decision, forbidden
from app.api.auth.telemetry import ReviewStats
from app.kube.client import ApiError, KubeClient

# The name these lines had before auth was split into modules: log filters key on it.
log = logging.getLogger("app.api.auth")

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# At most this many reviews in flight: a flood of random tokens (each a cache miss) must not turn into a
# flood of TokenReviews against the API server. Extra requests wait their turn, for DEFAULT_SLOT_WAIT at most.
DEFAULT_MAX_CONCURRENT_REVIEWS = 16
DEFAULT_SLOT_WAIT = 1.0
# For the whole review (both calls). Slot wait plus this stays below Prometheus' default 10 s scrape
# timeout, so a slow API shows as a 503, not as a scrape timeout.
DEFAULT_REVIEW_TIMEOUT = 5.0
_UNAVAILABLE_RETRY_AFTER = 5
_UNAVAILABLE_LOG_INTERVAL = 10.0


class KubeReviewer:
    """TokenReview + SubjectAccessReview through a ``KubeClient``, with a bounded decision cache."""

    def __init__(
        self,
        client: KubeClient,
        cache_seconds: float = 30.0,
        *,
        deny_cache_seconds: float | None = None,
        outage_grace_seconds: float = 0.0,
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
        self._timeout = timeout
        self._slot_wait = slot_wait
        self._limiter = limiter  # None: no rate limit (tests); install_auth always sets one
        self._audiences = list(audiences)
        self._semaphore = asyncio.Semaphore(max_concurrent)
        self._cache = DecisionCache(
            cache_seconds,
            deny_cache_seconds=deny_cache_seconds,
            grace_seconds=outage_grace_seconds,
            max_entries=max_entries,
            clock=clock,
        )
        self._outage_grace = outage_grace_seconds
        self._last_grace_log = -_UNAVAILABLE_LOG_INTERVAL
        # Single flight: concurrent requests with the same token and path (an HA Prometheus pair scraping
        # together) share one review instead of each sending their own.
        self._inflight: dict[CacheKey, asyncio.Task[Decision]] = {}
        self._last_unavailable_log = -_UNAVAILABLE_LOG_INTERVAL
        self.stats = stats if stats is not None else ReviewStats()

    async def review(self, token: str, path: str, verb: str = "get", client: str = "") -> Decision:
        """The decision for ``token`` on ``verb path``; ``client`` is the caller's address (client_key)."""
        key = self._cache.key(token, verb, path)
        cached = self._cache.get(key)
        if cached is not None:
            self.stats.cache_hits += 1
            return cached
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

    def _forget(self, key: CacheKey) -> Callable[[asyncio.Task[Decision]], None]:
        def done(task: asyncio.Task[Decision]) -> None:
            if self._inflight.get(key) is task:
                del self._inflight[key]

        return done

    def clear(self) -> None:
        self._cache.clear()

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def cache_keys(self) -> list[CacheKey]:
        """What the cache is keyed by, oldest first: (keyed hash of the token, verb, path), never a token."""
        return self._cache.keys()

    async def _review_and_cache(self, key: CacheKey, token: str, path: str, verb: str) -> Decision:
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
            if _is_outage(exc) and (granted := self._cache.allowed_during_outage(key)) is not None:
                return self._in_grace(*granted, exc)
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
        self._cache.put(key, decision)
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
        return forbidden(username, verb, path, why)

    def _in_grace(self, decision: Decision, expired_for: float, exc: ApiError) -> Decision:
        self.stats.outage_grace += 1
        now = time.monotonic()
        if now - self._last_grace_log >= _UNAVAILABLE_LOG_INTERVAL:
            self._last_grace_log = now
            log.warning(
                "cannot review bearer tokens (%s): letting identities the API allowed recently through, "
                "each for at most %g s past its cache time (auth_outage_grace_seconds)",
                exc,
                self._outage_grace,
                extra={"user": decision.user, "past_cache_seconds": round(expired_for, 1)},
            )
        return decision

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


def _is_outage(exc: ApiError) -> bool:
    """The API could not be asked (no answer, timeout, overload, server error), as opposed to an answer that
    refuses us (401/403: our own credentials) or a malformed one."""
    return exc.status in {0, 429} or exc.status >= 500


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
