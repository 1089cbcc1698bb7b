"""What a review answers: ``Decision``, the fixed answers, and the ``Reviewer`` protocol.

The one vocabulary shared by the reviewer (which makes decisions), the cache (which keeps them) and the
middleware (which turns them into HTTP answers), so that none of them depends on another for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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


def forbidden(user: str, verb: str, path: str, why: str) -> Decision:
    # The apiserver's wording (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters.forbiddenMessage).
    message = f'forbidden: User "{user}" cannot {verb} path "{path}"'
    if why:
        message += f": {why}"
    return Decision(403, "Forbidden", message, user)


class Reviewer(Protocol):
    async def review(self, token: str, path: str, verb: str = "get", client: str = "") -> Decision: ...
