"""Exponential backoff with jitter, shaped like client-go's reflector backoff manager.

client-go: 800 ms initial, factor 2, cap 30 s, jitter 1.0, reset after 2 min without failures. We use full
jitter (a uniform draw in [0, step]) so that many replicas restarting together spread out instead of
hammering the API server in lock-step; the step still doubles, so the mean delay grows the same way.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

# A delay is a uniform draw in [0, JITTER_FACTOR x step] (full jitter): never longer than the step, so never
# longer than the cap.
JITTER_FACTOR = 1.0


class Backoff:
    def __init__(
        self,
        base: float = 0.8,
        cap: float = 30.0,
        *,
        factor: float = 2.0,
        reset_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if base <= 0 or cap < base or factor < 1:
            raise ValueError("backoff needs 0 < base <= cap and factor >= 1")
        self.base = base
        self.cap = cap
        self.factor = factor
        self.reset_after = reset_after
        self._clock = clock
        self._rng = rng
        self._step = base
        self._last_failure: float | None = None

    @property
    def step(self) -> float:
        """Upper bound of the next delay (before jitter)."""
        return self._step

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before the next attempt."""
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure >= self.reset_after:
            # A quiet period means the earlier trouble is over: start small again.
            self._step = self.base
        self._last_failure = now
        step = self._step
        self._step = min(self.cap, step * self.factor)
        return self._rng() * step * JITTER_FACTOR

    def reset(self) -> None:
        self._step = self.base
        self._last_failure = None
