"""In-memory object store of the simulated cluster: etcd + registry semantics, synchronous.

One global revision counter for every kind (etcd mod-revision, docs/design/k8s-protocol.md §0); reads,
paged LISTs pinned to a revision, and the writes with their registry rules (§3): optimistic concurrency,
status subresource, generation, finalizers, managedFields, no-op writes, create-on-update of Leases (§4).

:class:`Store` is assembled from one module per concern, all sharing the state and the single commit step
of :mod:`app.sim.store_core`: :mod:`app.sim.store_reads` (LIST pages, snapshots, watch history),
:mod:`app.sim.store_create`, :mod:`app.sim.store_update` and :mod:`app.sim.store_delete` (the registry's
write rules). Callers import :class:`Store` and the names below from here.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.kube.resources import ResourceKind
from app.sim.core import NAMESPACES, SYSTEM_NAMESPACES
from app.sim.store_core import DEFAULT_RESOURCES, TRUSTED, Listener, Objs
from app.sim.store_delete import StoreDeletes
from app.sim.store_reads import StoreReads
from app.sim.store_update import StoreUpdates

__all__ = ["DEFAULT_RESOURCES", "TRUSTED", "Listener", "Objs", "Store"]


class Store(StoreDeletes, StoreUpdates, StoreReads):
    """The registry over one revision counter. Writes are synchronous and commit in one step (revision,
    table, history, listeners), so a watcher subscribed between two statements misses nothing."""

    def __init__(
        self,
        *,
        history_window: int = 10_000,
        resources: Iterable[ResourceKind] = DEFAULT_RESOURCES,
        snapshot_ttl: float = 300.0,
        max_snapshots: int = 64,
    ) -> None:
        super().__init__(
            history_window=history_window,
            resources=resources,
            snapshot_ttl=snapshot_ttl,
            max_snapshots=max_snapshots,
        )
        if NAMESPACES in self._schemas:
            for name in SYSTEM_NAMESPACES:
                self.create(NAMESPACES, None, {"metadata": {"name": name}}, field_manager="kube-apiserver")
