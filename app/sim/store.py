"""In-memory object store of the simulated cluster: etcd + registry semantics, synchronous.

One global revision counter for every kind (etcd mod-revision), a bounded event history for watch resume,
list snapshots pinned to a revision for `continue` tokens. Stored objects are immutable once written (a write
replaces the entry), so their serialized bytes are computed once and shared by LIST pages and every watcher.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson

from app.kube.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    LEASES,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    ResourceKind,
)
from app.sim import crds

Key = tuple[str, str]  # (namespace or "", name): the etcd key order
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Obj = dict[str, Any]

DEFAULT_RESOURCES = (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES, LEASES)

# Metadata a client may set; everything else in metadata is owned by the server.
_USER_METADATA = (
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
)
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet


# ---------------------------------------------------------------------------------------------- Status


def status_body(
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
    *,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A metav1.Status in the exact key order and shape the apiserver writes."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": metadata or {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


class StoreError(Exception):
    """A Kubernetes API error: ``code`` (HTTP status) and ``status`` (the exact Status JSON body)."""

    def __init__(self, code: int, status: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(status.get("message", ""))
        self.code = code
        self.status = status
        self.headers = headers or {}

    @classmethod
    def make(cls, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> StoreError:
        return cls(code, status_body(code, reason, message, details))


def qualified(resource: ResourceKind) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def not_found(resource: ResourceKind, name: str) -> StoreError:
    return StoreError.make(
        404,
        "NotFound",
        f'{qualified(resource)} "{name}" not found',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def already_exists(resource: ResourceKind, name: str) -> StoreError:
    return StoreError.make(
        409,
        "AlreadyExists",
        f'{qualified(resource)} "{name}" already exists',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def conflict(resource: ResourceKind, name: str, why: str | None = None) -> StoreError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return StoreError.make(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource)} "{name}": {why}',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    type: Literal["Invalid", "Required", "Forbidden", "NotSupported"]
    detail: str
    value: str | None = None  # already formatted as Go's %#v would print it

    _REASONS = {
        "Invalid": ("FieldValueInvalid", "Invalid value"),
        "Required": ("FieldValueRequired", "Required value"),
        "Forbidden": ("FieldValueForbidden", "Forbidden"),
        "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
    }

    def message(self) -> str:
        label = self._REASONS[self.type][1]
        if self.value is not None:
            return f"{label}: {self.value}: {self.detail}"
        return f"{label}: {self.detail}"

    def cause(self) -> dict[str, str]:
        return {"reason": self._REASONS[self.type][0], "message": self.message(), "field": self.field}


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> StoreError:
    """422 Invalid; like apimachinery's NewInvalid: one error inline, several in [..]."""
    parts = [f"{e.field}: {e.message()}" for e in errors]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified_kind = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {
        "name": name,
        "group": group,
        "kind": kind,
        "causes": [e.cause() for e in errors],
    }
    if not name:
        del details["name"]
    return StoreError.make(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> StoreError:
    return StoreError.make(400, "BadRequest", message)


def expired(message: str, continue_token: str | None = None) -> StoreError:
    meta = {"continue": continue_token} if continue_token else None
    return StoreError(410, status_body(410, "Expired", message, metadata=meta))


# ---------------------------------------------------------------------------------------------- time


_last_second: list[Any] = [-1, ""]  # (epoch second, its RFC 3339 text): writes come thousands a second


def now_rfc3339() -> str:
    second = int(time.time())
    cached = _last_second
    if cached[0] != second:
        cached[1] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        cached[0] = second
    text: str = cached[1]
    return text


def now_micro() -> str:
    """metav1.MicroTime: always exactly six fractional digits (isoformat() drops them at .000000)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------- entries


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


class _Table:
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


@dataclass(frozen=True, slots=True)
class ResourceSchema:
    resource: ResourceKind
    list_kind: str
    status_subresource: bool
    generation: bool
    defaults: crds.DefaultNode | None
    typed: bool  # built-in kind: list items omit apiVersion/kind


def _schemas(resources: Iterable[ResourceKind]) -> dict[ResourceKind, ResourceSchema]:
    registry = crds.crd_registry()
    out = {}
    for res in resources:
        info = registry.get((res.group, res.version, res.plural))
        if info is not None:
            out[res] = ResourceSchema(
                res, info.list_kind, info.status_subresource, True, info.defaults, False
            )
        else:
            out[res] = ResourceSchema(res, res.list_kind, False, False, None, True)
    return out


@dataclass(slots=True)
class ListPage:
    items: list[Entry]
    resource_version: int
    continue_token: str
    remaining: int | None  # remainingItemCount, only when a limit cut an unfiltered list


@dataclass(slots=True)
class _Snapshot:
    rows: list[Entry]
    created: float


Entries = list[Entry]
Events = list[WatchEvent]
Listener = Callable[[WatchEvent], None]
Predicate = Callable[[Entry], bool]


# ---------------------------------------------------------------------------------------------- store


class Store:
    def __init__(
        self,
        *,
        history_window: int = 10_000,
        resources: Iterable[ResourceKind] = DEFAULT_RESOURCES,
        snapshot_ttl: float = 300.0,
        max_snapshots: int = 64,
    ) -> None:
        self.history_window = history_window
        self.snapshot_ttl = snapshot_ttl
        self.max_snapshots = max_snapshots
        self._schemas = _schemas(resources)
        self._tables: dict[ResourceKind, _Table] = {r: _Table() for r in self._schemas}
        self._rv = 0
        # Every event with rv > _horizon is in _history (etcd's retained revisions: Exact lists and
        # continue tokens at or after it are answered). A watch resumes only from max(_horizon,
        # _watch_from): an apiserver restart starts a new watch cache at the current revision, while etcd
        # keeps its revisions.
        self._horizon = 0
        self._watch_from = 0
        self._history: list[WatchEvent] = []
        self._snapshots: OrderedDict[tuple[ResourceKind, str | None, int], _Snapshot] = OrderedDict()
        self._listeners: list[Listener] = []
        self._validators: dict[ResourceKind, Callable[[Obj], None]] = {LEASES: _validate_lease}
        # ResourceKind hashes all its fields on every lookup; the kinds in use are long-lived objects, so
        # look them up by identity first (an equal but distinct ResourceKind takes the hashing path).
        self._by_id: dict[int, tuple[ResourceSchema, _Table, Callable[[Obj], None] | None]] = {
            id(r): (schema, self._tables[r], self._validators.get(r)) for r, schema in self._schemas.items()
        }
        self._api_versions = {r: r.api_version for r in self._schemas}
        self.counters: dict[str, int] = {"writes": 0, "noop_writes": 0, "snapshots": 0}

    # -- introspection ------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def horizon(self) -> int:
        """Oldest resourceVersion a watch can still resume from."""
        return max(self._horizon, self._watch_from)

    @property
    def resources(self) -> list[ResourceKind]:
        return list(self._schemas)

    def schema(self, resource: ResourceKind) -> ResourceSchema:
        return self._kind(resource)[0]

    def _kind(self, resource: ResourceKind) -> tuple[ResourceSchema, _Table, Callable[[Obj], None] | None]:
        found = self._by_id.get(id(resource))
        if found is not None:
            return found
        try:
            schema = self._schemas[resource]
        except KeyError:
            raise StoreError.make(
                404, "NotFound", "the server could not find the requested resource", {}
            ) from None
        return schema, self._tables[resource], self._validators.get(resource)

    def count(self, resource: ResourceKind, namespace: str | None = None) -> int:
        return self._table(resource).count(namespace)

    def _table(self, resource: ResourceKind) -> _Table:
        return self._kind(resource)[1]

    # -- reads --------------------------------------------------------------------------------
    def get_entry(self, resource: ResourceKind, namespace: str | None, name: str) -> Entry:
        key = self._key(resource, namespace, name)
        entry = self._table(resource).index.get(key)
        if entry is None:
            raise not_found(resource, name)
        return entry

    def get(self, resource: ResourceKind, namespace: str | None, name: str, *, copy: bool = True) -> Obj:
        """A private copy of the object (``copy=False``: the stored object, shared and read-only)."""
        entry = self.get_entry(resource, namespace, name)
        return entry.copy() if copy else entry.obj

    def entries(self, resource: ResourceKind, namespace: str | None) -> Entries:
        """Current entries in key order (a new list; the entries themselves are immutable)."""
        return self._table(resource).range(namespace)

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
            token_rv, start = self._decode_continue(resource, namespace, continue_token)
            if token_rv == -1:  # "inconsistent" token handed out with a 410: continue at the latest state
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
            self._remember_snapshot(resource, namespace, rv, rows)
        last = items[-1].key if items else rows[i - 1].key
        token = self._encode_continue(resource, namespace, rv, (last[0], last[1] + "\x00"))
        remaining = None if predicate is not None else n - i
        return ListPage(items, rv, token, remaining)

    def snapshot_at(self, resource: ResourceKind, namespace: str | None, rv: int) -> Entries:
        """The objects as they were at revision ``rv``, undoing the retained history (410 if compacted)."""
        if rv > self._rv:
            raise too_large_rv(rv, self._rv)
        if rv == self._rv:
            return self.entries(resource, namespace)
        if rv < self._horizon:
            raise expired("The resourceVersion for the provided list is too old.")
        state = {e.key: e for e in self.entries(resource, namespace)}
        i = len(self._history)
        while i > 0 and self._history[i - 1].rv > rv:
            i -= 1
            ev = self._history[i]
            if ev.resource != resource or (namespace is not None and ev.entry.key[0] != namespace):
                continue
            if ev.prev is None:
                state.pop(ev.entry.key, None)
            else:
                state[ev.entry.key] = ev.prev
        self.counters["snapshots"] += 1
        return [state[k] for k in sorted(state)]

    # -- continue tokens ----------------------------------------------------------------------
    def _encode_continue(self, resource: ResourceKind, namespace: str | None, rv: int, start: Key) -> str:
        # Same shape as the apiserver's etcd3 token: the start key relative to the listed prefix.
        rel = start[1] if (namespace is not None or not resource.namespaced) else f"{start[0]}/{start[1]}"
        token = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": rel})
        return base64.urlsafe_b64encode(token).rstrip(b"=").decode()

    def _decode_continue(self, resource: ResourceKind, namespace: str | None, token: str) -> tuple[int, Key]:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            data = orjson.loads(raw)
        except (binascii.Error, ValueError, orjson.JSONDecodeError) as exc:
            raise bad_request(f"invalid continue token: continue key is not valid: {exc}") from None
        if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
            raise bad_request(
                "invalid continue token: continue key is not valid: "
                "incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
            )
        rv, start = data.get("rv"), data.get("start")
        if not isinstance(rv, int) or rv == 0 or rv < -1 or not isinstance(start, str) or not start:
            raise bad_request(
                "invalid continue token: continue key is not valid: invalid start or resourceVersion"
            )
        if namespace is not None or not resource.namespaced:
            key = (namespace or "", start)
        else:
            ns, sep, name = start.partition("/")
            key = (ns, name) if sep else ("", start)
        return rv, key

    def _remember_snapshot(
        self, resource: ResourceKind, namespace: str | None, rv: int, rows: Entries
    ) -> None:
        self._snapshots[(resource, namespace, rv)] = _Snapshot(rows, time.monotonic())
        self._snapshots.move_to_end((resource, namespace, rv))
        while len(self._snapshots) > self.max_snapshots:
            self._snapshots.popitem(last=False)

    def _pinned_snapshot(self, resource: ResourceKind, namespace: str | None, rv: int, start: Key) -> Entries:
        snap = self._snapshots.get((resource, namespace, rv))
        if snap is not None and time.monotonic() - snap.created > self.snapshot_ttl:
            del self._snapshots[(resource, namespace, rv)]
            snap = None
        if snap is None or rv < self._horizon:
            # Like etcd after compaction: offer an inconsistent token that continues at the latest state.
            rows = self.entries(resource, namespace)
            lo = bisect.bisect_left(rows, start, key=lambda e: e.key)
            message = "The provided continue parameter is too old to display a consistent list result. "
            message += "You can start a new list without the continue parameter"
            if lo < len(rows):
                message += (
                    ", or use the continue token in this response to retrieve the remainder of the results. "
                    "Continuing with the provided token results in an inconsistent list - objects that were "
                    "created, modified, or deleted between the time the first chunk was returned and now may "
                    "show up in the list."
                )
                raise expired(message, self._encode_continue(resource, namespace, -1, start))
            raise expired(message + ".")
        return snap.rows

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
        if rv < self.horizon:
            raise expired(f"too old resource version: {rv} ({self.horizon})")
        lo = bisect.bisect_right(self._history, rv, key=lambda e: e.rv)
        events = self._history[lo:]
        return events if resource is None else [e for e in events if e.resource == resource]

    def restart_watch_cache(self) -> None:
        """An apiserver restart: its new watch cache starts at the current revision, so watches from an
        older one get 410; etcd keeps its revisions, so Exact lists and continue tokens still work."""
        self._watch_from = self._rv

    def compact(self) -> None:
        """Forget all history and list snapshots (etcd compaction at the current revision)."""
        self._horizon = self._rv
        self._history.clear()
        self._snapshots.clear()

    # -- writes -------------------------------------------------------------------------------
    def create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        field_manager: str = "sim",
        copy: bool = True,
    ) -> Obj:
        """Create ``obj``. Returns a private copy of the stored object, or with ``copy=False`` the stored
        object itself: shared and read-only (for callers that never mutate it, like the generator)."""
        schema, table, _ = self._kind(resource)
        body = _own(obj)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        namespace = self._check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
        if not name:
            raise invalid(
                resource.kind,
                resource.group,
                "",
                [FieldError("metadata.name", "Required", "name or generateName is required")],
            )
        if meta.get("resourceVersion"):
            raise StoreError.make(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        key = (namespace or "", name)
        if key in table.index:
            raise already_exists(resource, name)
        now = now_rfc3339()
        new_meta: Obj = {"name": name}
        if resource.namespaced:
            new_meta["namespace"] = namespace
        new_meta["uid"] = _uuid4()
        new_meta["resourceVersion"] = ""
        if schema.generation:
            new_meta["generation"] = 1
        new_meta["creationTimestamp"] = now
        for k in _USER_METADATA[1:]:
            if k in meta and k != "namespace":
                new_meta[k] = meta[k]
        new_obj = self._assemble(
            schema, body, new_meta, status=None if schema.status_subresource else _MISSING
        )
        self._validate(schema, new_obj, name)
        new_meta["managedFields"] = [_managed_entry(field_manager, resource, new_obj, None, now)]
        entry = self._commit(resource, "ADDED", new_obj, None)
        return entry.copy() if copy else entry.obj

    def update(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str = "sim",
    ) -> Obj:
        entry, _ = self._update(resource, namespace, _own(obj), subresource, field_manager)
        return entry.copy()

    def update_or_create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str = "sim",
    ) -> tuple[Obj, bool]:
        """PUT as the HTTP layer needs it: also says whether a Lease was created (201)."""
        entry, created = self._update(resource, namespace, _own(obj), subresource, field_manager)
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
    ) -> Obj:
        """Patch; returns the result as :meth:`create` does (``copy=False``: shared and read-only)."""
        entry = self.get_entry(resource, namespace, name)
        # A merge patch of status needs no deep copy: merge_patch copies the maps along the patch's paths and
        # never mutates its target, and a status write keeps the rest of the stored object as it is.
        # json_patch works in place, and spec writes are defaulted in place: those work on a copy.
        shared = patch_type in {"merge", "apply"} and subresource == "status"
        current = entry.obj if shared else entry.copy()
        if patch_type in {"merge", "apply"}:
            if not isinstance(patch, dict):
                raise bad_request(
                    "json: cannot unmarshal array into Go value of type map[string]interface {}"
                )
            patched = merge_patch(current, patch)
        elif patch_type == "json":
            if not isinstance(patch, list):
                raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
            patched = json_patch(current, patch)
        else:
            raise StoreError.make(415, "UnsupportedMediaType", f"unsupported patch type {patch_type!r}")
        if not isinstance(patched, dict):
            raise bad_request("patch did not produce an object")
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
        result, _ = self._update(resource, namespace, patched, subresource, field_manager)
        return result.copy() if copy else result.obj

    def delete(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        *,
        preconditions: dict[str, Any] | None = None,
        copy: bool = True,
    ) -> Obj:
        """With finalizers: set deletionTimestamp (MODIFIED), else remove (DELETED). Returns last state
        (``copy=False``: shared and read-only)."""
        entry = self.get_entry(resource, namespace, name)
        meta = entry.obj["metadata"]
        if preconditions:
            uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
            if uid and uid != meta.get("uid"):
                raise conflict(
                    resource,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}",
                )
            if rv and str(rv) != meta.get("resourceVersion"):
                raise conflict(
                    resource,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {rv}, "
                    f"ResourceVersion in object meta: {meta['resourceVersion']}",
                )
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return entry.copy() if copy else entry.obj
            new_obj = dict(entry.obj)
            new_meta = dict(meta)
            new_meta["deletionTimestamp"] = now_rfc3339()
            if self._schemas[resource].generation:
                new_meta["deletionGracePeriodSeconds"] = 0
            new_obj["metadata"] = new_meta
            done = self._commit(resource, "MODIFIED", new_obj, entry)
        else:
            done = self._remove(resource, entry)
        return done.copy() if copy else done.obj

    # -- write internals ----------------------------------------------------------------------
    def _update(
        self,
        resource: ResourceKind,
        namespace: str | None,
        body: Obj,
        subresource: str | None,
        field_manager: str,
    ) -> tuple[Entry, bool]:
        schema = self.schema(resource)
        if subresource not in (None, "status") or (subresource == "status" and not schema.status_subresource):
            raise StoreError.make(404, "NotFound", "the server could not find the requested resource", {})
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = body["metadata"] = {}
        namespace = self._check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name:
            raise invalid(
                resource.kind,
                resource.group,
                "",
                [FieldError("metadata.name", "Required", "name is required")],
            )
        entry = self._table(resource).index.get((namespace or "", name))
        rv = str(meta.get("resourceVersion") or "")
        if entry is None:
            if resource == LEASES and subresource is None and not rv:
                meta.pop("resourceVersion", None)
                created = self.create(resource, namespace, body, field_manager=field_manager)
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
            raise conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {stored_meta['uid']}",
            )
        if subresource == "status":
            new_obj = dict(entry.obj)
            if "status" in body:
                new_obj["status"] = body["status"]
            else:
                new_obj.pop("status", None)
        else:
            new_meta = {
                k: v for k, v in stored_meta.items() if k not in _USER_METADATA or k in ("name", "namespace")
            }
            for k in _USER_METADATA:
                if k in meta and k not in ("name", "namespace"):
                    new_meta[k] = meta[k]
            keep_status = entry.obj.get("status") if schema.status_subresource else _MISSING
            new_obj = self._assemble(schema, body, new_meta, status=keep_status)
        self._validate(schema, new_obj, name)
        if subresource == "status":
            # Only the status was replaced (same metadata object, same spec): compare just that.
            same = new_obj.get("status", _MISSING) == entry.obj.get("status", _MISSING)
        else:
            same = _same_content(new_obj, entry.obj)
        if same:
            self.counters["noop_writes"] += 1
            return entry, False
        new_meta = new_obj["metadata"] = dict(new_obj["metadata"])
        if (
            schema.generation
            and subresource != "status"
            and _spec_changed(new_obj, entry.obj, schema.status_subresource)
        ):
            new_meta["generation"] = int(stored_meta.get("generation", 1)) + 1
        new_meta["managedFields"] = _merge_managed(
            stored_meta.get("managedFields") or [],
            _managed_entry(field_manager, resource, new_obj, subresource),
        )
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            # Removing the last finalizer of an object being deleted deletes it.
            return self._remove(resource, Entry(entry.key, new_obj, entry.rv)), False
        return self._commit(resource, "MODIFIED", new_obj, entry), False

    def _assemble(self, schema: ResourceSchema, body: Obj, meta: Obj, *, status: Any) -> Obj:
        res = schema.resource
        new_obj: Obj = {"apiVersion": self._api_version(res), "kind": res.kind, "metadata": meta}
        for k, v in body.items():
            if k not in ("apiVersion", "kind", "metadata", "status"):
                new_obj[k] = v
        if status is not _MISSING and status is not None:
            new_obj["status"] = status
        elif status is _MISSING and "status" in body:
            new_obj["status"] = body["status"]
        crds.apply_defaults(schema.defaults, new_obj)
        return new_obj

    def _api_version(self, resource: ResourceKind) -> str:
        api_version = self._api_versions.get(resource)
        return api_version if api_version is not None else resource.api_version

    def _validate(self, schema: ResourceSchema, obj: Obj, name: str) -> None:
        validator = self._kind(schema.resource)[2]
        if validator is not None:
            validator(obj)

    def _check_namespace(self, resource: ResourceKind, namespace: str | None, meta: Obj) -> str | None:
        if not resource.namespaced:
            meta.pop("namespace", None)
            return None
        namespace = namespace or meta.get("namespace")
        if not namespace:
            raise bad_request("the server could not find the requested resource")
        body_ns = meta.get("namespace")
        if body_ns and body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        return namespace

    def _key(self, resource: ResourceKind, namespace: str | None, name: str) -> Key:
        return ((namespace or "") if resource.namespaced else "", name)

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _commit(self, resource: ResourceKind, type_: EventType, obj: Obj, prev: Entry | None) -> Entry:
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        meta = obj["metadata"]
        entry = Entry((meta.get("namespace") or "", meta["name"]), obj, rv)
        self._table(resource).put(entry)
        self._record(WatchEvent(type_, resource, entry, prev))
        return entry

    def _remove(self, resource: ResourceKind, entry: Entry) -> Entry:
        rv = self._next_rv()
        # DELETED carries the last state with the deletion revision.
        obj = dict(entry.obj)
        obj["metadata"] = dict(obj["metadata"], resourceVersion=str(rv))
        gone = Entry(entry.key, obj, rv)
        self._table(resource).remove(entry.key)
        self._record(WatchEvent("DELETED", resource, gone, entry))
        return gone

    def _record(self, event: WatchEvent) -> None:
        self.counters["writes"] += 1
        history = self._history
        history.append(event)
        if len(history) > self.history_window:
            # Trim in batches so appends stay amortized O(1).
            excess = len(history) - self.history_window
            if excess >= max(1, self.history_window // 8) or self.history_window == 0:
                self._horizon = history[excess - 1].rv
                del history[:excess]
        for listener in tuple(self._listeners):
            listener(event)

    def trim_history(self) -> None:
        """Apply the history window now (normally done lazily in batches)."""
        excess = len(self._history) - self.history_window
        if excess > 0:
            self._horizon = self._history[excess - 1].rv
            del self._history[:excess]


def too_large_rv(requested: int, current: int) -> StoreError:
    err = StoreError.make(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
    )
    err.headers["Retry-After"] = "1"
    return err


class _Missing:
    pass


_MISSING: Any = _Missing()


def _uuid4() -> str:
    """str(uuid.uuid4()) at a third of its cost (random bits, version 4, RFC 4122 variant)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


_VARIANT: Final = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _own(obj: Obj) -> Obj:
    """A private deep copy; also rejects what JSON cannot carry."""
    try:
        result: Obj = orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise bad_request(f"object is not valid JSON: {exc}") from None
    if not isinstance(result, dict):
        raise bad_request("the body of the request must be a JSON object")
    return result


def _strip_volatile(obj: Obj) -> Obj:
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return dict(obj, metadata=meta)


def _same_content(a: Obj, b: Obj) -> bool:
    return _strip_volatile(a) == _strip_volatile(b)


def _spec_changed(new: Obj, old: Obj, status_subresource: bool) -> bool:
    skip = ("metadata", "status") if status_subresource else ("metadata",)
    keys = (set(new) | set(old)) - set(skip)
    return any(new.get(k) != old.get(k) for k in keys)


# ---------------------------------------------------------------------------------------------- managedFields


# FieldsV1 sets are built on every write, so the common parts are shared: every leaf is the same empty
# dict, and a map whose values are all scalars (a condition, a jobsStatus entry, a resource list) gets its
# set from a cache keyed by its keys. Stored objects are never mutated, so sharing is safe; callers only
# ever see copies (or, with ``copy=False``, promise not to mutate).
_LEAF: Final[dict[str, Any]] = {}
_SCALAR_MAP_FIELDS: dict[tuple[bool, tuple[str, ...]], dict[str, Any]] = {}
_SCALAR_MAP_CACHE_MAX: Final = 4096


_CONTAINERS: Final = (dict, list)


def _fields_v1(value: Any, depth: int = 0) -> Any:
    """A FieldsV1 set for a JSON value: the shape SSA tracks (maps by f:, named list items by k:)."""
    if isinstance(value, dict):
        for v in value.values():
            if isinstance(v, _CONTAINERS):
                break
        else:  # only scalars below: the set depends on the keys alone
            cache_key = (depth > 0, tuple(value))
            cached = _SCALAR_MAP_FIELDS.get(cache_key)
            if cached is None:
                cached = {".": _LEAF} if depth else {}
                for k in value:
                    cached["f:" + k] = _LEAF
                if len(_SCALAR_MAP_FIELDS) < _SCALAR_MAP_CACHE_MAX:
                    _SCALAR_MAP_FIELDS[cache_key] = cached
            return cached
        out: dict[str, Any] = {".": _LEAF} if depth else {}
        for k, v in value.items():
            out["f:" + k] = _fields_v1(v, depth + 1) if isinstance(v, _CONTAINERS) else _LEAF
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        items: dict[str, Any] = {".": _LEAF}
        for v in value:
            items['k:{"name":' + orjson.dumps(v["name"]).decode() + "}"] = _fields_v1(v, depth + 1)
        return items
    return _LEAF


def _managed_entry(
    manager: str, resource: ResourceKind, obj: Obj, subresource: str | None, when: str | None = None
) -> Obj:
    if subresource == "status":
        fields: Obj = {"f:status": _fields_v1(obj.get("status") or {}, 1)}
    else:
        fields = {}
        meta = obj["metadata"]
        meta_fields = {k: meta[k] for k in ("labels", "annotations", "finalizers") if meta.get(k)}
        if meta_fields:
            fields["f:metadata"] = _fields_v1(meta_fields, 0)
        for k, v in obj.items():
            if k not in ("apiVersion", "kind", "metadata", "status"):
                fields[f"f:{k}"] = _fields_v1(v, 1)
    entry: Obj = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": obj.get("apiVersion") or resource.api_version,
        "time": when or now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def _merge_managed(existing: list[Obj], new: Obj) -> list[Obj]:
    key = (new["manager"], new["operation"], new.get("subresource"))
    out = [m for m in existing if (m.get("manager"), m.get("operation"), m.get("subresource")) != key]
    out.append(new)
    return out


# ---------------------------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise _patch_error(f"missing path segment {part!r}")
            doc = doc[part]
        elif isinstance(doc, list):
            doc = doc[_index(doc, part, allow_end=False)]
        else:
            raise _patch_error(f"cannot traverse into {part!r}")
    return doc


def _index(seq: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(seq)
    if not part.isdigit():
        raise _patch_error(f"invalid array index {part!r}")
    i = int(part)
    if i > len(seq) or (i == len(seq) and not allow_end):
        raise _patch_error(f"array index {i} out of bounds")
    return i


def _patch_error(msg: str) -> StoreError:
    return StoreError.make(
        422, "Invalid", f"the server rejected our request due to an error in our request: {msg}"
    )


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        kind, parts = op["op"], _pointer(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise _patch_error(f"{kind} operation missing value")
        if kind == "test":
            if _walk(doc, parts) != op["value"]:
                raise _patch_error(f"testing value {op['path']} failed")
            continue
        if kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = orjson.loads(orjson.dumps(_walk(doc, src)))
            if kind == "move":
                doc = _remove(doc, src)
            doc = _add(doc, parts, value)
        elif kind == "add":
            doc = _add(doc, parts, op["value"])
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            doc = _add(_remove(doc, parts), parts, op["value"]) if parts else op["value"]
        else:
            raise _patch_error(f"unexpected operation {kind!r}")
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise _patch_error(f"cannot add at {last!r}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return None
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _patch_error(f"missing path segment {last!r}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, allow_end=False)]
    else:
        raise _patch_error(f"cannot remove at {last!r}")
    return doc


# ---------------------------------------------------------------------------------------------- Lease rules

# Go parses MicroTime with the fixed layout below: exactly six fractional digits, "Z" or a numeric offset.
_MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})")


def _micro_time_ok(value: str) -> bool:
    return bool(_MICRO_RE.fullmatch(value))


def _validate_lease(obj: Obj) -> None:
    spec = obj.get("spec") or {}
    name = obj["metadata"].get("name", "")
    if not isinstance(spec, dict):
        raise bad_request('Lease in version "v1" cannot be handled as a Lease: spec must be an object')
    for fld in ("acquireTime", "renewTime"):
        value = spec.get(fld)
        if value is None:
            continue
        if not isinstance(value, str) or not _micro_time_ok(value):
            raise bad_request(
                f'Lease in version "v1" cannot be handled as a Lease: parsing time "{value}" as '
                f'"{_MICRO_LAYOUT}": cannot parse "{value}" as "{_MICRO_LAYOUT}"'
            )
    for fld in ("leaseDurationSeconds", "leaseTransitions"):
        if isinstance(spec.get(fld), float):
            raise bad_request(
                f'Lease in version "v1" cannot be handled as a Lease: json: cannot unmarshal number '
                f"{spec[fld]} into Go struct field LeaseSpec.spec.{fld} of type int32"
            )
    errors = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        errors.append(
            FieldError("spec.leaseDurationSeconds", "Invalid", "must be greater than 0", str(duration))
        )
    transitions = spec.get("leaseTransitions")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        errors.append(
            FieldError(
                "spec.leaseTransitions", "Invalid", "must be greater than or equal to 0", str(transitions)
            )
        )
    if errors:
        raise invalid("Lease", "coordination.k8s.io", name, errors)
