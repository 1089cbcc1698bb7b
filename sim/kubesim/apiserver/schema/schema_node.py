"""A kind's structural schema compiled to a tree of :class:`Node` (one per schema location), reduced to
what the per-write walks need: pruning, nullability, defaults, list and map types, and the compiled CEL rules
with flags saying where below they are. Compiled once per schema; the walks in
:mod:`kubesim.apiserver.schema.schema_prune` and :mod:`kubesim.apiserver.schema.schema_rules` read it on every
write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from kubesim.apiserver.schema import cel

Obj = dict[str, Any]
Path = tuple[str | int, ...]
# "No value here" (a missing key, no stored object), distinct from a stored null.
ABSENT: Final = object()


@dataclass(slots=True)
class Rule:
    program: cel.Program
    message: str
    field_path: str


@dataclass(slots=True, eq=False)
class Node:
    """One schema location, reduced to what the walks need."""

    type: str | None = None
    nullable: bool = False
    properties: dict[str, Node] | None = None
    additional: Node | None = None
    additional_any: bool = False  # additionalProperties: true (or preserve-unknown-fields)
    items: Node | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    list_type: str = "atomic"
    map_keys: tuple[str, ...] = ()
    map_type: str = "granular"
    rules: list[Rule] = field(default_factory=list)
    rules_below: bool = False  # this node or a descendant has CEL rules
    plain_below: bool = False  # ... rules that also run on create (not transition rules, on oldSelf)
    transition_below: bool = False  # ... transition rules (their result depends on the stored object)
    rule_children: dict[str, Node] = field(default_factory=dict)  # properties with rules_below
    # A map whose known fields are all leaves and that has no defaults: pruning is a key-set check.
    leafy_keys: frozenset[str] | None = None
    walk: bool = False  # prepare must descend here (pruning, nulls, defaults, list uniqueness)

    def child(self, key: str) -> Node | None:
        if self.properties is not None:
            found = self.properties.get(key)
            if found is not None:
                return found
        return self.additional


LEAF: Final = Node()


def compile_node(schema: dict[str, Any]) -> Node:
    node = Node()
    node.type = schema.get("type")
    node.nullable = bool(schema.get("nullable"))
    if schema.get("x-kubernetes-int-or-string"):
        node.type = None
    props = schema.get("properties")
    if isinstance(props, dict):
        node.properties = {k: compile_node(v) for k, v in props.items() if isinstance(v, dict)}
        node.defaults = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        node.additional = compile_node(additional)
    elif additional is True or schema.get("x-kubernetes-preserve-unknown-fields"):
        node.additional_any = True
    if node.type == "object" and node.properties is None and node.additional is None:
        # A structural "type: object" without fields keeps nothing unless unknown fields are preserved.
        node.properties = {} if not node.additional_any else None
    items = schema.get("items")
    if isinstance(items, dict):
        node.items = compile_node(items)
    node.list_type = schema.get("x-kubernetes-list-type", "atomic")
    node.map_keys = tuple(schema.get("x-kubernetes-list-map-keys") or ())
    node.map_type = schema.get("x-kubernetes-map-type", "granular")
    for raw in schema.get("x-kubernetes-validations") or ():
        node.rules.append(
            Rule(cel.compile_rule(raw["rule"]), raw.get("message") or "", raw.get("fieldPath") or "")
        )
    children = [*(node.properties or {}).values(), node.additional, node.items]
    node.rules_below = bool(node.rules) or any(c is not None and c.rules_below for c in children)
    node.plain_below = any(not r.program.uses_old_self for r in node.rules) or any(
        c is not None and c.plain_below for c in children
    )
    node.transition_below = any(r.program.uses_old_self for r in node.rules) or any(
        c is not None and c.transition_below for c in children
    )
    node.rule_children = {k: c for k, c in (node.properties or {}).items() if c.rules_below}
    props_only = node.properties is not None and node.additional is None and not node.defaults
    if props_only and not any(c.walk for c in (node.properties or {}).values()):
        node.leafy_keys = frozenset(node.properties or ())
    node.walk = (
        node.properties is not None
        or bool(node.defaults)
        or node.list_type in ("map", "set")
        or any(c is not None and c.walk for c in children)
        or (node.additional is not None and not node.additional_any)
    )
    return node


def map_key(node: Node, item: Obj) -> Any:
    key = tuple(item.get(k) for k in node.map_keys)
    try:
        hash(key)
    except TypeError:  # keys are scalars in valid objects; anything else still gets a comparable key
        return orjson.dumps(key)
    return key
