"""The store's read side beyond single objects: paged LISTs (continue tokens pinned to the snapshot of
their first page), LISTs at an older revision rebuilt from the watch history, and the history's own
upkeep (events since a revision, compaction, watch-cache restarts). Reads never commit anything.
"""

from __future__ import annotations

import bisect

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.status import too_large_rv
from kubesim.apiserver.storage.paging import (
    INCONSISTENT_RV,
    ListPage,
    continue_expired,
    decode_continue,
    encode_continue,
)
from kubesim.apiserver.storage.store_core import StoreCore
from kubesim.apiserver.storage.table import Entries, Events, Key, Predicate


class StoreReads(StoreCore):
    """LIST pages, snapshots at a revision and the watch history (see
    :class:`kubesim.apiserver.storage.store.Store`)."""

    @property
    def horizon(self) -> int:
        """Oldest resourceVersion a watch can still resume from."""
        return self._history.resumable_from

    @property
    def snapshot_ttl(self) -> float:
        """Seconds a paged LIST can be continued at the revision of its first page."""
        return self._snapshots.ttl

    @snapshot_ttl.setter
    def snapshot_ttl(self, seconds: float) -> None:
        self._snapshots.ttl = seconds

    # -- reads --------------------------------------------------------------------------------
    def list_page(
        self,
        resource: ResourceKind,
        namespace: str | None,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        at_rv: int | None = None,
        predicate: Predicate | None = None,
    ) -> ListPage:
        """One LIST response. ``at_rv``: serve exactly that revision (reconstructed from history if older).
        A continue token pins the page to the snapshot of its first page."""
        resource = self.served(resource)
        if continue_token:
            token_rv, start = decode_continue(resource, namespace, continue_token)
            if token_rv == INCONSISTENT_RV:
                rows, rv = self.entries(resource, namespace), self._rv
            else:
                rows = self._pinned_snapshot(resource, namespace, token_rv, start)
                rv = token_rv
            lo = bisect.bisect_left(rows, start, key=lambda e: e.key)
        else:
            rv = self._rv if at_rv is None else at_rv
            rows = (
                self.entries(resource, namespace)
                if rv == self._rv
                else self.snapshot_at(resource, namespace, rv)
            )
            lo = 0
        if predicate is None and (limit <= 0 or len(rows) - lo <= limit):
            return ListPage(rows[lo:], rv, "", None)
        items: Entries = []
        i = lo
        n = len(rows)
        if predicate is None:
            i = min(n, lo + limit)
            items = rows[lo:i]
        else:
            while i < n and (limit <= 0 or len(items) < limit):
                if predicate(rows[i]):
                    items.append(rows[i])
                i += 1
        if i >= n or limit <= 0:
            return ListPage(items, rv, "", None)
        if not continue_token:
            self._snapshots.remember((resource, namespace, rv), rows)
        last = items[-1].key if items else rows[i - 1].key
        token = encode_continue(resource, namespace, rv, (last[0], last[1] + "\x00"))
        remaining = None if predicate is not None else n - i
        return ListPage(items, rv, token, remaining)

    def snapshot_at(self, resource: ResourceKind, namespace: str | None, rv: int) -> Entries:
        """The objects as they were at revision ``rv``, undoing the retained history (410 if compacted)."""
        resource = self.served(resource)
        if rv > self._rv:
            raise too_large_rv(rv, self._rv)
        current = self.entries(resource, namespace)
        if rv == self._rv:
            return current
        rows = self._history.rewind(current, resource, namespace, rv)
        self.counters["snapshots"] += 1
        return rows

    def _pinned_snapshot(self, resource: ResourceKind, namespace: str | None, rv: int, start: Key) -> Entries:
        rows = self._snapshots.get((resource, namespace, rv))
        if rows is None or rv < self._history.horizon:
            raise continue_expired(resource, namespace, self.entries(resource, namespace), start)
        return rows

    # -- watch history ------------------------------------------------------------------------
    def events_since(self, resource: ResourceKind | None, rv: int) -> Events:
        """Events with revision > rv (of one kind, or all); 410 Expired if they are no longer all retained."""
        return self._history.since(None if resource is None else self.served(resource), rv)

    def restart_watch_cache(self) -> None:
        """An apiserver restart: its new watch cache starts at the current revision, so watches from an
        older one get 410; etcd keeps its revisions, so Exact lists and continue tokens still work."""
        self._history.restart_watch_cache(self._rv)

    def compact(self) -> None:
        """Forget all history and list snapshots (etcd compaction at the current revision)."""
        self._history.compact(self._rv)
        self._snapshots.clear()

    def trim_history(self) -> None:
        """Apply the history window now (normally done lazily in batches)."""
        self._history.trim()
