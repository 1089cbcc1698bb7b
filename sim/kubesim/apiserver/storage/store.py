"""In-memory object store of the simulated cluster: etcd + registry semantics, synchronous.

One global revision counter for every kind (etcd mod-revision, docs/design/k8s-protocol.md §0); reads,
paged LISTs pinned to a revision, and the writes with their registry rules (§3): optimistic concurrency,
status subresource, generation, finalizers, managedFields, no-op writes, create-on-update of Leases (§4).

:class:`Store` is assembled from one module per concern, all sharing the state and the single commit step of
:mod:`kubesim.apiserver.storage.store_core`: :mod:`kubesim.apiserver.storage.store_reads` (LIST pages,
snapshots, watch history), :mod:`kubesim.apiserver.storage.store_create`,
:mod:`kubesim.apiserver.storage.store_update` and :mod:`kubesim.apiserver.storage.store_delete` (the
registry's write rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kubesim.apiserver.core import NAMESPACES, SYSTEM_NAMESPACES
from kubesim.apiserver.crds import CrdInfo
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.storage.store_delete import StoreDeletes
from kubesim.apiserver.storage.store_reads import StoreReads
from kubesim.apiserver.storage.store_update import StoreUpdates


class Store(StoreDeletes, StoreUpdates, StoreReads):
    """The registry over one revision counter. Writes are synchronous and commit in one step (revision,
    table, history, listeners), so a watcher subscribed between two statements misses nothing."""

    def __init__(
        self,
        *,
        history_window: int = 10_000,
        crds: Mapping[tuple[str, str, str], CrdInfo] | None = None,
        resources: Iterable[ResourceKind] | None = None,
        snapshot_ttl: float = 300.0,
        max_snapshots: int = 64,
    ) -> None:
        """``crds``: the CustomResourceDefinitions installed (none: built-in kinds only); ``resources``: the
        collections served (default: the CRDs' and the built-in kinds)."""
        super().__init__(
            history_window=history_window,
            crds=crds,
            resources=resources,
            snapshot_ttl=snapshot_ttl,
            max_snapshots=max_snapshots,
        )
        if NAMESPACES in self._schemas:
            for name in SYSTEM_NAMESPACES:
                self.create(NAMESPACES, None, {"metadata": {"name": name}}, field_manager="kube-apiserver")
