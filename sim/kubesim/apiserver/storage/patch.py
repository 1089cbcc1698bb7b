"""PATCH bodies: JSON merge patch (RFC 7386, also standing in for server-side apply) and JSON patch
(RFC 6902), with the apiserver's errors for bodies of the wrong shape (docs/design/k8s-protocol.md §3).
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from kubesim.apiserver.status import StoreError, bad_request
from kubesim.apiserver.storage.table import Obj

# Patch types that merge into the target without mutating it (json_patch works in place).
MERGING: Final = frozenset({"merge", "apply"})


def apply_patch(target: Obj, patch: Any, patch_type: str) -> Obj:
    """``target`` patched: a new object for merging types, ``target`` itself changed for "json"."""
    if patch_type in MERGING:
        if not isinstance(patch, dict):
            raise bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
        patched = merge_patch(target, patch)
    elif patch_type == "json":
        if not isinstance(patch, list):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        patched = json_patch(target, patch)
    else:
        raise StoreError.make(415, "UnsupportedMediaType", f"unsupported patch type {patch_type!r}")
    if not isinstance(patched, dict):
        raise bad_request("patch did not produce an object")
    return patched


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch. Copies the maps along the patch's paths; never mutates ``target``."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test), applied to ``doc`` in place."""
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        kind, parts = op["op"], _pointer(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise _patch_error(f"{kind} operation missing value")
        if kind == "test":
            if _walk(doc, parts) != op["value"]:
                raise _patch_error(f"testing value {op['path']} failed")
            continue
        if kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = orjson.loads(orjson.dumps(_walk(doc, src)))
            if kind == "move":
                doc = _remove(doc, src)
            doc = _add(doc, parts, value)
        elif kind == "add":
            doc = _add(doc, parts, op["value"])
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            doc = _add(_remove(doc, parts), parts, op["value"]) if parts else op["value"]
        else:
            raise _patch_error(f"unexpected operation {kind!r}")
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise _patch_error(f"missing path segment {part!r}")
            doc = doc[part]
        elif isinstance(doc, list):
            doc = doc[_index(doc, part, allow_end=False)]
        else:
            raise _patch_error(f"cannot traverse into {part!r}")
    return doc


def _index(seq: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(seq)
    if not part.isdigit():
        raise _patch_error(f"invalid array index {part!r}")
    i = int(part)
    if i > len(seq) or (i == len(seq) and not allow_end):
        raise _patch_error(f"array index {i} out of bounds")
    return i


def _patch_error(msg: str) -> StoreError:
    return StoreError.make(
        422, "Invalid", f"the server rejected our request due to an error in our request: {msg}"
    )


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise _patch_error(f"cannot add at {last!r}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return None
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _patch_error(f"missing path segment {last!r}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, allow_end=False)]
    else:
        raise _patch_error(f"cannot remove at {last!r}")
    return doc
