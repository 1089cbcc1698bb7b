"""``metadata.managedFields``: which manager owns which fields, as structured-merge-diff keeps them
(docs/design/k8s-protocol.md §3), so that server-side apply can find conflicts and remove what an applier
stopped applying.

Field sets are FieldsV1 tries, the same JSON the apiserver stores: ``f:<field>`` for a map key,
``k:{"name":"x"}`` for an item of a list-type map, ``v:<json>`` for an item of a set, ``"."`` for the node
itself; a leaf is ``{}``. Atomic lists and atomic maps are leaves. The list and map types come from the kind's
structural schema (:class:`kubesim.apiserver.schema.schema.Node`); ObjectMeta has its own (labels and
annotations are granular maps, finalizers a set, ownerReferences a map keyed by uid).

Update operations (create, PUT, merge/JSON patch): the writer gains the fields it changed, and every
other manager loses them. Apply operations: see :mod:`kubesim.apiserver.storage.apply`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import orjson

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.schema import LEAF, Node
from kubesim.apiserver.storage.table import Obj

Trie = dict[str, Any]

# FieldsV1 sets are built on every write, so the common parts are shared: every leaf is the same empty
# dict, and a map whose values are all scalars (a condition, a jobsStatus entry, a resource list) gets its
# set from a cache keyed by its keys. Stored objects are never mutated, so sharing is safe; callers only
# ever see copies (or, with ``copy=False``, promise not to mutate).
_LEAF: Final[dict[str, Any]] = {}
_SCALAR_MAP_FIELDS: dict[tuple[bool, tuple[str, ...]], dict[str, Any]] = {}
_SCALAR_MAP_CACHE_MAX: Final = 4096
_CONTAINERS: Final = (dict, list)
_TOP_SKIP: Final = frozenset({"apiVersion", "kind", "metadata"})


def _meta_node() -> Node:
    scalar_map = Node(type="object", additional=LEAF)
    owner_refs = Node(
        type="array", items=Node(type="object", properties={}), list_type="map", map_keys=("uid",)
    )
    owner_refs.items.additional_any = True  # type: ignore[union-attr]
    return Node(
        type="object",
        properties={
            "labels": scalar_map,
            "annotations": scalar_map,
            "finalizers": Node(type="array", items=LEAF, list_type="set"),
            "ownerReferences": owner_refs,
        },
    )


META_NODE: Final = _meta_node()
# Without a schema, lists of objects that all have a "name" are treated as maps keyed by name (most
# Kubernetes lists are), every other list as atomic.
SCHEMALESS: Final = Node(type="object", additional_any=True)


def child_node(node: Node, key: str) -> Node:
    if node is SCHEMALESS:
        return SCHEMALESS
    found = node.child(key)
    return found if found is not None else (SCHEMALESS if node.additional_any else LEAF)


def _list_kind(node: Node, value: list[Any]) -> tuple[str, tuple[str, ...]]:
    if node is SCHEMALESS:
        if value and all(isinstance(v, dict) and "name" in v for v in value):
            return "map", ("name",)
        return "atomic", ()
    return node.list_type, node.map_keys


def item_key(keys: tuple[str, ...], item: Obj) -> str:
    """The FieldsV1 key of a list-type map item: k:{"key":value,...} with the keys sorted."""
    return "k:" + orjson.dumps({k: item[k] for k in sorted(keys) if k in item}).decode()


def set_key(item: Any) -> str:
    return "v:" + orjson.dumps(item).decode()


def fields_of(value: Any, node: Node, depth: int = 0) -> Trie:
    """The field set of a value: every field it sets (maps by f:, list-map items by k:, set items by v:)."""
    if isinstance(value, dict):
        if node is not SCHEMALESS and node.map_type == "atomic" and depth:
            return _LEAF
        schemaless_leaves = node is SCHEMALESS or (node.additional is LEAF and node.properties is None)
        if schemaless_leaves or node.properties is not None:
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
        out: Trie = {".": _LEAF} if depth else {}
        for k, v in value.items():
            out["f:" + k] = (
                fields_of(v, child_node(node, k), depth + 1) if isinstance(v, _CONTAINERS) else _LEAF
            )
        return out
    if isinstance(value, list) and value:
        kind, keys = _list_kind(node, value)
        items = node.items if node.items is not None else SCHEMALESS
        if kind == "map":
            out = {".": _LEAF}
            for v in value:
                if isinstance(v, dict):
                    sub = fields_of(v, items, depth + 1)
                    out[item_key(keys, v)] = sub if "." in sub else {".": _LEAF, **sub}
            return out
        if kind == "set":
            return {".": _LEAF, **{set_key(v): _LEAF for v in value}}
    return _LEAF


def object_fields(obj: Obj, node: Node, *, status: bool) -> Trie:
    """The fields of a whole object a write sets: metadata's user fields, the body, status (or only it)."""
    if status:
        return {"f:status": fields_of(obj.get("status") or {}, child_node(node, "status"), 1)}
    fields: Trie = {}
    meta = obj.get("metadata") or {}
    meta_fields = {
        k: meta[k] for k in ("labels", "annotations", "finalizers", "ownerReferences") if meta.get(k)
    }
    if meta_fields:
        fields["f:metadata"] = fields_of(meta_fields, META_NODE, 0)
    for k, v in obj.items():
        if k not in _TOP_SKIP and k != "status":
            fields[f"f:{k}"] = fields_of(v, child_node(node, k), 1)
    return fields


