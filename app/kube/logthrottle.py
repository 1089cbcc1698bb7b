"""Throttled logging for app/kube: whatever a server or the network does, the log stays readable.

A broken or hostile API server can send the same bad object on every relist, thousands of distinct bad
objects, or fail every request for hours; each of these must show up in the log, but not once per
occurrence. Three shapes cover app/kube:

- ``KeyedOnce``: once per (key, version), e.g. a skipped object, logged again only when it changes;
- ``RateLimit``: once per interval and topic, with the number of occurrences not logged since;
- ``FailureLog``: a failure when it starts or changes kind, then once per interval with a repeat count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

MAX_LOGGED_CHARS = 300  # of a key or name in a log line (a hostile one can be megabytes)


def short(text: str) -> str:
    return text if len(text) <= MAX_LOGGED_CHARS else f"{text[:MAX_LOGGED_CHARS]}...({len(text)} chars)"


class KeyedOnce:
    """``first(key, version)`` is True only the first time the pair is seen."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._max_keys = max_keys  # bounded memory under a flood of distinct bad objects

    def first(self, key: str, version: str) -> bool:
        marker = (key, version)
        if marker in self._seen:
            return False
        if len(self._seen) >= self._max_keys:
            self._seen.clear()
        self._seen.add(marker)
        return True


class RateLimit:
    """``allow(topic)``: None to stay quiet, else how many were suppressed since the topic's last line."""

    def __init__(self, interval: float = 30.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def allow(self, topic: str) -> int | None:
        now = self._clock()
        if now - self._last.get(topic, -1e18) < self._interval:
            self._suppressed[topic] = self._suppressed.get(topic, 0) + 1
            return None
        self._last[topic] = now
        return self._suppressed.pop(topic, 0)


class FailureLog:
    """Warns when a failure starts or changes kind, then at most once per interval with a repeat count;
    the repeats in between go to debug. ``success()`` ends the episode (logged once, at info)."""

    def __init__(
        self,
        logger: logging.Logger,
        recovered: str,
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger  # the caller's, so records keep naming the module that failed
        self._recovered = recovered
        self._interval = interval
        self._clock = clock
        self._key: str | None = None
        self._last = 0.0
        self._suppressed = 0

    def failure(self, key: str, message: str, *args: object) -> None:
        now = self._clock()
        if key != self._key or now - self._last >= self._interval:
            suffix = f" ({self._suppressed} similar failures not logged)" if self._suppressed else ""
            self._logger.warning(message + suffix, *args)
            self._key, self._last, self._suppressed = key, now, 0
        else:
            self._suppressed += 1
            self._logger.debug(message, *args)

    def success(self) -> None:
        if self._key is not None:
            self._logger.info(self._recovered)
        self._key, self._suppressed = None, 0
