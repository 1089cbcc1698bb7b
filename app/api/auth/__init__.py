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

One job per module: ``decision.py`` (what a review answers), ``reviewer.py`` (the two reviews, slots and
deadline), ``cache.py`` (the decision cache), ``budget.py`` (review budgets), ``middleware.py`` (the ASGI
middleware and ``install_auth``), ``telemetry.py`` (``ReviewStats``, ``trainer_metrics_auth_*``). This
package re-exports the names callers import from ``app.api.auth``.

Plug in with ``install_auth(app, settings)`` (a no-op when ``auth_enabled`` is off), or directly with
``app.add_middleware(BearerAuth, reviewer=KubeReviewer(client, cache_seconds))``.
"""

from app.api.auth.budget import (
    DEFAULT_REVIEWS_PER_CLIENT_PER_SECOND,
    DEFAULT_REVIEWS_PER_SECOND,
    MAX_CLIENT_BUCKETS,
    ReviewLimiter,
    TokenBucket,
)
from app.api.auth.cache import DEFAULT_CACHE_ENTRIES, DecisionCache
from app.api.auth.decision import BUSY, STARTING, UNAUTHORIZED, Decision, Reviewer, forbidden
from app.api.auth.middleware import (
    DEFAULT_PROTECTED_PREFIXES,
    MAX_TOKEN_BYTES,
    BearerAuth,
    bearer_token,
    install_auth,
    status_body,
)
from app.api.auth.reviewer import (
    DEFAULT_MAX_CONCURRENT_REVIEWS,
    DEFAULT_REVIEW_TIMEOUT,
    DEFAULT_SLOT_WAIT,
    SUBJECT_ACCESS_REVIEW_PATH,
    TOKEN_REVIEW_PATH,
    KubeReviewer,
    LazyKubeReviewer,
)
from app.api.auth.telemetry import AuthTelemetry, ReviewStats

# The name this function had when auth was one module (tests import it).
_forbidden = forbidden

__all__ = [
    "BUSY",
    "DEFAULT_CACHE_ENTRIES",
    "DEFAULT_MAX_CONCURRENT_REVIEWS",
    "DEFAULT_PROTECTED_PREFIXES",
    "DEFAULT_REVIEWS_PER_CLIENT_PER_SECOND",
    "DEFAULT_REVIEWS_PER_SECOND",
    "DEFAULT_REVIEW_TIMEOUT",
    "DEFAULT_SLOT_WAIT",
    "MAX_CLIENT_BUCKETS",
    "MAX_TOKEN_BYTES",
    "STARTING",
    "SUBJECT_ACCESS_REVIEW_PATH",
    "TOKEN_REVIEW_PATH",
    "UNAUTHORIZED",
    "AuthTelemetry",
    "BearerAuth",
    "Decision",
    "DecisionCache",
    "KubeReviewer",
    "LazyKubeReviewer",
    "ReviewLimiter",
    "ReviewStats",
    "Reviewer",
    "TokenBucket",
    "bearer_token",
    "forbidden",
    "install_auth",
    "status_body",
]
