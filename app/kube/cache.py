"""The informer's keyed store: watch events and relist diffs applied to it, handlers told what changed.

No I/O and no decoding: projections in, notifications out (docs/design/k8s-protocol.md §2 and §6). What
the server says an event is does not matter, only what the cache held: an ADDED for a known key is an
update, a MODIFIED for an unknown key an add, a new uid under a known key a delete plus an add, and a
DELETED for an unknown key nothing (as in client-go). A relist is diffed against the cache, so handlers
learn exactly what changed while the watch was down, deletions included, with the last state held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from app.kube.informer_telemetry import InformerCounters
from app.kube.logthrottle import KeyedOnce, short

log = logging.getLogger(__name__)


class KubeObject(Protocol):
    """What the informer needs of a cached projection."""

    @property
    def key(self) -> str: ...  # "namespace/name", or "name" when cluster-scoped
    @property
    def uid(self) -> str: ...
    @property
    def resource_version(self) -> str: ...


T = TypeVar("T", bound=KubeObject)
T_contra = TypeVar("T_contra", bound=KubeObject, contravariant=True)


class InformerHandler(Protocol[T_contra]):
    """Synchronous notifications, called on the event loop: keep them cheap. Exceptions are contained.

    Optional: ``on_relist(since: int | None)``, if the handler has it, is called before the notifications
    of a relist diff (after the initial list) with the resourceVersion the informer held before the gap,
    and with None after them; ``on_synced(rv: str)``, if it has it, after the notifications of the initial
    list, with that list's resourceVersion."""

    def on_added(self, obj: T_contra, initial: bool) -> None: ...  # initial: part of the first LIST
    def on_updated(self, old: T_contra, new: T_contra) -> None: ...
    def on_deleted(self, last: T_contra) -> None: ...


ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
OBJECT_EVENTS = frozenset((ADDED, MODIFIED, DELETED))


def same_uid(a: KubeObject, b: KubeObject) -> bool:
    return a.uid == b.uid


def same_version(a: KubeObject, b: KubeObject) -> bool:
    return a.resource_version == b.resource_version


class Cache(Generic[T]):
    """``store`` maps key to projection. ``replace`` swaps in a new dict (read ``store`` afresh after it)."""

    def __init__(
        self,
        handler: InformerHandler[T],
        counters: InformerCounters,
        *,
        name: str,
        same_uid: Callable[[T, T], bool] = same_uid,
        unchanged: Callable[[T, T], bool] = same_version,
    ) -> None:
        """``unchanged(old, new)``: the handler need not hear of ``new`` (by default: the same
        resourceVersion; a projector may also say so of a new version that projects to the same state).
        The cache keeps ``new`` either way."""
        self.store: dict[str, T] = {}
        self._handler = handler
        self._counters = counters
        self._name = name  # for log lines
        self._same_uid = same_uid
        self._unchanged = unchanged
        self._logged = KeyedOnce()

    def apply(self, etype: str, obj: T) -> None:
        """One object event (``etype``: ADDED, MODIFIED or DELETED); the per-event hot path."""
        c = self._counters
        store = self.store
        key = obj.key
        handler = self._handler
        if etype == DELETED:
            c.deleted += 1
            old = store.pop(key, None)
            if old is not None:  # client-go ignores deletes of unknown keys
                self._notify_deleted(obj if self._same_uid(old, obj) else old)
            return
        if etype == MODIFIED:
            c.modified += 1
        else:
            c.added += 1
        old = store.get(key)
        store[key] = obj
        try:
            if old is None:
                handler.on_added(obj, False)
            elif not self._same_uid(old, obj):  # missed delete + create: report both
                self._notify_deleted(old)
                handler.on_added(obj, False)
            elif not self._unchanged(old, obj):
                handler.on_updated(old, obj)
        except Exception:
            self._handler_failed("event", obj)

    def discard(self, key: str) -> bool:
        """A deletion whose object is unusable: the cached last state stands in for it. False if unknown."""
        old = self.store.pop(key, None)
        if old is None:
            return False
        self._notify_deleted(old)
        return True

    def replace(
        self, items: dict[str, T], unusable: set[str], *, initial: bool, since: int, list_rv: str = ""
    ) -> None:
        """Swap in a complete list and tell the handler what changed relative to the cache.

        ``unusable``: keys listed with an unusable object, which keep their last good state rather than
        being reported deleted. ``initial``: the first list (adds say so, no relist bracket; its
        ``list_rv`` is passed to the handler's optional ``on_synced``). ``since``: the resourceVersion held
        before the gap, passed to the handler's optional ``on_relist``.
        """
        old_store = self.store
        # A handler that must tell relist-diff notifications from live ones (e.g. to tag what it finds
        # there with the rv held before the gap) gets told around the diff.
        on_relist = None if initial else getattr(self._handler, "on_relist", None)
        if on_relist is not None:
            on_relist(since)
        try:
            self._diff(old_store, items, unusable, initial)
        finally:
            if on_relist is not None:
                on_relist(None)
        on_synced = getattr(self._handler, "on_synced", None) if initial else None
        if on_synced is not None:
            try:
                on_synced(list_rv)
            except Exception:
                self._counters.skipped["handler_error"] += 1
                log.exception("informer %s: handler on_synced failed (rv %s)", self._name, short(list_rv))

    def _diff(self, old_store: dict[str, T], items: dict[str, T], unusable: set[str], initial: bool) -> None:
        for key in unusable:
            if key not in items and key in old_store:
                items[key] = old_store[key]
        self.store = items
        for key, obj in items.items():
            old = old_store.get(key)
            if old is None:
                self._notify_added(obj, initial)
            elif old is obj:
                continue
            elif not self._same_uid(old, obj):  # deleted and recreated while we were not watching
                self._notify_deleted(old)
                self._notify_added(obj, False)
            elif not self._unchanged(old, obj):
                self._notify_updated(old, obj)
        for key, old in old_store.items():
            if key not in items:
                self._notify_deleted(old)

    # --- notifications, each contained: a handler bug costs one notification, not the informer -----

    def _notify_added(self, obj: T, initial: bool) -> None:
        try:
            self._handler.on_added(obj, initial)
        except Exception:
            self._handler_failed("on_added", obj)

    def _notify_updated(self, old: T, new: T) -> None:
        try:
            self._handler.on_updated(old, new)
        except Exception:
            self._handler_failed("on_updated", new)

    def _notify_deleted(self, last: T) -> None:
        try:
            self._handler.on_deleted(last)
        except Exception:
            self._handler_failed("on_deleted", last)

    def _handler_failed(self, what: str, obj: T) -> None:
        self._counters.skipped["handler_error"] += 1
        if self._logged.first("handler:" + obj.key, obj.resource_version):
            log.exception(
                "informer %s: handler %s failed for %s (rv %s)",
                self._name,
                what,
                short(obj.key),
                short(obj.resource_version),
            )
