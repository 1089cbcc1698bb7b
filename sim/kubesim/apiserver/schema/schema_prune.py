"""The prepare walk of a write, as apiextensions-apiserver does it before validating: prune unknown
fields, drop nulls of non-nullable fields, apply defaults, and report duplicate items of set and map lists. In
place, and only where the compiled :class:`~kubesim.apiserver.schema.schema_node.Node` says there is something
to do: this runs on every write.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from kubesim.apiserver.schema.schema_errors import Outcome, go_value
from kubesim.apiserver.schema.schema_node import Node, Obj, map_key
from kubesim.apiserver.status import FieldError


def prepare_value(node: Node, value: Any, old: Any, path: str, outcome: Outcome) -> None:
    # Hot on every write: no per-key allocation for leaves, paths built only for walked children.
    if isinstance(value, dict):
        leafy = node.leafy_keys
        if leafy is not None and value.keys() <= leafy and None not in value.values():
            return  # nothing unknown, nothing null, nothing below to walk
        props = node.properties
        additional = node.additional
        if props is None and additional is None:
            return
        old_map = old if isinstance(old, dict) else None
        drop: list[str] | None = None
        for key, item in value.items():
            child = props.get(key) if props is not None else None
            if child is None:
                child = additional
                if child is None:
                    if not node.additional_any:
                        drop = drop or []
                        drop.append(key)
                        outcome.unknown.append(f"{path}.{key}" if path else key)
                    continue
            if item is None:
                if not child.nullable:
                    drop = drop or []
                    drop.append(key)
                continue
            if child.walk:
                old_item = old_map.get(key) if old_map is not None else None
                if item is not old_item:
                    prepare_value(child, item, old_item, f"{path}.{key}" if path else key, outcome)
        if drop:
            for key in drop:
                del value[key]
        if node.defaults:
            apply_defaults(node, value, outcome, path)
    elif isinstance(value, list) and node.items is not None:
        items = node.items
        old_list = old if isinstance(old, list) else None
        if items.walk:
            for i, item in enumerate(value):
                old_item = old_list[i] if old_list is not None and i < len(old_list) else None
                # An item equal to the stored one at its place was prepared when stored.
                if item is not None and item is not old_item and item != old_item:
                    prepare_value(items, item, old_item, f"{path}[{i}]", outcome)
        if len(value) > 1 and node.list_type in ("map", "set"):
            outcome.errors.extend(duplicates(node, value, path))


def apply_defaults(node: Node, value: Obj, outcome: Outcome, path: str) -> None:
    for name, default in node.defaults.items():
        if name not in value:
            if not isinstance(default, dict | list):
                value[name] = default  # most defaults are scalars: nothing to copy or walk
                continue
            value[name] = fresh = copy.deepcopy(default)
            child = node.child(name)
            if child is not None and child.walk:
                prepare_value(child, fresh, None, f"{path}.{name}" if path else name, outcome)


def duplicates(node: Node, value: list[Any], path: str) -> list[FieldError]:
    seen: set[Any] = set()
    found: list[FieldError] = []
    for i, item in enumerate(value):
        if node.list_type == "map":
            if not isinstance(item, dict):
                continue
            key = map_key(node, item)
            shown = {k: item[k] for k in node.map_keys if k in item}
        else:
            key = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
            shown = item
        if key in seen:
            found.append(FieldError(f"{path}[{i}]", "Duplicate", "", go_value(shown)))
        seen.add(key)
    return found
