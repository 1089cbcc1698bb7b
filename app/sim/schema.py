"""Structural schemas, as the apiserver applies them to every write of a kind: pruning of unknown fields,
dropping of nulls in non-nullable fields, defaulting, list-type uniqueness, OpenAPI validation and the
``x-kubernetes-validations`` CEL rules, with the apiserver's error paths and messages.

A custom resource's schema is its CRD's ``openAPIV3Schema``; the built-in kinds the simulator serves
(Lease, Namespace, Event) get hand-written schemas of their Go types (see :mod:`app.sim.core`). Each schema is
compiled once per process into a :class:`Node` tree (the walks) and a jsonschema-rs validator (types,
required, enums, formats, bounds, patterns): both are cheap per write, which bulk populate needs.

Order per write, as in apiextensions-apiserver: prune + drop nulls + default (``prepare``), then validate
(schema errors), then the CEL rules unless a schema error blocks them. On an update, unchanged values are
ratcheted (CRDValidationRatcheting, GA in 1.33): a subtree identical to the stored one is neither walked
nor checked, and errors at unchanged paths are dropped, so objects stored before a schema change stay
updatable.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import jsonschema_rs
import orjson

from app.sim import cel
from app.sim.status import FieldError

Obj = dict[str, Any]
Path = tuple[str | int, ...]

# ObjectMeta fields: metadata is decoded as the typed struct, so anything else in it is an unknown field.
OBJECT_META_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_ABSENT: Final = object()
# Schema errors that keep the CEL rules from running (apiextensions-apiserver hasBlockingErr).
_GO_TYPES: Final = {
    "integer": "int32",
    "number": "float64",
    "string": "string",
    "boolean": "bool",
    "array": "[]string",
    "object": "struct",
}
_BLOCKING: Final = frozenset({"Required", "NotSupported", "TypeInvalid", "TooLong", "TooMany"})


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


def to_json_schema(schema: Any) -> Any:
    """The OpenAPI v3 structural schema as JSON Schema draft 4 (nullable as a type union, int-or-string as
    anyOf); the Kubernetes extensions are handled by the walks, descriptions are dropped."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in ("description", "default", "nullable", "example", "externalDocs") or k.startswith("x-"):
            continue
        if k == "properties":
            out[k] = {pk: to_json_schema(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not"):
            out[k] = to_json_schema(v)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [to_json_schema(s) for s in v]
        elif k == "format" and v not in ("date-time", "date", "uuid", "byte"):
            continue  # int32/int64/quantity...: not string formats jsonschema knows
        elif k == "format" and v == "byte":
            out["pattern"] = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
        else:
            out[k] = v
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


@dataclass(slots=True)
class Outcome:
    """What a write's checks found: errors (422 causes), pruned unknown fields (for warnings or 400)."""

    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    ratcheted: int = 0  # errors and rules skipped because the stored object had the same value


class StructuralSchema:
    """A kind's compiled schema: ``prepare`` then ``validate`` each object a write would store."""

    def __init__(self, schema: dict[str, Any], *, typed_metadata: bool = True) -> None:
        self.raw = schema
        self.root = compile_node(schema)
        # Without preserved unknown fields, a prepared object nests no deeper than the schema does.
        text = orjson.dumps(schema)
        self.bounded = (
            b"x-kubernetes-preserve-unknown-fields" not in text and b'"additionalProperties":true' not in text
        )
        self.typed_metadata = typed_metadata
        # Creates of the same content (bulk populate writes a few thousand distinct specs) reuse what the
        # walks made of it: the prepared content, shared read-only like every stored object, and the fact
        # that it passed the schema and the rules below the root. Keys are the content's JSON bytes.
        self._prepared: dict[bytes, Obj] = {}
        self._valid: set[bytes] = set()
        json_schema = to_json_schema(schema)
        json_schema["$schema"] = "http://json-schema.org/draft-04/schema#"
        # metadata is checked as ObjectMeta by app.sim.validation, not by the schema.
        json_schema.setdefault("properties", {})["metadata"] = {"type": "object"}
        self._validator = jsonschema_rs.validator_for(json_schema, validate_formats=True)
        # One validator per top-level field too: an update checks only the fields it changed (the errors of
        # unchanged ones would be ratcheted away anyway), so a status write does not re-validate the spec.
        self._parts = {
            key: jsonschema_rs.validator_for(
                {"$schema": "http://json-schema.org/draft-04/schema#", **sub}, validate_formats=True
            )
            for key, sub in json_schema.get("properties", {}).items()
            if key not in ("metadata", "apiVersion", "kind") and isinstance(sub, dict)
        }

    # -- prune, drop nulls, default ---------------------------------------------------------------------
    def prepare(self, obj: Obj, old: Obj | None, outcome: Outcome) -> None:
        """Prune unknown fields (recording their paths), drop nulls of non-nullable fields and apply
        defaults, in place. Subtrees identical (``is``) to the stored object's were prepared when stored
        and may be shared with it, so they are skipped and never mutated."""
        meta = obj.get("metadata")
        if isinstance(meta, dict) and self.typed_metadata:
            for key in [k for k in meta if k not in OBJECT_META_FIELDS]:
                del meta[key]
                outcome.unknown.append(f"metadata.{key}")
        memo_key = _content_key(obj) if old is None else self._field_key(obj, old)
        if memo_key is not None and old is not None:
            field_hit = self._prepared.get(memo_key)
            if field_hit is not None:
                obj[field_hit["field"]] = field_hit["value"]
                return
        elif memo_key is not None:
            hit = self._prepared.get(memo_key)
            if hit is not None:
                for key in [k for k in obj if k != "metadata" and k not in hit]:
                    del obj[key]
                obj.update(hit)
                return
        unknown_before, errors_before = len(outcome.unknown), len(outcome.errors)
        root = self.root
        for key in list(obj):
            if key in ("apiVersion", "kind", "metadata"):
                continue
            old_value = old.get(key, _ABSENT) if old is not None else _ABSENT
            value = obj[key]
            if value is old_value:
                continue
            child = root.child(key)
            if child is None:
                if not root.additional_any:
                    del obj[key]
                    outcome.unknown.append(key)
                continue
            if value is None and not child.nullable:
                del obj[key]
                continue
            if child.walk:
                self._prepare(child, value, old_value, key, outcome)
        self._defaults(root, obj, outcome, "")
        clean = len(outcome.unknown) == unknown_before and len(outcome.errors) == errors_before
        if memo_key is not None and clean:
            if old is None:
                _remember(self._prepared, memo_key, {k: v for k, v in obj.items() if k != "metadata"})
            else:
                name = self._changed_field(obj, old)
                if name is not None and name in obj:
                    _remember(self._prepared, memo_key, {"field": name, "value": obj[name]})

    def _prepare(self, node: Node, value: Any, old: Any, path: str, outcome: Outcome) -> None:
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
                        self._prepare(child, item, old_item, f"{path}.{key}" if path else key, outcome)
            if drop:
                for key in drop:
                    del value[key]
            if node.defaults:
                self._defaults(node, value, outcome, path)
        elif isinstance(value, list) and node.items is not None:
            items = node.items
            old_list = old if isinstance(old, list) else None
            if items.walk:
                for i, item in enumerate(value):
                    old_item = old_list[i] if old_list is not None and i < len(old_list) else None
                    # An item equal to the stored one at its place was prepared when stored.
                    if item is not None and item is not old_item and item != old_item:
                        self._prepare(items, item, old_item, f"{path}[{i}]", outcome)
            if len(value) > 1 and node.list_type in ("map", "set"):
                outcome.errors.extend(_duplicates(node, value, path))

    def _defaults(self, node: Node, value: Obj, outcome: Outcome, path: str) -> None:
        for name, default in node.defaults.items():
            if name not in value:
                if not isinstance(default, dict | list):
                    value[name] = default  # most defaults are scalars: nothing to copy or walk
                    continue
                value[name] = fresh = copy.deepcopy(default)
                child = node.child(name)
                if child is not None and child.walk:
                    self._prepare(child, fresh, None, f"{path}.{name}" if path else name, outcome)

    # -- validate ---------------------------------------------------------------------------------------
    def validate(self, obj: Obj, old: Obj | None, outcome: Outcome, *, cel_self: Obj | None = None) -> None:
        """Schema errors, then (unless one blocks them) the CEL rules. ``cel_self``: what a root rule sees
        as ``self`` (the apiserver exposes only metadata.name and generateName of metadata)."""
        memo_key = _content_key(obj) if old is None else self._field_key(obj, old)
        if memo_key is not None and memo_key in self._valid:
            # Known good content: only the root's rules remain, they may read metadata.name.
            self._root_rules(obj, old, cel_self, outcome)
            return
        errors_before, ratcheted_before = len(outcome.errors), outcome.ratcheted
        errors: list[FieldError] = []
        for prefix, err in self._schema_errors(obj, old):
            path: Path = (*prefix, *err.instance_path)
            if path and path[0] == "metadata":
                continue
            if old is not None and _unchanged(obj, old, path, err.kind.name == "required"):
                outcome.ratcheted += 1
                continue  # ratcheting: the stored object had this already
            errors.append(_field_error(err, path))
        outcome.errors.extend(errors)
        if any(e.type in _BLOCKING for e in outcome.errors):
            if self.root.rules_below:
                outcome.errors.append(
                    FieldError(
                        "<nil>",
                        "Invalid",
                        "some validation rules were not checked because the object was invalid; "
                        "correct the existing errors to complete validation",
                        '"null"',
                    )
                )
            return
        if self.root.rules_below:
            self._root_rules(obj, old, cel_self, outcome)
            self._rule_children(self.root, obj, _ABSENT if old is None else old, "", outcome)
        # Only what passed on its own: an update whose errors were ratcheted away passed thanks to the old
        # object, which another write of the same content may not have.
        root_skips = sum(1 for r in self.root.rules if not r.program.uses_old_self) if old is not None else 0
        unratcheted = outcome.ratcheted - ratcheted_before <= root_skips
        if memo_key is not None and len(outcome.errors) == errors_before and unratcheted:
            if len(self._valid) >= _MEMO_MAX:
                self._valid.clear()
            self._valid.add(memo_key)

    def _changed_field(self, obj: Obj, old: Obj) -> str | None:
        """The one top-level field an update changes (a status write), when its checks depend on nothing
        else: no transition rules below it and no rule on the object reads it. None otherwise."""
        changed = None
        for key in obj.keys() | old.keys():
            if key in ("metadata", "apiVersion", "kind") or obj.get(key, _ABSENT) is old.get(key, _ABSENT):
                continue
            if changed is not None:
                return None
            changed = key
        if changed is None or changed not in obj:
            return None
        node = self.root.properties.get(changed) if self.root.properties else None
        if node is None or node.transition_below:
            return None
        for rule in self.root.rules:
            fields = rule.program.self_fields
            if fields is None or changed in fields:
                return None
        return changed

    def _field_key(self, obj: Obj, old: Obj) -> bytes | None:
        name = self._changed_field(obj, old)
        if name is None:
            return None
        key = name.encode() + b"\x00" + orjson.dumps(obj[name])
        return key if len(key) <= _MEMO_KEY_MAX else None

    def _root_rules(self, obj: Obj, old: Obj | None, cel_self: Obj | None, outcome: Outcome) -> None:
        """The rules on the object itself: ``self`` shows only name and generateName of metadata."""
        if self.root.rules:
            lone = Node(type=self.root.type, rules=self.root.rules)
            new_self = cel_self if cel_self is not None else _cel_root(obj)
            self._rules(lone, new_self, _ABSENT if old is None else _cel_root(old), "", outcome)

    def _schema_errors(self, obj: Obj, old: Obj | None) -> Iterator[tuple[Path, Any]]:
        """(path prefix, jsonschema-rs error): the whole object on create, the changed fields on update."""
        parts = self._parts
        if old is None or any(k not in parts for k in obj if k not in ("metadata", "apiVersion", "kind")):
            for err in self._validator.iter_errors(obj):
                yield (), err
            return
        for key, value in obj.items():
            validator = parts.get(key)
            if validator is not None and value is not old.get(key) and value != old.get(key):
                for err in validator.iter_errors(value):
                    yield (key,), err

    def type_errors(self, obj: Obj, old: Obj | None) -> Iterator[tuple[Path, str, Any]]:
        """JSON type mismatches as (path, Go type, value): a typed kind's decoder refuses these (400)."""
        for err in self._validator.iter_errors(obj):
            if err.kind.name not in ("type", "anyOf"):
                continue
            path: Path = tuple(err.instance_path)
            if (path and path[0] == "metadata") or (old is not None and _unchanged(obj, old, path, False)):
                continue
            want = [t for t in getattr(err.kind, "types", ["integer", "string"]) if t != "null"]
            yield path, _GO_TYPES.get(want[0] if want else "", "string"), err.instance

    def _rules(self, node: Node, value: Any, old: Any, path: str, outcome: Outcome) -> None:
        if value is old:
            return
        creating = old is _ABSENT
        for rule in node.rules:
            if rule.program.uses_old_self:
                if creating:
                    continue  # transition rules run on updates only
                env = {"self": value, "oldSelf": old}
            else:
                # Ratcheting: an unchanged value passed when it was stored. (Python equality is a little
                # wider than CEL's, 1 == True, a type change a schema error reports before this runs.)
                if not creating and _same_for(rule.program, value, old):
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
                    FieldError(where or "<nil>", "Invalid", detail, f'"{_type_of(node, value)}"')
                )
        self._rule_children(node, value, old, path, outcome)

    def _rule_children(self, node: Node, value: Any, old: Any, path: str, outcome: Outcome) -> None:
        creating = old is _ABSENT
        if isinstance(value, dict):
            old_map = old if isinstance(old, dict) else None
            for key, child in node.rule_children.items():
                if not (child.plain_below if creating else child.rules_below):
                    continue
                item = value.get(key)
                if item is None:
                    continue
                old_item = old_map.get(key, _ABSENT) if old_map is not None else _ABSENT
                self._rules(child, item, old_item, f"{path}.{key}" if path else key, outcome)
            extra = node.additional
            if extra is not None and (extra.plain_below if creating else extra.rules_below):
                props = node.properties or {}
                for key, item in value.items():
                    if key in props or item is None:
                        continue
                    old_item = old_map.get(key, _ABSENT) if old_map is not None else _ABSENT
                    self._rules(extra, item, old_item, f"{path}.{key}" if path else key, outcome)
        elif isinstance(value, list) and node.items is not None:
            items = node.items
            if not (items.plain_below if creating else items.rules_below):
                return
            olds = _correlate(node, value, old)
            for i, item in enumerate(value):
                self._rules(items, item, olds[i], f"{path}[{i}]", outcome)


# The prepare/validate memos of a schema: keyed by a whole object's content (a TrainJob's is ~3.5 KB) or a
# status write's; cleared when full. Creates from templates repeat and hit; status writes (timestamps)
# rarely do, so a memo fills to the cap and starts over. Each schema has two, and the simulator shares the
# process with the service in tests: 4096 entries made a ~30 MB sawtooth that the chaos soak's RSS reading
# took for growth. 512 entries of at most _MEMO_KEY_MAX bytes: a few MB per schema at most.
_MEMO_MAX: Final = 512
_MEMO_KEY_MAX: Final = 16 * 1024


def _content_key(obj: Obj) -> bytes | None:
    key = orjson.dumps({k: v for k, v in obj.items() if k != "metadata"})
    return key if len(key) <= _MEMO_KEY_MAX else None


def _remember(memo: dict[bytes, Obj], key: bytes, value: Obj) -> None:
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    memo[key] = value


def _same_for(program: cel.Program, value: Any, old: Any) -> bool:
    """Does the rule see the same input (only the fields of self it reads, when it says which)?"""
    fields = program.self_fields
    if fields is None or not isinstance(value, dict) or not isinstance(old, dict):
        return bool(value == old)
    return all(value.get(f, _ABSENT) == old.get(f, _ABSENT) for f in fields)


def _cel_root(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    visible = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return {**obj, "metadata": visible}


def _correlate(node: Node, value: list[Any], old: Any) -> list[Any]:
    """Old items for transition rules: only list-type map items are correlatable (by key)."""
    if node.list_type != "map" or not isinstance(old, list):
        return [_ABSENT] * len(value)
    index = {_map_key(node, item): item for item in old if isinstance(item, dict)}
    return [index.get(_map_key(node, item), _ABSENT) if isinstance(item, dict) else _ABSENT for item in value]


def _map_key(node: Node, item: Obj) -> Any:
    key = tuple(item.get(k) for k in node.map_keys)
    try:
        hash(key)
    except TypeError:  # keys are scalars in valid objects; anything else still gets a comparable key
        return orjson.dumps(key)
    return key


def _duplicates(node: Node, value: list[Any], path: str) -> list[FieldError]:
    seen: set[Any] = set()
    found: list[FieldError] = []
    for i, item in enumerate(value):
        if node.list_type == "map":
            if not isinstance(item, dict):
                continue
            key = _map_key(node, item)
            shown = {k: item[k] for k in node.map_keys if k in item}
        else:
            key = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
            shown = item
        if key in seen:
            found.append(FieldError(f"{path}[{i}]", "Duplicate", "", go_value(shown)))
        seen.add(key)
    return found


def _unchanged(obj: Obj, old: Obj, path: Path, required: bool) -> bool:
    new_v, old_v = _at(obj, path), _at(old, path)
    return (
        new_v is not _ABSENT and (new_v is old_v or cel.cel_equal(new_v, old_v))
        if not required
        else (new_v is not _ABSENT and old_v is not _ABSENT and cel.cel_equal(new_v, old_v))
    )


def _at(value: Any, path: Path) -> Any:
    for part in path:
        if isinstance(value, dict) and isinstance(part, str):
            value = value.get(part, _ABSENT)
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        else:
            return _ABSENT
        if value is _ABSENT:
            return value
    return value


def field_path(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_of(node: Node, value: Any) -> str:
    return node.type or json_type(value)


def go_value(value: Any) -> str:
    """A value as the apiserver prints it in "Invalid value: ..." (Go's %#v, close enough for JSON)."""
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        inner = ", ".join(f"{orjson.dumps(k).decode()}:{go_value(v)}" for k, v in value.items())
        return "map[string]interface {}{" + inner + "}"
    return "[]interface {}{" + ", ".join(go_value(v) for v in value) + "}"


def _field_error(err: Any, path: Path) -> FieldError:
    """A jsonschema-rs error as apiextensions-apiserver reports the go-openapi one."""
    kind = err.kind
    name = kind.name
    where = field_path(path)
    instance = err.instance
    if name == "required":
        return FieldError(field_path((*path, kind.property)), "Required", "")
    if name == "type":
        want = ",".join(kind.types) if hasattr(kind, "types") else "?"
        got = json_type(instance)
        return FieldError(
            where, "TypeInvalid", f'{where} in body must be of type {want}: "{got}"', f'"{got}"'
        )
    if name == "anyOf":  # int-or-string (the only anyOf in structural schemas) with another type
        got = json_type(instance)
        return FieldError(
            where, "TypeInvalid", f'{where} in body must be of type integer,string: "{got}"', f'"{got}"'
        )
    if name == "enum":
        supported = ", ".join(orjson.dumps(o).decode() for o in kind.options)
        return FieldError(where, "NotSupported", f"supported values: {supported}", go_value(instance))
    if name == "maxLength":
        return FieldError(where, "TooLong", f"may not be more than {kind.limit} bytes")
    if name == "maxItems":
        return FieldError(where, "TooMany", f"must have at most {kind.limit} items", str(len(instance)))
    messages = {
        "pattern": lambda: f"{where} in body should match '{kind.pattern}'",
        "minimum": lambda: f"{where} in body should be greater than or equal to {kind.limit}",
        "maximum": lambda: f"{where} in body should be less than or equal to {kind.limit}",
        "exclusiveMinimum": lambda: f"{where} in body should be greater than {kind.limit}",
        "exclusiveMaximum": lambda: f"{where} in body should be less than {kind.limit}",
        "minLength": lambda: f"{where} in body should be at least {kind.limit} chars long",
        "minItems": lambda: f"{where} in body should have at least {kind.limit} items",
        "minProperties": lambda: f"{where} in body should have at least {kind.limit} properties",
        "maxProperties": lambda: f"{where} in body should have at most {kind.limit} properties",
        "format": lambda: f"{where} in body must be of type {kind.format}: {go_value(instance)}",
        "uniqueItems": lambda: f"{where} in body shouldn't contain duplicates",
        "multipleOf": lambda: f"{where} in body should be a multiple of {kind.value}",
    }
    make = messages.get(name)
    detail = make() if make is not None else err.message
    return FieldError(where, "Invalid", detail, go_value(instance))
