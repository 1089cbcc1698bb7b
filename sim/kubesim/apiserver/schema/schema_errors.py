"""What a write's schema checks report, spelled as the apiserver spells it: the :class:`Outcome` of a
write (422 causes, pruned fields, ratcheting count), jsonschema-rs errors turned into go-openapi's field
errors, and the helpers that print paths, JSON types and values in those messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from kubesim.apiserver.schema.schema_node import Node, Path
from kubesim.apiserver.status import FieldError

# The Go type a typed decoder names when a JSON value has the wrong type.
GO_TYPES: Final = {
    "integer": "int32",
    "number": "float64",
    "string": "string",
    "boolean": "bool",
    "array": "[]string",
    "object": "struct",
}
# Schema errors that keep the CEL rules from running (apiextensions-apiserver hasBlockingErr).
BLOCKING: Final = frozenset({"Required", "NotSupported", "TypeInvalid", "TooLong", "TooMany"})


@dataclass(slots=True)
class Outcome:
    """What a write's checks found: errors (422 causes), pruned unknown fields (for warnings or 400)."""

    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    ratcheted: int = 0  # errors and rules skipped because the stored object had the same value


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


def type_of(node: Node, value: Any) -> str:
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


def field_error(err: Any, path: Path) -> FieldError:
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
