"""Server-side apply (PATCH ``application/apply-patch+yaml``), following structured-merge-diff:

- the applied configuration is merged into the live object (maps field by field, list-type maps by key,
  sets by value, atomic lists and scalars replaced);
- a field the configuration sets to a value other than the live one, and that another manager owns, is a
  conflict: 409 with one cause per field, unless ``force=true`` takes the field over;
- fields the manager applied last time but no longer does, and that nobody else owns, are removed;
- the manager's Apply entry in managedFields becomes exactly the configuration's field set.
"""

from __future__ import annotations

import orjson

from kubesim.apiserver.schema.schema import Node
from kubesim.apiserver.status import StoreError, status_body
from kubesim.apiserver.storage.managed_fields import (
    MISSING,
    Trie,
    child_node,
    contains,
    entry,
    item_key,
    leaves,
    object_fields,
    path_string,
    set_key,
    subtract,
    union,
    value_at,
)
from kubesim.apiserver.storage.managed_fields import _list_kind as list_kind
from kubesim.apiserver.storage.table import Obj

_USER_META = ("labels", "annotations", "finalizers", "ownerReferences")


def apply_config(
    live: Obj,
    config: Obj,
    *,
    node: Node,
    manager: str,
    api_version: str,
    subresource: str | None,
    force: bool,
    when: str,
) -> tuple[Obj, list[Obj]]:
    """(the merged object, its managedFields) for ``manager`` applying ``config`` to ``live``."""
    status = subresource == "status"
    applied = object_fields(config, node, status=status)
    entries: list[Obj] = list((live.get("metadata") or {}).get("managedFields") or [])
    mine = [m for m in entries if _is(m, manager, "Apply", subresource)]
    others = [m for m in entries if not _is(m, manager, "Apply", subresource)]
    conflicts: list[tuple[Obj, tuple[str, ...]]] = []
    for path in leaves(applied):
        want = value_at(config, path)
        if want is MISSING or _is_container(want, path, node):
            continue
        have = value_at(live, path)
        if have is not MISSING and have == want and type(have) is type(want):
            continue
        conflicts += [(m, path) for m in others if contains(m.get("fieldsV1") or {}, path)]
    if conflicts and not force:
        raise conflict_error(conflicts)
    if conflicts:
        taken: Trie = {}
        for _, path in conflicts:
            taken = union(taken, _trie(path))
        others = [dict(m, fieldsV1=subtract(m.get("fieldsV1") or {}, taken)) for m in others]
        others = [m for m in others if m["fieldsV1"]]
    merged = _merge_object(live, config, node, status)
    previous = mine[0].get("fieldsV1") or {} if mine else {}
    owned_by_others: Trie = {}
    for m in others:
        owned_by_others = union(owned_by_others, m.get("fieldsV1") or {})
    stale = subtract(subtract(previous, applied), owned_by_others)
    if stale:
        pruned = _remove(merged, stale, _root_node(node), 0)
        assert isinstance(pruned, dict)
        merged = pruned
    new_entries = [*others, entry(manager, "Apply", api_version, applied, when, subresource)]
    return merged, new_entries


def _is(m: Obj, manager: str, operation: str, subresource: str | None) -> bool:
    return (m.get("manager"), m.get("operation"), m.get("subresource")) == (manager, operation, subresource)


def _trie(path: tuple[str, ...]) -> Trie:
    out: Trie = {}
    for part in reversed(path):
        out = {part: out}
    return out


def _is_container(value: object, path: tuple[str, ...], node: Node) -> bool:
    """A map or granular list: its own membership ("." in FieldsV1) is no value to conflict over."""
    return isinstance(value, dict) or (isinstance(value, list) and bool(path) and path[-1].startswith("k:"))


def _root_node(node: Node) -> Node:
    from kubesim.apiserver.storage.managed_fields import META_NODE

    props = dict(node.properties or {})
    props["metadata"] = META_NODE
    return Node(
        type="object", properties=props, additional=node.additional, additional_any=node.additional_any
    )


