"""Per-kind write rules of the registry, as the apiserver's REST strategies apply them: what each served kind
is (list kind, status subresource, generation, defaults, validation), which metadata a client may set and
which the server owns, and when a write changes nothing (docs/design/k8s-protocol.md §0, §3).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from kubesim.apiserver import crds
from kubesim.apiserver.core import PRINTER_COLUMNS, SHORT_NAMES, STATUS_SUBRESOURCE
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.validation import KindValidator, builtin_validator
from kubesim.apiserver.status import bad_request
from kubesim.apiserver.storage.table import Obj

# Metadata a client may set; everything else in metadata is owned by the server.
USER_METADATA: Final = (
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
)
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet
_DEFAULT_COLUMNS: Final = ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)


@dataclass(frozen=True, slots=True)
class ResourceSchema:
    resource: ResourceKind
    api_version: str
    list_kind: str
    status_subresource: bool
    generation: bool
    defaults: crds.DefaultNode | None
    typed: bool  # built-in kind: list items omit apiVersion/kind
    validator: KindValidator | None  # None: writes of this kind are not validated (no schema known)
    openapi: dict[str, Any] | None = None  # the schema published in /openapi (the CRD's openAPIV3Schema)
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, Any], ...] = _DEFAULT_COLUMNS


# Keyed by the CRD object too (kept alive in the value, so its id is not reused): stores given other CRDs for
# the same resource get their own validator.
_VALIDATOR_CACHE: dict[tuple[ResourceKind, int], tuple[crds.CrdInfo | None, KindValidator | None]] = {}


def _validator(res: ResourceKind, info: crds.CrdInfo | None) -> KindValidator | None:
    """Compiled once per process: a CRD's schema takes tens of milliseconds to compile."""
    key = (res, id(info))
    if key not in _VALIDATOR_CACHE:
        if info is not None:
            _VALIDATOR_CACHE[key] = info, KindValidator(res, info.schema, typed=False)
        else:
            _VALIDATOR_CACHE[key] = None, builtin_validator(res)
    return _VALIDATOR_CACHE[key][1]


def resource_schemas(
    resources: Iterable[ResourceKind], registry: Mapping[tuple[str, str, str], crds.CrdInfo]
) -> dict[ResourceKind, ResourceSchema]:
    """Custom resources as the CRDs of ``registry`` declare them; any other kind is a built-in (typed, no
    generation)."""
    out = {}
    for res in resources:
        info = registry.get((res.group, res.version, res.plural))
        validator = _validator(res, info)
        if info is not None:
            out[res] = ResourceSchema(
                resource=res,
                api_version=res.api_version,
                list_kind=info.list_kind,
                status_subresource=info.status_subresource,
                generation=True,
                defaults=info.defaults,
                typed=False,
                validator=validator,
                openapi=info.schema,
                singular=info.singular,
                short_names=info.short_names,
                categories=info.categories,
                printer_columns=info.printer_columns or _DEFAULT_COLUMNS,
            )
        else:
            out[res] = ResourceSchema(
                resource=res,
                api_version=res.api_version,
                list_kind=res.list_kind,
                status_subresource=res in STATUS_SUBRESOURCE,
                generation=False,
                defaults=None,
                typed=True,
                validator=validator,
                openapi=validator.schema.raw if validator is not None else None,
                singular=res.kind.lower(),
                short_names=tuple(SHORT_NAMES.get(res, ())),
                printer_columns=tuple(PRINTER_COLUMNS.get(res, _DEFAULT_COLUMNS)),
            )
    return out


class _FromBody:
    pass


# ``assemble(status=FROM_BODY)``: the object's status is whatever the request body carries.
FROM_BODY: Any = _FromBody()


def assemble(schema: ResourceSchema, body: Obj, meta: Obj, *, status: Any, defaults: bool = True) -> Obj:
    """The object to store: server-set apiVersion/kind, ``meta``, the body's other fields, then ``status``
    (None: none, FROM_BODY: the body's), with the CRD's structural defaults applied (``defaults=False``:
    the validating path applied them already while decoding)."""
    new_obj: Obj = {"apiVersion": schema.api_version, "kind": schema.resource.kind, "metadata": meta}
    for k, v in body.items():
        if k not in ("apiVersion", "kind", "metadata", "status"):
            new_obj[k] = v
    if status is not FROM_BODY and status is not None:
        new_obj["status"] = status
    elif status is FROM_BODY and "status" in body:
        new_obj["status"] = body["status"]
    if defaults:
        crds.apply_defaults(schema.defaults, new_obj)
    return new_obj


def create_metadata(schema: ResourceSchema, namespace: str | None, name: str, meta: Obj, now: str) -> Obj:
    """Metadata of a new object: server-set fields first (the apiserver's key order), then the client's."""
    new_meta: Obj = {"name": name}
    if schema.resource.namespaced:
        new_meta["namespace"] = namespace
    new_meta["uid"] = new_uid()
    new_meta["resourceVersion"] = ""
    if schema.generation:
        new_meta["generation"] = 1
    new_meta["creationTimestamp"] = now
    for k in USER_METADATA[1:]:
        if k in meta and k != "namespace":
            new_meta[k] = meta[k]
    return new_meta


def update_metadata(stored: Obj, meta: Obj) -> Obj:
    """Metadata after an update: the stored server-owned fields, the request's client-owned ones."""
    new_meta = {k: v for k, v in stored.items() if k not in USER_METADATA or k in ("name", "namespace")}
    for k in USER_METADATA:
        if k in meta and k not in ("name", "namespace"):
            new_meta[k] = meta[k]
    return new_meta


def check_namespace(resource: ResourceKind, namespace: str | None, meta: Obj) -> str | None:
    """The object's namespace: the request's, else the body's; 400 when missing or they disagree."""
    if not resource.namespaced:
        meta.pop("namespace", None)
        return None
    namespace = namespace or meta.get("namespace")
    if not namespace:
        raise bad_request("the server could not find the requested resource")
    body_ns = meta.get("namespace")
    if body_ns and body_ns != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    return namespace


def generated_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))


def same_content(a: Obj, b: Obj) -> bool:
    """Equal but for resourceVersion and managedFields: the write is a no-op (no revision, no event)."""
    return _strip_volatile(a) == _strip_volatile(b)


def _strip_volatile(obj: Obj) -> Obj:
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return dict(obj, metadata=meta)


def spec_changed(new: Obj, old: Obj, status_subresource: bool) -> bool:
    """Anything outside metadata (and status, when it has its own subresource) changed: generation + 1."""
    skip = ("metadata", "status") if status_subresource else ("metadata",)
    keys = (set(new) | set(old)) - set(skip)
    return any(new.get(k) != old.get(k) for k in keys)


def own(obj: Obj) -> Obj:
    """A private deep copy; also rejects what JSON cannot carry."""
    try:
        result: Obj = orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise bad_request(f"object is not valid JSON: {exc}") from None
    if not isinstance(result, dict):
        raise bad_request("the body of the request must be a JSON object")
    return result


_last_second: list[Any] = [-1, ""]  # (epoch second, its RFC 3339 text): writes come thousands a second


def now_rfc3339() -> str:
    second = int(time.time())
    cached = _last_second
    if cached[0] != second:
        cached[1] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        cached[0] = second
    text: str = cached[1]
    return text


def new_uid() -> str:
    """str(uuid.uuid4()) at a third of its cost (random bits, version 4, RFC 4122 variant)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


_VARIANT: Final = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