# -- set algebra on tries ---------------------------------------------------------------------------------
def union(a: Trie, b: Trie) -> Trie:
    if not a:
        return b
    if not b:
        return a
    out = dict(a)
    for k, v in b.items():
        out[k] = union(out[k], v) if k in out else v
    return out


def subtract(a: Trie, b: Trie) -> Trie:
    """a minus b: a leaf of b removes the whole subtree of a at the same key."""
    if not a or not b:
        return a
    out: Trie = {}
    for k, v in a.items():
        if k not in b:
            out[k] = v
            continue
        other = b[k]
        if not other or not v:  # b owns the whole thing, or a only had the node itself
            continue
        rest = subtract(v, other)
        if rest and set(rest) != {"."}:
            out[k] = rest
        elif "." in v and "." not in other:
            out[k] = {".": _LEAF}
    return out


def leaves(trie: Trie, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The members of a set as paths (a node's own "." member is its path)."""
    for k, v in trie.items():
        if k == ".":
            yield prefix
        elif v:
            yield from leaves(v, (*prefix, k))
        else:
            yield (*prefix, k)


def contains(trie: Trie, path: tuple[str, ...]) -> bool:
    node = trie
    for i, part in enumerate(path):
        if part not in node:
            return False
        node = node[part]
        if not node and i < len(path) - 1:
            return True  # a leaf above the path owns everything below it
    return True


def path_string(path: tuple[str, ...]) -> str:
    """A field path as the apiserver prints it in conflicts: .spec.x, .spec.list[name="a"].y."""
    out = ""
    for part in path:
        kind, _, rest = part.partition(":")
        if kind == "f":
            out += "." + rest
        elif kind == "k":
            keys = orjson.loads(rest)
            out += "[" + ",".join(f"{k}={orjson.dumps(v).decode()}" for k, v in keys.items()) + "]"
        elif kind == "v":
            out += f"[={rest}]"
        elif kind == "i":
            out += f"[{rest}]"
    return out


def value_at(obj: Any, path: tuple[str, ...]) -> Any:
    """The value a FieldsV1 path names in an object (``_MISSING`` when absent)."""
    value = obj
    for part in path:
        kind, _, rest = part.partition(":")
        if kind == "f" and isinstance(value, dict):
            value = value.get(rest, MISSING)
        elif kind == "k" and isinstance(value, list):
            want = orjson.loads(rest)
            value = next(
                (v for v in value if isinstance(v, dict) and all(v.get(k) == x for k, x in want.items())),
                MISSING,
            )
        elif kind == "v" and isinstance(value, list):
            want = orjson.loads(rest)
            value = want if want in value else MISSING
        else:
            return MISSING
        if value is MISSING:
            return value
    return value


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Final = _Missing()


# -- diffs -----------------------------------------------------------------------------------------------
def changed_fields(old: Any, new: Any, node: Node, depth: int) -> tuple[Trie | None, Trie | None]:
    """(set or changed in ``new``, removed from ``old``) as field sets; None where nothing is."""
    if old is new:
        return None, None
    granular = node is SCHEMALESS or node.map_type != "atomic" or not depth
    if isinstance(old, dict) and isinstance(new, dict) and granular:
        changed: Trie = {}
        removed: Trie = {}
        for k, v in new.items():
            key = "f:" + k
            if k not in old:
                changed[key] = (
                    fields_of(v, child_node(node, k), depth + 1) if isinstance(v, _CONTAINERS) else _LEAF
                )
                continue
            sub_c, sub_r = changed_fields(old[k], v, child_node(node, k), depth + 1)
            if sub_c is not None:
                changed[key] = sub_c
            if sub_r is not None:
                removed[key] = sub_r
        for k in old:
            if k not in new:
                removed["f:" + k] = _LEAF
        return changed or None, removed or None
    if isinstance(old, list) and isinstance(new, list):
        kind, keys = _list_kind(node, new or old)
        items = node.items if node.items is not None else SCHEMALESS
        if kind == "map":
            before = {item_key(keys, v): v for v in old if isinstance(v, dict)}
            after = {item_key(keys, v): v for v in new if isinstance(v, dict)}
            changed, removed = {}, {}
            for k, v in after.items():
                if k not in before:
                    sub = fields_of(v, items, depth + 1)
                    changed[k] = sub if "." in sub else {".": _LEAF, **sub}
                    continue
                sub_c, sub_r = changed_fields(before[k], v, items, depth + 1)
                if sub_c is not None:
                    changed[k] = sub_c
                if sub_r is not None:
                    removed[k] = sub_r
            for k in before:
                if k not in after:
                    removed[k] = _LEAF
            return changed or None, removed or None
        if kind == "set":
            before_s = {set_key(v) for v in old}
            after_s = {set_key(v) for v in new}
            added = {k: _LEAF for k in after_s - before_s}
            gone = {k: _LEAF for k in before_s - after_s}
            return added or None, gone or None
    if old == new and type(old) is type(new):
        return None, None
    return (fields_of(new, node, depth) if isinstance(new, _CONTAINERS) else _LEAF), None


def _part(obj: Obj, status: bool, status_subresource: bool) -> Obj:
    if status:
        return {"status": obj.get("status") or {}}
    meta = obj.get("metadata") or {}
    part = {k: v for k, v in obj.items() if k not in _TOP_SKIP and not (status_subresource and k == "status")}
    part["metadata"] = {
        k: meta[k] for k in ("labels", "annotations", "finalizers", "ownerReferences") if meta.get(k)
    }
    return part


class _PartNode:
    """The schema of the part of an object a write covers (its metadata with ObjectMeta's list types)."""

    @staticmethod
    def of(node: Node) -> Node:
        props = dict(node.properties or {})
        props["metadata"] = META_NODE
        return Node(
            type="object", properties=props, additional=node.additional, additional_any=node.additional_any
        )


def entry(  # noqa: PLR0917 - mirrors metav1.ManagedFieldsEntry's fields
    manager: str, operation: str, api_version: str, fields: Trie, when: str, subresource: str | None
) -> Obj:
    out: Obj = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": when,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        out["subresource"] = subresource
    return out


def _same_entry(m: Obj, manager: str, operation: str, subresource: str | None) -> bool:
    return (m.get("manager"), m.get("operation"), m.get("subresource")) == (manager, operation, subresource)


def record_update(
    entries: list[Obj],
    *,
    manager: str,
    resource: ResourceKind,
    node: Node,
    old: Obj | None,
    new: Obj,
    subresource: str | None,
    status_subresource: bool,
    when: str,
) -> list[Obj]:
    """managedFields after an Update operation by ``manager`` (a create when ``old`` is None)."""
    status = subresource == "status"
    api_version = new.get("apiVersion") or resource.api_version
    if old is None:
        fields = object_fields(new, node, status=status)
        return [entry(manager, "Update", api_version, fields, when, subresource)] if fields else []
    top = "f:status" if status else None
    others = [m for m in entries if not _same_entry(m, manager, "Update", subresource)]
    mine = next((m for m in entries if _same_entry(m, manager, "Update", subresource)), None)
    shared = any(_touches(m.get("fieldsV1") or {}, top) for m in others)
    if not shared:
        # Fast path (every status write of the generator): nobody else owns anything here, so the writer
        # owns exactly what it now sets.
        fields = object_fields(new, node, status=status)
        out = others
    else:
        part_node = _PartNode.of(node)
        changed, removed = changed_fields(
            _part(old, status, status_subresource), _part(new, status, status_subresource), part_node, 0
        )
        changed = changed or {}
        removed = removed or {}
        previous = (mine or {}).get("fieldsV1") or {}
        fields = subtract(union(previous, changed), removed)
        out = []
        lost = union(changed, removed)
        for m in others:
            rest = subtract(m.get("fieldsV1") or {}, lost)
            if rest:
                out.append(dict(m, fieldsV1=rest))
    if fields:
        out = [*out, entry(manager, "Update", api_version, fields, when, subresource)]
    return out


def _touches(fields: Trie, top: str | None) -> bool:
    """Does a manager own anything in the part being written (status, or everything but status)?"""
    if top is not None:
        return top in fields
    return any(k != "f:status" for k in fields)
