"""Review budgets: how many uncached tokens may be reviewed, per client address and for everyone.

Under attack every request carries a fresh random token, so every request is a cache miss. The API
server must not pay for that and legitimate scrapers must not wait behind it: a miss needs a token from
its client's bucket and from the global one, else it is answered 503 with ``Retry-After`` at once, so the
reviews sent are bounded by the global rate.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_REVIEWS_PER_SECOND = 20.0
DEFAULT_REVIEWS_PER_CLIENT_PER_SECOND = 5.0
# Client addresses whose review budget is remembered; beyond it the least recent are forgotten (they get a
# fresh budget, and the global bucket still bounds them all).
MAX_CLIENT_BUCKETS = 4096


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
