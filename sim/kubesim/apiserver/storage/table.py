"""Versioned storage under the simulated apiserver: immutable entries, per-kind key-ordered tables, and the
retained event history that watch resumes, Exact lists and continue tokens read (docs/design/k8s-protocol.md
§0-§2).

Stored objects are never mutated once written (a write replaces the entry), so their serialized bytes are
made once and shared by LIST pages and every watcher.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any, Literal

import orjson

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.status import expired

Key = tuple[str, str]  # (namespace or "", name): the etcd key order
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Obj = dict[str, Any]


class Entry:
    """One stored object version. ``obj`` is never mutated after creation; ``raw`` is its JSON, made once."""

    __slots__ = ("_raw", "key", "obj", "rv")

    def __init__(self, key: Key, obj: Obj, rv: int) -> None:
        self.key = key
        self.obj = obj
        self.rv = rv
        self._raw: bytes | None = None

    @property
    def raw(self) -> bytes:
        raw = self._raw
        if raw is None:
            raw = self._raw = orjson.dumps(self.obj)
        return raw

    def prime(self, raw: bytes) -> None:
        """Set the serialization made while committing (so a write that cannot serialize is refused)."""
        self._raw = raw

    def copy(self) -> Obj:
        # A JSON round trip is faster than copy.deepcopy and primes the shared serialization.
        result: Obj = orjson.loads(self.raw)
        return result

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.obj["metadata"].get("labels") or {}
        return labels


class WatchEvent:
    """A committed change. ``line`` (the NDJSON watch line) is serialized once and shared by every watcher."""

    __slots__ = ("_line", "entry", "prev", "resource", "rv", "type")

    def __init__(self, type_: EventType, resource: ResourceKind, entry: Entry, prev: Entry | None) -> None:
        self.type = type_
        self.resource = resource
        self.entry = entry
        self.prev = prev
        self.rv = entry.rv
        self._line: bytes | None = None

    @property
    def line(self) -> bytes:
        line = self._line
        if line is None:
            line = self._line = event_line(self.type, self.entry.raw)
        return line


def event_line(type_: str, raw_object: bytes) -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + raw_object + b"}\n"


Entries = list[Entry]
Events = list[WatchEvent]
Predicate = Callable[[Entry], bool]


class Table:
    """Objects of one kind. LIST pages and namespace ranges are bisections over the keys in sorted order.

    New keys are not inserted into the sorted lists at once (a list insert moves half the list: at 100k
    objects that was most of the cost of a create); they wait in ``_new`` and are merged on the next read
    that needs the order (Timsort merges the two sorted runs in linear time). Updates of a key already in
    order replace its row in place; while a merge is pending, only ``index`` is updated and the rows are
    rebuilt from it."""

    __slots__ = ("_keys", "_new", "_rows", "index")

    def __init__(self) -> None:
        self._keys: list[Key] = []
        self._rows: list[Entry] = []
        self._new: dict[Key, None] = {}  # keys in index but not yet in _keys
        self.index: dict[Key, Entry] = {}

    def __len__(self) -> int:
        return len(self.index)

    def put(self, entry: Entry) -> None:
        key = entry.key
        index = self.index
        if key not in index:
            self._new[key] = None
        elif not self._new:
            self._rows[bisect.bisect_left(self._keys, key)] = entry
        index[key] = entry

    def remove(self, key: Key) -> None:
        del self.index[key]
        if key in self._new:
            del self._new[key]
            return
        i = bisect.bisect_left(self._keys, key)
        del self._keys[i]
        if not self._new:
            del self._rows[i]

    def _settle(self) -> None:
        new = self._new
        if not new:
            return
        keys = self._keys
        keys += sorted(new)
        keys.sort()  # two sorted runs: a linear merge
        new.clear()
        index = self.index
        self._rows = [index[k] for k in keys]

    @property
    def keys(self) -> list[Key]:
        self._settle()
        return self._keys

    @property
    def rows(self) -> list[Entry]:
        self._settle()
        return self._rows

    def range(self, namespace: str | None) -> list[Entry]:
        self._settle()
        if namespace is None:
            return self._rows[:]
        keys = self._keys
        lo = bisect.bisect_left(keys, (namespace, ""))
        hi = bisect.bisect_left(keys, (namespace + "\x00", ""), lo)
        return self._rows[lo:hi]

    def count(self, namespace: str | None) -> int:
        if namespace is None:
            return len(self.index)
        self._settle()
        keys = self._keys
        lo = bisect.bisect_left(keys, (namespace, ""))
        return bisect.bisect_left(keys, (namespace + "\x00", ""), lo) - lo


class History:
    """Committed events of every kind, oldest first, bounded by ``window``.

    Every event with rv > ``horizon`` is retained (etcd's uncompacted revisions: Exact lists and continue
    tokens at or after it are answered). A watch resumes only from :attr:`resumable_from`, which can be
    later: an apiserver restart starts a new watch cache at the current revision, while etcd keeps its
    revisions."""

    __slots__ = ("_events", "horizon", "watch_from", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.horizon = 0
        self.watch_from = 0
        self._events: Events = []

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[WatchEvent]:
        return iter(self._events)

    @property
    def resumable_from(self) -> int:
        return max(self.horizon, self.watch_from)

    def append(self, event: WatchEvent) -> None:
        events = self._events
        events.append(event)
        window = self.window
        if len(events) > window:
            # Trim in batches so appends stay amortized O(1).
            excess = len(events) - window
            if excess >= max(1, window // 8) or window == 0:
                self.horizon = events[excess - 1].rv
                del events[:excess]

    def trim(self) -> None:
        """Apply the window now (normally done lazily in batches)."""
        excess = len(self._events) - self.window
        if excess > 0:
            self.horizon = self._events[excess - 1].rv
            del self._events[:excess]

    def since(self, resource: ResourceKind | None, rv: int) -> Events:
        """Events with revision > rv (of one kind, or all); 410 Expired if they are no longer all retained."""
        if rv < self.resumable_from:
            raise expired(f"too old resource version: {rv} ({self.resumable_from})")
        lo = bisect.bisect_right(self._events, rv, key=lambda e: e.rv)
        events = self._events[lo:]
        return events if resource is None else [e for e in events if e.resource == resource]

    def rewind(self, current: Entries, resource: ResourceKind, namespace: str | None, rv: int) -> Entries:
        """``current`` (the rows of one kind and namespace now) as they were at revision ``rv``, by undoing
        the retained events after it; 410 Expired if some are compacted."""
        if rv < self.horizon:
            raise expired("The resourceVersion for the provided list is too old.")
        state = {e.key: e for e in current}
        events = self._events
        i = len(events)
        while i > 0 and events[i - 1].rv > rv:
            i -= 1
            ev = events[i]
            if ev.resource != resource or (namespace is not None and ev.entry.key[0] != namespace):
                continue
            if ev.prev is None:
                state.pop(ev.entry.key, None)
            else:
                state[ev.entry.key] = ev.prev
        return [state[k] for k in sorted(state)]

    def compact(self, rv: int) -> None:
        """Forget every event (etcd compaction at ``rv``, the current revision)."""
        self.horizon = rv
        self._events.clear()

    def restart_watch_cache(self, rv: int) -> None:
        self.watch_from = rv
