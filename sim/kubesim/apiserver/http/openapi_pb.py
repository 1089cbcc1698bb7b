"""The OpenAPI v2 document as protobuf (gnostic ``openapi_v2.Document``), for kubectl <= 1.26, which accepts
nothing else for /openapi/v2.

It exists apart from :mod:`kubesim.apiserver.http.openapi` (which builds the documents as JSON values) because
it is a wire encoder: a hand-written protobuf writer for the few gnostic messages kubectl reads (Document,
Schema, Operation, Parameter), so no protobuf runtime or generated code is needed for one document built once.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

Doc = dict[str, Any]


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    return _varint(num << 3 | wire) + payload


def _str(num: int, value: str) -> bytes:
    raw = value.encode()
    return _field(num, 2, _varint(len(raw)) + raw)


def _msg(num: int, payload: bytes) -> bytes:
    return _field(num, 2, _varint(len(payload)) + payload)


def _bool(num: int, value: bool) -> bytes:
    return _field(num, 0, _varint(int(value))) if value else b""


def _int(num: int, value: int) -> bytes:
    return _field(num, 0, _varint(int(value)))


def _double(num: int, value: float) -> bytes:
    return _field(num, 1, struct.pack("<d", float(value)))


def _any(num: int, value: Any) -> bytes:
    """openapi_v2.Any: the value as YAML (JSON is YAML)."""
    return _msg(num, _str(2, orjson.dumps(value).decode()))


def _named_any(num: int, name: str, value: Any) -> bytes:
    return _msg(num, _str(1, name) + _any(2, value))


def _schema(s: Doc) -> bytes:
    out = b""
    simple_str = {"$ref": 1, "format": 2, "title": 3, "description": 4, "pattern": 13, "discriminator": 26}
    for key, num in simple_str.items():
        if isinstance(s.get(key), str):
            out += _str(num, s[key])
    if "default" in s:
        out += _any(5, s["default"])
    for key, num in (("multipleOf", 6), ("maximum", 7), ("minimum", 9)):
        if isinstance(s.get(key), int | float):
            out += _double(num, s[key])
    out += _bool(8, bool(s.get("exclusiveMaximum"))) + _bool(10, bool(s.get("exclusiveMinimum")))
    ints = {
        "maxLength": 11,
        "minLength": 12,
        "maxItems": 14,
        "minItems": 15,
        "maxProperties": 17,
        "minProperties": 18,
    }
    for key, num in ints.items():
        if isinstance(s.get(key), int):
            out += _int(num, s[key])
    out += _bool(16, bool(s.get("uniqueItems")))
    for req in s.get("required") or ():
        out += _str(19, req)
    for item in s.get("enum") or ():
        out += _any(20, item)
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        out += _msg(21, _msg(1, _schema(extra)))
    elif isinstance(extra, bool):
        out += _msg(21, _field(2, 0, _varint(int(extra))))
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        out += _msg(22, b"".join(_str(1, t) for t in types))
    if isinstance(s.get("items"), dict):
        out += _msg(23, _msg(1, _schema(s["items"])))
    for sub in s.get("allOf") or ():
        out += _msg(24, _schema(sub))
    if isinstance(s.get("properties"), dict):
        named = b"".join(_msg(1, _str(1, k) + _msg(2, _schema(v))) for k, v in s["properties"].items())
        out += _msg(25, named)
    for key, value in s.items():
        if key.startswith("x-"):
            out += _named_any(31, key, value)
    return out


def _parameter(p: Doc) -> bytes:
    if p.get("in") == "body":
        body = (
            _str(2, p["name"])
            + _str(3, "body")
            + _bool(4, bool(p.get("required")))
            + _msg(5, _schema(p["schema"]))
        )
        return _msg(1, _msg(1, body))
    sub = (
        _bool(1, bool(p.get("required")))
        + _str(2, p["in"])
        + _str(4, p["name"])
        + _str(6, p.get("type", "string"))
    )
    sub += _bool(20, bool(p.get("uniqueItems")))
    which = {"query": 3, "path": 4, "header": 1}.get(p["in"], 3)
    return _msg(1, _msg(2, _msg(which, sub)))


def _operation_pb(op: Doc) -> bytes:
    out = b"".join(_str(1, t) for t in op.get("tags") or ())
    out += _str(5, op["operationId"])
    for p in op.get("parameters") or ():
        out += _msg(8, _parameter(p))
    responses = b""
    for code, resp in (op.get("responses") or {}).items():
        inner = _str(1, resp.get("description", ""))
        if "schema" in resp:
            inner += _msg(2, _msg(1, _schema(resp["schema"])))
        responses += _msg(1, _str(1, code) + _msg(2, _msg(1, inner)))
    out += _msg(9, responses)
    for key, value in op.items():
        if key.startswith("x-"):
            out += _named_any(13, key, value)
    return out


def v2_protobuf(doc: Doc) -> bytes:
    out = _str(1, doc["swagger"]) + _msg(2, _str(1, doc["info"]["title"]) + _str(2, doc["info"]["version"]))
    methods = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}
    paths = b""
    for path, item in doc["paths"].items():
        body = b"".join(_msg(num, _operation_pb(item[m])) for m, num in methods.items() if m in item)
        paths += _msg(2, _str(1, path) + _msg(2, body))
    out += _msg(8, paths)
    defs = b"".join(_msg(1, _str(1, k) + _msg(2, _schema(v))) for k, v in doc["definitions"].items())
    return out + _msg(9, defs)
