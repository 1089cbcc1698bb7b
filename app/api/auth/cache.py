"""The decision cache: a scrape every few seconds costs one dictionary lookup, not two API round trips.

Bounded LRU keyed by a keyed hash of the token, the verb and the path. Denials are kept for a shorter time
than grants (controller-runtime: 5 min allow, 30 s deny), so a freshly granted permission takes effect
soon. Only decisions are cached; API errors never reach it (the next request asks again).

A grant is remembered ``grace_seconds`` past its time to live, for one use only: while the Kubernetes API
cannot be asked, the reviewer may let that identity through on it (``allowed_during_outage``). A denial
is never kept past its time to live, and a new answer of the API (a denial included) replaces the grant.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from app.api.auth.decision import Decision

DEFAULT_CACHE_ENTRIES = 4096

CacheKey = tuple[bytes, str, str]


@dataclass(slots=True)
class _Cached:
    decision: Decision
    expires: float
    kept_until: float  # expires, or later for a grant: its outage grace


class DecisionCache:
    """Decisions by (keyed hash of the token, verb, path), each until its time to live runs out."""

    def __init__(
        self,
        cache_seconds: float,
        *,
        deny_cache_seconds: float | None = None,
        grace_seconds: float = 0.0,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allow_ttl = max(0.0, cache_seconds)
        self._grace = max(0.0, grace_seconds)
        # Shorter for denials (controller-runtime: 5 min allow, 30 s deny): a new RoleBinding works soon.
        self._deny_ttl = self._allow_ttl / 6 if deny_cache_seconds is None else max(0.0, deny_cache_seconds)
        self._max_entries = max_entries
        self._clock = clock
        # Cache keys hold a keyed hash, never the token: a heap dump must not yield usable credentials.
        self._salt = os.urandom(16)
        self._entries: OrderedDict[CacheKey, _Cached] = OrderedDict()

    def key(self, token: str, verb: str, path: str) -> CacheKey:
        digest = hashlib.blake2b(token.encode(), key=self._salt, digest_size=16).digest()
        return (digest, verb, path)

    def get(self, key: CacheKey) -> Decision | None:
        """The decision still in force for ``key``, if any (an expired one is dropped)."""
        cached = self._entries.get(key)
        if cached is None:
            return None
        now = self._clock()
        if now < cached.expires:
            self._entries.move_to_end(key)
            return cached.decision
        if now >= cached.kept_until:
            del self._entries[key]
        return None

    def allowed_during_outage(self, key: CacheKey) -> tuple[Decision, float] | None:
        """A grant for ``key`` past its time to live and within its grace, with the seconds since it
        expired; None when there is none (never a denial)."""
        cached = self._entries.get(key)
        if cached is None or not cached.decision.allowed:
            return None
        now = self._clock()
        if now >= cached.kept_until:
            del self._entries[key]
            return None
        return cached.decision, max(0.0, now - cached.expires)

    def put(self, key: CacheKey, decision: Decision) -> None:
        ttl = self._allow_ttl if decision.allowed else self._deny_ttl
        if ttl > 0:
            now = self._clock()
            grace = self._grace if decision.allowed else 0.0
            self._entries[key] = _Cached(decision, now + ttl, now + ttl + grace)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.pop(key, None)  # an answer not to keep still replaces what was kept

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[CacheKey]:
        """Oldest first."""
        return list(self._entries)
