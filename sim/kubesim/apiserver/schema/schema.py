"""Structural schemas, as the apiserver applies them to every write of a kind: pruning of unknown fields,
dropping of nulls in non-nullable fields, defaulting, list-type uniqueness, OpenAPI validation and the
``x-kubernetes-validations`` CEL rules, with the apiserver's error paths and messages.

A custom resource's schema is its CRD's ``openAPIV3Schema``; the built-in kinds the simulator serves (Lease,
Namespace, Event) get hand-written schemas of their Go types (see :mod:`kubesim.apiserver.core`). Each schema
is compiled once per process into a :class:`Node` tree (the walks) and a jsonschema-rs validator (types,
required, enums, formats, bounds, patterns): both are cheap per write, which bulk populate needs.

Order per write, as in apiextensions-apiserver: prune + drop nulls + default (``prepare``), then validate
(schema errors), then the CEL rules unless a schema error blocks them. On an update, unchanged values are
ratcheted (CRDValidationRatcheting, GA in 1.33): a subtree identical to the stored one is neither walked
nor checked, and errors at unchanged paths are dropped, so objects stored before a schema change stay
updatable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import jsonschema_rs
import orjson

from kubesim.apiserver.schema import cel
from kubesim.apiserver.schema.schema_errors import (
    BLOCKING,
    GO_TYPES,
    Outcome,
    field_error,
    field_path,
    go_value,
    json_type,
)
from kubesim.apiserver.schema.schema_node import ABSENT, LEAF, Node, Obj, Path, Rule, compile_node
from kubesim.apiserver.schema.schema_prune import apply_defaults, prepare_value
from kubesim.apiserver.schema.schema_rules import cel_root, rule_children, run_rules
from kubesim.apiserver.status import FieldError

# The pieces live in schema_node (compiled tree), schema_prune (prepare walk), schema_rules (CEL pass) and
# schema_errors (outcome and messages); callers import these names from here.
__all__ = [
    "LEAF",
    "OBJECT_META_FIELDS",
    "Node",
    "Obj",
    "Outcome",
    "Path",
    "Rule",
    "StructuralSchema",
    "compile_node",
    "field_path",
    "go_value",
    "json_type",
    "to_json_schema",
]

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
        # metadata is checked as ObjectMeta by kubesim.apiserver.schema.validation, not by the schema.
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
            old_value = old.get(key, ABSENT) if old is not None else ABSENT
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
                prepare_value(child, value, old_value, key, outcome)
        apply_defaults(root, obj, outcome, "")
        clean = len(outcome.unknown) == unknown_before and len(outcome.errors) == errors_before
        if memo_key is not None and clean:
            if old is None:
                _remember(self._prepared, memo_key, {k: v for k, v in obj.items() if k != "metadata"})
            else:
                name = self._changed_field(obj, old)
                if name is not None and name in obj:
                    _remember(self._prepared, memo_key, {"field": name, "value": obj[name]})

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
            errors.append(field_error(err, path))
        outcome.errors.extend(errors)
        if any(e.type in BLOCKING for e in outcome.errors):
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
            rule_children(self.root, obj, ABSENT if old is None else old, "", outcome)
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
            if key in ("metadata", "apiVersion", "kind") or obj.get(key, ABSENT) is old.get(key, ABSENT):
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
            new_self = cel_self if cel_self is not None else cel_root(obj)
            run_rules(lone, new_self, ABSENT if old is None else cel_root(old), "", outcome)

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
            yield path, GO_TYPES.get(want[0] if want else "", "string"), err.instance


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


def _unchanged(obj: Obj, old: Obj, path: Path, required: bool) -> bool:
    new_v, old_v = _at(obj, path), _at(old, path)
    return (
        new_v is not ABSENT and (new_v is old_v or cel.cel_equal(new_v, old_v))
        if not required
        else (new_v is not ABSENT and old_v is not ABSENT and cel.cel_equal(new_v, old_v))
    )


def _at(value: Any, path: Path) -> Any:
    for part in path:
        if isinstance(value, dict) and isinstance(part, str):
            value = value.get(part, ABSENT)
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        else:
            return ABSENT
        if value is ABSENT:
            return value
    return value
