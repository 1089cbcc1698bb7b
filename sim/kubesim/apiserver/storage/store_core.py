"""The store's state and its one commit step: the tables of every kind under one global revision counter
(etcd mod-revision, docs/design/k8s-protocol.md §0), the watch history and the listeners. A write commits
revision, table, history and listeners in one synchronous step here (:meth:`StoreCore._commit` and
:meth:`StoreCore._remove`), whichever registry rule (create, update, delete; the other store_* modules)
decided it, so a watcher subscribed between two statements misses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from kubesim.apiserver.core import BUILTIN_RESOURCES, NAMESPACES
from kubesim.apiserver.crds import CrdInfo
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.schema import Node
from kubesim.apiserver.schema.validation import WriteOptions, serializable
from kubesim.apiserver.status import not_found, resource_not_found
from kubesim.apiserver.storage.managed_fields import SCHEMALESS
from kubesim.apiserver.storage.paging import ListSnapshots
from kubesim.apiserver.storage.strategy import ResourceSchema, resource_schemas
from kubesim.apiserver.storage.table import Entries, Entry, EventType, History, Key, Obj, Table, WatchEvent

# What Python callers get when they pass no WriteOptions: no validation, and a missing namespace is created
# (tests, the generator and benchmarks seed the cluster as an administrator would).
TRUSTED: Final = WriteOptions(validate=False, require_namespace=False)

Listener = Callable[[WatchEvent], None]
Objs = list[Obj]  # (an alias: inside Store, ``list`` names the method)


class StoreCore:
    """State, lookups and the commit step; the registry's rules are in the subclasses (see :class:`Store`
    in :mod:`kubesim.apiserver.storage.store`)."""

    def __init__(
        self,
        *,
        history_window: int = 10_000,
        crds: Mapping[tuple[str, str, str], CrdInfo] | None = None,
        resources: Iterable[ResourceKind] | None = None,
        snapshot_ttl: float = 300.0,
        max_snapshots: int = 64,
    ) -> None:
        installed = crds or {}
        if resources is None:
            resources = (*served_kinds(installed), *BUILTIN_RESOURCES)
        self._schemas = resource_schemas(resources, installed)
        self._tables: dict[ResourceKind, Table] = {r: Table() for r in self._schemas}
        self._rv = 0
        # The chaos diagnostics size these two (len, iteration) to tell the simulator's memory from the
        # service's: keep the names.
        self._history = History(history_window)
        self._snapshots = ListSnapshots(ttl=snapshot_ttl, max_size=max_snapshots)
        self._listeners: list[Listener] = []
        # ResourceKind hashes all its fields on every lookup; the kinds in use are long-lived objects, so
        # look them up by identity first (an equal but distinct ResourceKind takes the hashing path).
        self._by_id: dict[int, tuple[ResourceSchema, Table]] = {
            id(r): (schema, self._tables[r]) for r, schema in self._schemas.items()
        }
        # A caller may name a collection with its own resource type (a client's): same coordinates.
        self._by_coordinates: dict[tuple[str, str, str], tuple[ResourceSchema, Table]] = {
            r.coordinates: (schema, self._tables[r]) for r, schema in self._schemas.items()
        }
        self.counters: dict[str, int] = {"writes": 0, "noop_writes": 0, "snapshots": 0}

    # -- introspection ------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def resources(self) -> list[ResourceKind]:
        return list(self._schemas)

    def served(self, resource: ResourceKind) -> ResourceKind:
        """The store's own ResourceKind for ``resource``, which may be a client's type with the same group,
        version and plural: the public methods that compare kinds take this one."""
        return self._kind(resource)[0].resource

    def schema(self, resource: ResourceKind) -> ResourceSchema:
        return self._kind(resource)[0]

    def _node(self, schema: ResourceSchema) -> Node:
        return schema.validator.schema.root if schema.validator is not None else SCHEMALESS

    def has_namespace(self, name: str) -> bool:
        table = self._tables.get(NAMESPACES)
        return table is None or ("", name) in table.index

    def _kind(self, resource: ResourceKind) -> tuple[ResourceSchema, Table]:
        found = self._by_id.get(id(resource))
        if found is not None:
            return found
        try:
            return self._by_coordinates[(resource.group, resource.version, resource.plural)]
        except (KeyError, AttributeError):
            raise resource_not_found() from None

    def count(self, resource: ResourceKind, namespace: str | None = None) -> int:
        return self._kind(resource)[1].count(namespace)

    # -- reads --------------------------------------------------------------------------------
    def get_entry(self, resource: ResourceKind, namespace: str | None, name: str) -> Entry:
        key = object_key(resource, namespace, name)
        entry = self._kind(resource)[1].index.get(key)
        if entry is None:
            raise not_found(resource, name)
        return entry

    def get(self, resource: ResourceKind, namespace: str | None, name: str, *, copy: bool = True) -> Obj:
        """A private copy of the object (``copy=False``: the stored object, shared and read-only)."""
        entry = self.get_entry(resource, namespace, name)
        return entry.copy() if copy else entry.obj

    def entries(self, resource: ResourceKind, namespace: str | None) -> Entries:
        """Current entries in key order (a new list; the entries themselves are immutable)."""
        return self._kind(resource)[1].range(namespace)

    def list(self, resource: ResourceKind, namespace: str | None) -> tuple[list[Obj], int]:
        return [e.copy() for e in self.entries(resource, namespace)], self._rv

    # -- watch support ------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` synchronously for every committed event; returns the unsubscribe function."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # -- the commit step ----------------------------------------------------------------------
    def _commit(
        self, resource: ResourceKind, type_: EventType, obj: Obj, prev: Entry | None, *, checked: bool = False
    ) -> Entry:
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv + 1)
        entry = Entry((meta.get("namespace") or "", meta["name"]), obj, self._rv + 1)
        if not checked:
            # Serialized before anything changes: an object that cannot be serialized (nested past orjson's
            # limit) would break every LIST. ``checked``: a schema bounded its depth, serialize when read.
            entry.prime(serializable(obj, resource.kind))
        self._rv += 1
        schema, table = self._kind(resource)
        table.put(entry)
        self._record(WatchEvent(type_, schema.resource, entry, prev))
        return entry

    def _remove(self, resource: ResourceKind, entry: Entry) -> Entry:
        self._rv += 1
        rv = self._rv
        # DELETED carries the last state with the deletion revision.
        obj = dict(entry.obj)
        obj["metadata"] = dict(obj["metadata"], resourceVersion=str(rv))
        gone = Entry(entry.key, obj, rv)
        schema, table = self._kind(resource)
        table.remove(entry.key)
        self._record(WatchEvent("DELETED", schema.resource, gone, entry))
        if resource.namespaced and entry.key[0] and resource != NAMESPACES:
            self._finish_namespace(entry.key[0])
        return gone

    def _record(self, event: WatchEvent) -> None:
        self.counters["writes"] += 1
        self._history.append(event)
        for listener in tuple(self._listeners):
            listener(event)

    def _finish_namespace(self, name: str) -> Entry | None:
        """Remove a terminating namespace once it is empty; returns its DELETED entry if it went."""
        table = self._tables.get(NAMESPACES)
        ns = table.index.get(("", name)) if table is not None else None
        if ns is None or not ns.obj["metadata"].get("deletionTimestamp"):
            return None
        if any(self._tables[r].count(name) for r in self._schemas if r.namespaced):
            return None
        return self._remove(NAMESPACES, ns)


def object_key(resource: ResourceKind, namespace: str | None, name: str) -> Key:
    return ((namespace or "") if resource.namespaced else "", name)


def served_kinds(crds: Mapping[tuple[str, str, str], CrdInfo]) -> list[ResourceKind]:
    """The collections installed CRDs serve, one per version."""
    return [ResourceKind(i.group, i.version, i.plural, i.kind, i.namespaced) for i in crds.values()]
