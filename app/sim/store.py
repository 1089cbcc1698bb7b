"""In-memory object store of the simulated cluster: etcd + registry semantics, synchronous.

One global revision counter for every kind (etcd mod-revision, docs/design/k8s-protocol.md §0); reads,
paged LISTs pinned to a revision, and the writes with their registry rules (§3): optimistic concurrency,
status subresource, generation, finalizers, managedFields, no-op writes, create-on-update of Leases (§4).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any, Final

import orjson

from app.kube.resources import LEASES, ResourceKind
from app.sim.apply import apply_config
from app.sim.core import EVENTS, NAME_LABEL, NAMESPACE_FINALIZER, NAMESPACES, SYSTEM_NAMESPACES
from app.sim.managed_fields import SCHEMALESS, record_update
from app.sim.paging import (
    INCONSISTENT_RV,
    ListPage,
    ListSnapshots,
    continue_expired,
    decode_continue,
    encode_continue,
)
from app.sim.patch import MERGING, apply_patch
from app.sim.schema import Node
from app.sim.status import (
    FieldError,
    StoreError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
    precondition_failed,
    resource_not_found,
    too_large_rv,
)
from app.sim.strategy import (
    FROM_BODY,
    ResourceSchema,
    assemble,
    check_namespace,
    create_metadata,
    generated_name,
    now_rfc3339,
    own,
    resource_schemas,
    same_content,
    spec_changed,
    update_metadata,
)
from app.sim.table import Entries, Entry, Events, EventType, History, Key, Obj, Predicate, Table, WatchEvent
from app.sim.validation import KindValidator, WriteOptions, serializable
from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS

DEFAULT_RESOURCES = (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES, LEASES, NAMESPACES, EVENTS)
# What Python callers get when they pass no WriteOptions: no validation, and a missing namespace is created
# (tests, the generator and benchmarks seed the cluster as an administrator would).
TRUSTED: Final = WriteOptions(validate=False, require_namespace=False)

Listener = Callable[[WatchEvent], None]
Objs = list[Obj]  # (an alias: inside Store, ``list`` names the method)

_ABSENT = object()  # a missing status differs from a null one


class Store:
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
        self._schemas = resource_schemas(resources)
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
        self.counters: dict[str, int] = {"writes": 0, "noop_writes": 0, "snapshots": 0}
        if NAMESPACES in self._schemas:
            for name in SYSTEM_NAMESPACES:
                self.create(NAMESPACES, None, {"metadata": {"name": name}}, field_manager="kube-apiserver")

    # -- introspection ------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

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

    @property
    def resources(self) -> list[ResourceKind]:
        return list(self._schemas)

    def schema(self, resource: ResourceKind) -> ResourceSchema:
        return self._kind(resource)[0]

    def has_namespace(self, name: str) -> bool:
        table = self._tables.get(NAMESPACES)
        return table is None or ("", name) in table.index

    def _kind(self, resource: ResourceKind) -> tuple[ResourceSchema, Table]:
        found = self._by_id.get(id(resource))
        if found is not None:
            return found
        try:
            return self._schemas[resource], self._tables[resource]
        except KeyError:
            raise resource_not_found() from None

    def count(self, resource: ResourceKind, namespace: str | None = None) -> int:
        return self._kind(resource)[1].count(namespace)

    # -- reads --------------------------------------------------------------------------------
    def get_entry(self, resource: ResourceKind, namespace: str | None, name: str) -> Entry:
        key = _key(resource, namespace, name)
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

    # -- watch support ------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` synchronously for every committed event; returns the unsubscribe function."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def events_since(self, resource: ResourceKind | None, rv: int) -> Events:
        """Events with revision > rv (of one kind, or all); 410 Expired if they are no longer all retained."""
        return self._history.since(resource, rv)

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

    # -- writes -------------------------------------------------------------------------------
    # Every write takes ``opts``: None (Python callers) writes as given; the HTTP layer and the workload
    # generator pass WriteOptions and get the apiserver's checks (app.sim.validation), dry runs and warnings.
    def create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        field_manager: str = "sim",
        copy: bool = True,
        opts: WriteOptions | None = None,
        operation: str = "Update",
    ) -> Obj:
        """Create ``obj``. Returns a private copy of the stored object, or with ``copy=False`` the stored
        object itself: shared and read-only (for callers that never mutate it, like the generator)."""
        opts = opts or TRUSTED
        schema, table = self._kind(resource)
        body = own(obj)
        validator = schema.validator if opts.validate else None
        if validator is not None:
            validator.check_type_meta(body)
            validator.decode(body, None, opts)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        namespace = check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = generated_name(meta["generateName"])
        if not name:
            raise _name_required(resource, "name or generateName is required")
        if meta.get("resourceVersion"):
            raise StoreError.make(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        if namespace is not None:
            self._check_namespace(namespace, opts)
        if (namespace or "", name) in table.index:
            raise already_exists(resource, name)
        now = now_rfc3339()
        new_meta = create_metadata(schema, namespace, name, meta, now)
        # With a status subresource, a create drops the body's status.
        new_obj = assemble(
            schema,
            body,
            new_meta,
            status=None if schema.status_subresource else FROM_BODY,
            defaults=validator is None,
        )
        if resource == NAMESPACES:
            _namespace_defaults(new_obj)
        if validator is not None:
            validator.validate(new_obj, None)
        node = self._node(schema)
        managed = record_update(
            [],
            manager=field_manager,
            resource=resource,
            node=node,
            old=None,
            new=new_obj,
            subresource=None,
            status_subresource=schema.status_subresource,
            when=now,
        )
        if operation == "Apply":
            managed = [dict(m, operation="Apply") for m in managed]
        new_meta["managedFields"] = managed
        if opts.dry_run:
            serializable(new_obj, resource.kind)
            del new_meta["resourceVersion"]  # never stored: no revision (etcd3 PrepareObjectForStorage)
            return new_obj
        entry = self._commit(resource, "ADDED", new_obj, None, checked=_bounded(validator))
        return entry.copy() if copy else entry.obj

    def update(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str = "sim",
        opts: WriteOptions | None = None,
    ) -> Obj:
        entry, _ = self._update(resource, namespace, own(obj), subresource, field_manager, opts or TRUSTED)
        return entry.copy()

    def update_or_create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str = "sim",
        opts: WriteOptions | None = None,
    ) -> tuple[Obj, bool]:
        """PUT as the HTTP layer needs it: also says whether a Lease was created (201)."""
        entry, created = self._update(
            resource, namespace, own(obj), subresource, field_manager, opts or TRUSTED
        )
        return entry.copy(), created

    def patch(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
        field_manager: str = "sim",
        copy: bool = True,
        opts: WriteOptions | None = None,
    ) -> Obj:
        """Patch; returns the result as :meth:`create` does (``copy=False``: shared and read-only)."""
        opts = opts or TRUSTED
        entry = self.get_entry(resource, namespace, name)
        # A merge patch of status needs no deep copy: merge_patch copies the maps along the patch's paths and
        # never mutates its target, and a status write keeps the rest of the stored object as it is.
        # json_patch works in place, and spec writes are defaulted in place: those work on a copy.
        shared = patch_type in MERGING and subresource == "status"
        patched = apply_patch(entry.obj if shared else entry.copy(), patch, patch_type)
        meta = patched.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        meta = patched["metadata"] = dict(meta)  # may be the stored object's own
        # A resourceVersion inside the patch is a precondition; otherwise the patch applies to what we read.
        if str(meta.get("resourceVersion", "")) != str(entry.rv):
            if meta.get("resourceVersion"):
                raise conflict(resource, name)
            meta["resourceVersion"] = str(entry.rv)
        meta["name"] = name
        result, _ = self._update(resource, namespace, patched, subresource, field_manager, opts, old=entry)
        return result.copy() if copy else result.obj

    def apply(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        config: Obj,
        *,
        field_manager: str,
        subresource: str | None = None,
        opts: WriteOptions | None = None,
    ) -> tuple[Obj, bool]:
        """Server-side apply (app.sim.apply); creates the object when it does not exist. (object, created)"""
        opts = opts or TRUSTED
        schema, table = self._kind(resource)
        config = own(config)
        validator = schema.validator if opts.validate else None
        if validator is not None:
            validator.check_type_meta(config)
        if not config.get("kind") or not config.get("apiVersion"):
            raise bad_request(
                f"Object 'Kind' is missing in '{orjson.dumps(config).decode()}'"
                if not config.get("kind")
                else "Object 'apiVersion' is missing"
            )
        meta = config.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        if validator is not None:
            validator.decode(config, None, opts)
        ns = check_namespace(resource, namespace, dict(meta))
        entry = table.index.get((ns or "", name))
        if entry is None:
            if subresource is not None:
                raise not_found(resource, name)
            created = self.create(
                resource, ns, config, field_manager=field_manager, opts=opts, operation="Apply"
            )
            return created, True
        if (
            meta.get("resourceVersion")
            and meta["resourceVersion"] != entry.obj["metadata"]["resourceVersion"]
        ):
            raise conflict(resource, name)
        merged, managed = apply_config(
            entry.obj,
            config,
            node=self._node(schema),
            manager=field_manager,
            api_version=resource.api_version,
            subresource=subresource,
            force=opts.force,
            when=now_rfc3339(),
        )
        merged["metadata"] = dict(
            merged["metadata"], resourceVersion=entry.obj["metadata"]["resourceVersion"]
        )
        result, _ = self._update(
            resource, ns, merged, subresource, field_manager, opts, old=entry, managed=managed
        )
        return result.copy(), False

    def delete(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        *,
        preconditions: dict[str, Any] | None = None,
        copy: bool = True,
        opts: WriteOptions | None = None,
    ) -> Obj:
        """With finalizers: set deletionTimestamp (MODIFIED), else remove (DELETED). Returns last state
        (``copy=False``: shared and read-only). Deleting a namespace deletes what is in it first."""
        opts = opts or TRUSTED
        entry = self.get_entry(resource, namespace, name)
        meta = entry.obj["metadata"]
        if preconditions:
            uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
            if uid and uid != meta.get("uid"):
                raise precondition_failed(resource, name, "UID", uid, meta["uid"])
            if rv and str(rv) != meta.get("resourceVersion"):
                raise precondition_failed(resource, name, "ResourceVersion", rv, meta["resourceVersion"])
        if resource == NAMESPACES:
            return self._delete_namespace(entry, opts, copy)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return entry.copy() if copy else entry.obj
            new_obj = dict(entry.obj)
            new_meta = dict(meta)
            new_meta["deletionTimestamp"] = now_rfc3339()
            if self._schemas[resource].generation:
                new_meta["deletionGracePeriodSeconds"] = 0
            new_obj["metadata"] = new_meta
            if opts.dry_run:
                return new_obj
            done = self._commit(resource, "MODIFIED", new_obj, entry)
        else:
            if opts.dry_run:
                return entry.copy()
            done = self._remove(resource, entry)
        return done.copy() if copy else done.obj

    def delete_collection(
        self,
        resource: ResourceKind,
        namespace: str | None,
        *,
        predicate: Predicate | None = None,
        opts: WriteOptions | None = None,
    ) -> Objs:
        """DELETE on a collection: every (matching) object, each deleted as by :meth:`delete`."""
        out = []
        for entry in self.entries(resource, namespace):
            if predicate is None or predicate(entry):
                out.append(self.delete(resource, entry.key[0] or None, entry.key[1], opts=opts))
        return out

    # -- namespaces -----------------------------------------------------------------------------------------
    def _check_namespace(self, namespace: str, opts: WriteOptions) -> None:
        table = self._tables.get(NAMESPACES)
        if table is None:
            return
        ns = table.index.get(("", namespace))
        if ns is None:
            if opts.require_namespace:
                raise not_found(NAMESPACES, namespace)
            self.create(NAMESPACES, None, {"metadata": {"name": namespace}}, field_manager="kube-apiserver")
        elif ns.obj["metadata"].get("deletionTimestamp"):
            err = StoreError.make(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being terminated",
                {
                    "name": namespace,
                    "kind": "namespaces",
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {namespace} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )
            raise err

    def _delete_namespace(self, entry: Entry, opts: WriteOptions, copy: bool) -> Obj:
        """The namespace goes Terminating, its content is deleted (the namespace controller's work, done at
        once); it is removed when nothing is left in it (objects held by finalizers keep it)."""
        name = entry.key[1]
        if opts.dry_run:
            return entry.copy()
        current = entry
        if not entry.obj["metadata"].get("deletionTimestamp"):
            obj = dict(entry.obj)
            obj["metadata"] = dict(obj["metadata"], deletionTimestamp=now_rfc3339())
            obj["status"] = dict(obj.get("status") or {}, phase="Terminating")
            current = self._commit(NAMESPACES, "MODIFIED", obj, entry)
        for res in self._schemas:
            if res.namespaced:
                for e in self.entries(res, name):
                    if not e.obj["metadata"].get("deletionTimestamp"):
                        self.delete(res, name, e.key[1])
        return (self._finish_namespace(name) or current).copy() if copy else current.obj

    def _finish_namespace(self, name: str) -> Entry | None:
        """Remove a terminating namespace once it is empty; returns its DELETED entry if it went."""
        table = self._tables.get(NAMESPACES)
        ns = table.index.get(("", name)) if table is not None else None
        if ns is None or not ns.obj["metadata"].get("deletionTimestamp"):
            return None
        if any(self._tables[r].count(name) for r in self._schemas if r.namespaced):
            return None
        return self._remove(NAMESPACES, ns)

    # -- write internals ----------------------------------------------------------------------
    def _node(self, schema: ResourceSchema) -> Node:
        return schema.validator.schema.root if schema.validator is not None else SCHEMALESS

    def _update(  # noqa: PLR0917 - the registry's update path, private
        self,
        resource: ResourceKind,
        namespace: str | None,
        body: Obj,
        subresource: str | None,
        field_manager: str,
        opts: WriteOptions,
        *,
        old: Entry | None = None,
        managed: Objs | None = None,
    ) -> tuple[Entry, bool]:
        schema, table = self._kind(resource)
        if subresource not in (None, "status") or (subresource == "status" and not schema.status_subresource):
            raise resource_not_found()
        validator = schema.validator if opts.validate else None
        if validator is not None:
            validator.check_type_meta(body)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = body["metadata"] = {}
        namespace = check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name:
            raise _name_required(resource, "name is required")
        entry = table.index.get((namespace or "", name))
        rv = str(meta.get("resourceVersion") or "")
        if entry is None:
            if resource == LEASES and subresource is None and not rv:
                meta.pop("resourceVersion", None)
                created = self.create(resource, namespace, body, field_manager=field_manager, opts=opts)
                if opts.dry_run:
                    return Entry((namespace or "", name), created, 0), True
                return self.get_entry(resource, namespace, created["metadata"]["name"]), True
            raise not_found(resource, name)
        if not rv:
            raise invalid(
                resource.kind,
                resource.group,
                name,
                [FieldError("metadata.resourceVersion", "Invalid", "must be specified for an update", "0x0")],
            )
        stored_meta = entry.obj["metadata"]
        if rv != stored_meta["resourceVersion"]:
            raise conflict(resource, name)
        if meta.get("uid") and meta["uid"] != stored_meta["uid"]:
            raise precondition_failed(resource, name, "UID", meta["uid"], stored_meta["uid"])
        if subresource == "status":
            new_obj = dict(entry.obj)
            if "status" in body:
                new_obj["status"] = body["status"]
            else:
                new_obj.pop("status", None)
            if validator is not None:
                validator.decode(new_obj, entry.obj, opts)
        else:
            if validator is not None:
                validator.decode(body, entry.obj if old is not None else None, opts)
            # Writes to the main resource keep the stored status when it has its own subresource.
            keep_status = entry.obj.get("status") if schema.status_subresource else FROM_BODY
            new_obj = assemble(
                schema,
                body,
                update_metadata(stored_meta, meta),
                status=keep_status,
                defaults=validator is None,
            )
        if validator is not None:
            validator.validate(new_obj, entry.obj)
        if subresource == "status":
            # Only the status was replaced (same metadata object, same spec): compare just that.
            same = new_obj.get("status", _ABSENT) == entry.obj.get("status", _ABSENT)
        else:
            same = same_content(new_obj, entry.obj)
        if same and managed is None:
            self.counters["noop_writes"] += 1
            return entry, False
        new_meta = new_obj["metadata"] = dict(new_obj["metadata"])
        if (
            schema.generation
            and subresource != "status"
            and spec_changed(new_obj, entry.obj, schema.status_subresource)
        ):
            new_meta["generation"] = int(stored_meta.get("generation", 1)) + 1
        if managed is None:
            managed = record_update(
                stored_meta.get("managedFields") or [],
                manager=field_manager,
                resource=resource,
                node=self._node(schema),
                old=entry.obj,
                new=new_obj,
                subresource=subresource,
                status_subresource=schema.status_subresource,
                when=now_rfc3339(),
            )
        new_meta["managedFields"] = managed
        if same and managed == stored_meta.get("managedFields"):
            self.counters["noop_writes"] += 1
            return entry, False
        if opts.dry_run:
            serializable(new_obj, resource.kind)
            return Entry(entry.key, new_obj, entry.rv), False
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            # Removing the last finalizer of an object being deleted deletes it.
            return self._remove(resource, Entry(entry.key, new_obj, entry.rv)), False
        return self._commit(resource, "MODIFIED", new_obj, entry, checked=_bounded(validator)), False

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
        self._kind(resource)[1].put(entry)
        self._record(WatchEvent(type_, resource, entry, prev))
        return entry

    def _remove(self, resource: ResourceKind, entry: Entry) -> Entry:
        self._rv += 1
        rv = self._rv
        # DELETED carries the last state with the deletion revision.
        obj = dict(entry.obj)
        obj["metadata"] = dict(obj["metadata"], resourceVersion=str(rv))
        gone = Entry(entry.key, obj, rv)
        self._kind(resource)[1].remove(entry.key)
        self._record(WatchEvent("DELETED", resource, gone, entry))
        if resource.namespaced and entry.key[0] and resource != NAMESPACES:
            self._finish_namespace(entry.key[0])
        return gone

    def _record(self, event: WatchEvent) -> None:
        self.counters["writes"] += 1
        self._history.append(event)
        for listener in tuple(self._listeners):
            listener(event)


def _bounded(validator: KindValidator | None) -> bool:
    return validator is not None and validator.schema.bounded


def _namespace_defaults(obj: Obj) -> None:
    """What the namespace registry sets on create: the name label, the kubernetes finalizer, phase Active."""
    meta = obj["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), NAME_LABEL: meta["name"]}
    spec = obj.setdefault("spec", {})
    spec.setdefault("finalizers", [NAMESPACE_FINALIZER])
    obj["status"] = {"phase": "Active"}


def _key(resource: ResourceKind, namespace: str | None, name: str) -> Key:
    return ((namespace or "") if resource.namespaced else "", name)


def _name_required(resource: ResourceKind, detail: str) -> StoreError:
    return invalid(resource.kind, resource.group, "", [FieldError("metadata.name", "Required", detail)])
