"""Server-side printing: ``Table`` (meta.k8s.io/v1) for ``kubectl get`` and ``PartialObjectMetadata`` for
metadata-only clients, as the apiserver builds them.

Columns: Name, then the CRD's ``additionalPrinterColumns`` (Name and Age when it declares none), or the
built-in kind's columns (kubesim.apiserver.core). Cells follow apiextensions-apiserver's tableconvertor: a
``date`` column shows the age ("5m", "2d3h"), a missing value is null. Printer-column paths are simple
JSONPath: fields, ``[n]``, ``[a:b]`` slices (``[-1:]``), ``[*]`` and ``[?(@.key=="value")]`` filters.
"""

from __future__ import annotations

import re
import time
from calendar import timegm
from typing import Any, Final

from kubesim.apiserver.storage.strategy import ResourceSchema
from kubesim.apiserver.storage.table import Obj

TABLE_API_VERSION: Final = "meta.k8s.io/v1"
NAME_COLUMN: Final = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name automatically. Name "
    "is primarily intended for creation idempotence and configuration definition. Cannot be updated. More "
    "info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    "priority": 0,
}
_STEP_RE: Final = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_-]+)
      | \[(?P<slice>-?\d*:-?\d*)\]
      | \[(?P<index>-?\d+)\]
      | \[(?P<star>\*)\]
      | \[\?\(@\.(?P<fkey>[A-Za-z0-9_.-]+)\s*==\s*["'](?P<fval>[^"']*)["']\)\]""",
    re.VERBOSE,
)


def column_definitions(schema: ResourceSchema) -> list[dict[str, Any]]:
    out = [NAME_COLUMN]
    for col in schema.printer_columns:
        out.append(
            {
                "name": col["name"],
                "type": col.get("type", "string"),
                "format": col.get("format", ""),
                "description": col.get("description", ""),
                "priority": int(col.get("priority", 0)),
            }
        )
    return out


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Every value ``path`` selects in ``obj`` (a subset of kubectl's JSONPath, see the module docstring)."""
    values = [obj]
    pos = 0
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    while pos < len(path):
        m = _STEP_RE.match(path, pos)
        if m is None:
            return []
        pos = m.end()
        nxt: list[Any] = []
        for v in values:
            if m.group("field") is not None:
                if isinstance(v, dict) and m.group("field") in v:
                    nxt.append(v[m.group("field")])
            elif not isinstance(v, list):
                continue
            elif m.group("slice") is not None:
                lo, _, hi = m.group("slice").partition(":")
                nxt.extend(v[int(lo) if lo else None : int(hi) if hi else None])
            elif m.group("index") is not None:
                i = int(m.group("index"))
                if -len(v) <= i < len(v):
                    nxt.append(v[i])
            elif m.group("star") is not None:
                nxt.extend(v)
            else:
                key, want = m.group("fkey"), m.group("fval")
                nxt.extend(x for x in v if isinstance(x, dict) and str(_dig(x, key)) == want)
        values = nxt
    return values


def _dig(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age(value: Any) -> Any:
    if not isinstance(value, str):
        return None
    try:
        stamp = timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return "<invalid>"
    return human_duration(time.time() - stamp)


def _cell(col: dict[str, Any], obj: Obj) -> Any:
    found = jsonpath(obj, col.get("jsonPath", ""))
    if not found or found[0] is None:
        return None
    value = found[0]
    kind = col.get("type", "string")
    if kind == "date":
        return _age(value)
    if kind == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    import orjson

    return orjson.dumps(value).decode()


def partial_metadata(obj: Obj, api_version: str = TABLE_API_VERSION) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": obj.get("metadata", {})}


def table_row(schema: ResourceSchema, obj: Obj, include: str) -> Obj:
    cells: list[Any] = [obj.get("metadata", {}).get("name", "")]
    cells += [_cell(col, obj) for col in schema.printer_columns]
    row: Obj = {"cells": cells}
    if include == "Object":
        row["object"] = obj
    elif include != "None":
        row["object"] = partial_metadata(obj)
    return row


def table(
    schema: ResourceSchema,
    objs: list[Obj],
    meta: Obj,
    *,
    include: str = "Metadata",
    headers: bool = True,
    api_version: str = TABLE_API_VERSION,
) -> Obj:
    out: Obj = {"kind": "Table", "apiVersion": api_version, "metadata": meta}
    out["columnDefinitions"] = column_definitions(schema) if headers else []
    out["rows"] = [table_row(schema, o, include) for o in objs]
    return out


def partial_list(objs: list[Obj], meta: Obj, api_version: str = TABLE_API_VERSION) -> Obj:
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": api_version,
        "metadata": meta,
        "items": [partial_metadata(o, api_version) for o in objs],
    }
