"""The ``x-kubernetes-validations`` pass of a write: runs each compiled CEL rule of a
:class:`~kubesim.apiserver.schema.schema_node.Node` tree against the new value (and, for transition rules, the
stored one), with the apiserver's ratcheting of unchanged values and correlation of list-map items, and
records failures as field errors in the write's :class:`~kubesim.apiserver.schema.schema_errors.Outcome`.
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.schema import cel
from kubesim.apiserver.schema.schema_errors import Outcome, type_of
from kubesim.apiserver.schema.schema_node import ABSENT, Node, Obj, map_key
from kubesim.apiserver.status import FieldError


def run_rules(node: Node, value: Any, old: Any, path: str, outcome: Outcome) -> None:
    if value is old:
        return
    creating = old is ABSENT
    for rule in node.rules:
        if rule.program.uses_old_self:
            if creating:
                continue  # transition rules run on updates only
            env = {"self": value, "oldSelf": old}
        else:
            # Ratcheting: an unchanged value passed when it was stored. (Python equality is a little
            # wider than CEL's, 1 == True, a type change a schema error reports before this runs.)
            if not creating and same_for(rule.program, value, old):
                outcome.ratcheted += 1
                continue
            env = {"self": value}
        try:
            ok = rule.program.evaluate(env) is True
            detail = rule.message or f"failed rule: {rule.program.source}"
        except cel.CelEvalError as exc:
            ok, detail = False, f"{exc} evaluating rule: {rule.program.source}"
        if not ok:
            where = path + rule.field_path if rule.field_path else path
            outcome.errors.append(
                FieldError(where or "<nil>", "Invalid", detail, f'"{type_of(node, value)}"')
            )
    rule_children(node, value, old, path, outcome)


def rule_children(node: Node, value: Any, old: Any, path: str, outcome: Outcome) -> None:
    creating = old is ABSENT
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else None
        for key, child in node.rule_children.items():
            if not (child.plain_below if creating else child.rules_below):
                continue
            item = value.get(key)
            if item is None:
                continue
            old_item = old_map.get(key, ABSENT) if old_map is not None else ABSENT
            run_rules(child, item, old_item, f"{path}.{key}" if path else key, outcome)
        extra = node.additional
        if extra is not None and (extra.plain_below if creating else extra.rules_below):
            props = node.properties or {}
            for key, item in value.items():
                if key in props or item is None:
                    continue
                old_item = old_map.get(key, ABSENT) if old_map is not None else ABSENT
                run_rules(extra, item, old_item, f"{path}.{key}" if path else key, outcome)
    elif isinstance(value, list) and node.items is not None:
        items = node.items
        if not (items.plain_below if creating else items.rules_below):
            return
        olds = correlate(node, value, old)
        for i, item in enumerate(value):
            run_rules(items, item, olds[i], f"{path}[{i}]", outcome)


def same_for(program: cel.Program, value: Any, old: Any) -> bool:
    """Does the rule see the same input (only the fields of self it reads, when it says which)?"""
    fields = program.self_fields
    if fields is None or not isinstance(value, dict) or not isinstance(old, dict):
        return bool(value == old)
    return all(value.get(f, ABSENT) == old.get(f, ABSENT) for f in fields)


def cel_root(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    visible = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return {**obj, "metadata": visible}


def correlate(node: Node, value: list[Any], old: Any) -> list[Any]:
    """Old items for transition rules: only list-type map items are correlatable (by key)."""
    if node.list_type != "map" or not isinstance(old, list):
        return [ABSENT] * len(value)
    index = {map_key(node, item): item for item in old if isinstance(item, dict)}
    return [index.get(map_key(node, item), ABSENT) if isinstance(item, dict) else ABSENT for item in value]