def _merge_object(live: Obj, config: Obj, node: Node, status: bool) -> Obj:
    merged = dict(live)
    meta = dict(live.get("metadata") or {})
    cmeta = config.get("metadata") or {}
    from kubesim.apiserver.storage.managed_fields import META_NODE

    if not status:
        for k in _USER_META:
            if k in cmeta and cmeta[k] is not None:
                meta[k] = merge(meta.get(k, MISSING), cmeta[k], child_node(META_NODE, k), 1)
        for k, v in config.items():
            if k in ("apiVersion", "kind", "metadata", "status"):
                continue
            merged[k] = merge(live.get(k, MISSING), v, child_node(node, k), 1)
    elif "status" in config:
        merged["status"] = merge(live.get("status", MISSING), config["status"], child_node(node, "status"), 1)
    merged["metadata"] = meta
    return merged


def merge(live: object, config: object, node: Node, depth: int) -> object:
    if live is MISSING or config is None:
        return config
    if isinstance(live, dict) and isinstance(config, dict) and node.map_type != "atomic":
        out = dict(live)
        for k, v in config.items():
            out[k] = merge(live.get(k, MISSING), v, child_node(node, k), depth + 1)
        return out
    if isinstance(live, list) and isinstance(config, list):
        kind, keys = list_kind(node, config or live)
        items = node.items if node.items is not None else node
        if kind == "map":
            wanted = {item_key(keys, v): v for v in config if isinstance(v, dict)}
            out_list = []
            for v in live:
                k = item_key(keys, v) if isinstance(v, dict) else None
                if k is not None and k in wanted:
                    out_list.append(merge(v, wanted.pop(k), items, depth + 1))
                else:
                    out_list.append(v)
            out_list += [v for v in config if isinstance(v, dict) and item_key(keys, v) in wanted]
            return out_list
        if kind == "set":
            return [*live, *(v for v in config if v not in live)]
    return config


def _remove(value: object, trie: Trie, node: Node, depth: int) -> object:
    if isinstance(value, dict):
        out = dict(value)
        for k, sub in trie.items():
            if not k.startswith("f:") or k[2:] not in out:
                continue
            name = k[2:]
            if not sub:
                del out[name]
                continue
            kept = _remove(out[name], sub, child_node(node, name), depth + 1)
            if "." in sub and not kept:
                del out[name]
            else:
                out[name] = kept
        return out
    if isinstance(value, list):
        kind, keys = list_kind(node, value)
        items = node.items if node.items is not None else node
        if kind == "map":
            out_list = []
            for v in value:
                sub = trie.get(item_key(keys, v)) if isinstance(v, dict) else None
                if sub is None:
                    out_list.append(v)
                elif sub and set(sub) != {"."}:
                    out_list.append(_remove(v, sub, items, depth + 1))
            return out_list
        if kind == "set":
            return [v for v in value if set_key(v) not in trie]
    return value


def _manager_name(m: Obj) -> str:
    text = orjson.dumps(m.get("manager", "")).decode()
    if m.get("subresource"):
        text += f" with subresource {orjson.dumps(m['subresource']).decode()}"
    if m.get("operation") == "Update":
        text += f" using {m.get('apiVersion', '')}"
    return text


def conflict_error(conflicts: list[tuple[Obj, tuple[str, ...]]]) -> StoreError:
    """409 Conflict as the apiserver reports apply conflicts (fieldmanager NewConflictError)."""
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {_manager_name(m)}",
            "field": path_string(p),
        }
        for m, p in conflicts
    ]
    if len(conflicts) == 1:
        m, p = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {_manager_name(m)}: {path_string(p)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for m, p in conflicts:
            by_manager.setdefault(_manager_name(m), []).append(path_string(p))
        lines: list[str] = []
        for name in sorted(by_manager):
            lines.append(f"conflicts with {name}:")
            lines += [f"- {p}" for p in by_manager[name]]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return StoreError(409, status_body(409, "Conflict", message, {"causes": causes}))
