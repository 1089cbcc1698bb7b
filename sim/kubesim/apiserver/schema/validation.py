"""Write validation per kind, as the apiserver runs it (docs/design/k8s-protocol.md §3): decoding (typed
kinds: JSON type errors are 400; unknown fields are pruned with a warning, or 400 under
fieldValidation=Strict), TypeMeta, ObjectMeta (names, labels, annotations, finalizers), the kind's schema
and CEL rules (422 Invalid with one cause per field, shaped like the apiserver's), and the typed kinds' own
rules.

Only writes that ask for it are validated: every HTTP write, and the workload generator's. Python callers of
:class:`kubesim.apiserver.storage.store.Store` that pass no options write objects as given (with server-set
metadata), like objects already in etcd that today's schema would reject: the service must survive those too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson

from kubesim.apiserver.core import BUILTIN_SCHEMAS, EVENTS, GO_STRUCTS, LEASES, NAMESPACES
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.schema import Outcome, StructuralSchema, field_path, go_value, json_type
from kubesim.apiserver.status import FieldError, StoreError, bad_request, invalid

Obj = dict[str, Any]
FieldValidation = Literal["Ignore", "Warn", "Strict"]

DNS1123_LABEL_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME_RE: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE_RE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_MICRO_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})\Z")
_MICRO_LAYOUT: Final = "2006-01-02T15:04:05.000000Z07:00"
TOTAL_ANNOTATION_BYTES: Final = 256 * 1024

DNS1123_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1123_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_QUALIFIED_NAME_MSG: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
    "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


@dataclass(slots=True)
class WriteOptions:
    """How a write is checked and whether it is kept: what the HTTP layer (or the generator) asks for."""

    validate: bool = True
    field_validation: FieldValidation = "Warn"
    dry_run: bool = False
    require_namespace: bool = True  # False: a missing namespace is created first (trusted callers)
    force: bool = False  # server-side apply: take over conflicting fields
    warnings: list[str] | None = None  # Warning headers for the response

    def warn(self, text: str) -> None:
        if self.warnings is not None and text not in self.warnings:
            self.warnings.append(text)


# -- names and metadata ------------------------------------------------------------------------------------
def name_errors(name: str, fld: str, *, label: bool, prefix: bool = False) -> list[FieldError]:
    """IsDNS1123Subdomain / IsDNS1123Label (a generateName prefix may end in '-')."""
    check = name[:-1] if prefix and name.endswith("-") else name
    errs: list[FieldError] = []
    limit, regex, msg = (
        (63, DNS1123_LABEL_RE, DNS1123_LABEL_MSG)
        if label
        else (
            253,
            DNS1123_SUBDOMAIN_RE,
            DNS1123_SUBDOMAIN_MSG,
        )
    )
    if len(check) > limit:
        errs.append(FieldError(fld, "Invalid", f"must be no more than {limit} characters", go_value(name)))
    if not regex.match(check):
        errs.append(FieldError(fld, "Invalid", msg, go_value(name)))
    return errs


def _qualified_name_errors(key: str, fld: str) -> list[FieldError]:
    prefix, sep, name = key.rpartition("/")
    errs: list[FieldError] = []
    if sep:
        if not prefix:
            errs.append(FieldError(fld, "Invalid", "prefix part must be non-empty", go_value(key)))
        elif len(prefix) > 253 or not DNS1123_SUBDOMAIN_RE.match(prefix):
            errs.append(FieldError(fld, "Invalid", "prefix part " + DNS1123_SUBDOMAIN_MSG, go_value(key)))
    if not name:
        errs.append(FieldError(fld, "Invalid", "name part must be non-empty", go_value(key)))
    elif len(name) > 63:
        errs.append(FieldError(fld, "Invalid", "name part must be no more than 63 characters", go_value(key)))
    elif not _QUALIFIED_NAME_RE.match(name):
        errs.append(FieldError(fld, "Invalid", _QUALIFIED_NAME_MSG, go_value(key)))
    return errs


def object_meta_errors(meta: Obj, *, namespaced: bool, label_name: bool) -> list[FieldError]:
    """ValidateObjectMeta: name (or generateName), labels, annotations, finalizers, ownerReferences."""
    errs: list[FieldError] = []
    name = meta.get("name") or ""
    if name:
        errs += name_errors(name, "metadata.name", label=label_name)
    elif meta.get("generateName"):
        errs += name_errors(meta["generateName"], "metadata.generateName", label=label_name, prefix=True)
    for key, value in (meta.get("labels") or {}).items():
        errs += _qualified_name_errors(key, "metadata.labels")
        if len(value) > 63:
            errs.append(
                FieldError(
                    "metadata.labels", "Invalid", "must be no more than 63 characters", go_value(value)
                )
            )
        elif not _LABEL_VALUE_RE.match(value):
            errs.append(FieldError("metadata.labels", "Invalid", _LABEL_VALUE_MSG, go_value(value)))
    annotations = meta.get("annotations") or {}
    total = 0
    for key, value in annotations.items():
        errs += _qualified_name_errors(key.lower(), "metadata.annotations")
        total += len(key) + len(value)
    if total > TOTAL_ANNOTATION_BYTES:
        errs.append(
            FieldError(
                "metadata.annotations", "TooLong", f"may not be more than {TOTAL_ANNOTATION_BYTES} bytes"
            )
        )
    for i, fin in enumerate(meta.get("finalizers") or ()):
        errs += _qualified_name_errors(fin, f"metadata.finalizers[{i}]")
    for i, ref in enumerate(meta.get("ownerReferences") or ()):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errs.append(
                    FieldError(
                        f"metadata.ownerReferences[{i}].{key}", "Invalid", f"{key} must not be empty", '""'
                    )
                )
    return errs


_META_TYPES: Final = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "uid": str,
    "resourceVersion": str,
    "labels": dict,
    "annotations": dict,
    "finalizers": list,
    "ownerReferences": list,
}


def _meta_decode_error(meta: Any) -> str | None:
    """ObjectMeta is a Go struct even in custom resources: what json.Unmarshal would refuse."""
    prefix = "json: cannot unmarshal"
    if not isinstance(meta, dict):
        return f"{prefix} {_go_json_kind(meta)} into Go struct field .metadata of type v1.ObjectMeta"
    for key, want in _META_TYPES.items():
        value = meta.get(key)
        if value is None:
            continue
        field = f"Go struct field ObjectMeta.metadata.{key}"
        if not isinstance(value, want):
            gotype = {str: "string", dict: "map[string]string", list: "[]string"}[want]
            return f"{prefix} {_go_json_kind(value)} into {field} of type {gotype}"
        if want is dict:
            for item in value.values():
                if not isinstance(item, str):
                    return f"{prefix} {_go_json_kind(item)} into {field} of type string"
        if key == "finalizers" and not all(isinstance(f, str) for f in value):
            return f"{prefix} object into {field} of type string"
        if key == "ownerReferences" and not all(isinstance(r, dict) for r in value):
            return f"{prefix} array into {field} of type v1.OwnerReference"
    return None


def _go_json_kind(value: Any) -> str:
    return {"integer": "number", "boolean": "bool", "null": "null"}.get(json_type(value), json_type(value))


# -- per kind ------------------------------------------------------------------------------------------
class KindValidator:
    """Everything a validated write of one kind goes through (see the module docstring)."""

    def __init__(
        self,
        resource: ResourceKind,
        schema: dict[str, Any],
        *,
        typed: bool,
        extra: Callable[[Obj], list[FieldError]] | None = None,
        times: Callable[[Obj, str], None] | None = None,
    ) -> None:
        self.resource = resource
        self.schema = StructuralSchema(schema)
        self.typed = typed
        self.extra = extra
        self.times = times
        self.label_names = resource == NAMESPACES

    def cannot_handle(self, detail: str) -> StoreError:
        r = self.resource
        return bad_request(f'{r.kind} in version "{r.version}" cannot be handled as a {r.kind}: {detail}')

    def check_type_meta(self, body: Obj) -> None:
        """A body of another kind or version: 422 for custom resources (customResourceValidator), 400 for
        built-in kinds (the decoder finds no such kind in that version)."""
        r = self.resource
        kind, api_version = body.get("kind"), body.get("apiVersion")
        errs: list[FieldError] = []
        if kind not in (None, "", r.kind):
            if self.typed:
                raise bad_request(f'no kind "{kind}" is registered for version "{r.api_version}" in scheme')
            errs.append(FieldError("kind", "Invalid", f"must be {r.kind}", go_value(kind)))
        if api_version not in (None, "", r.api_version):
            errs.append(
                FieldError("apiVersion", "Invalid", f"must be {r.api_version}", go_value(api_version))
            )
        if errs:
            raise invalid(r.kind, r.group, str((body.get("metadata") or {}).get("name") or ""), errs)

    def decode(self, obj: Obj, old: Obj | None, opts: WriteOptions) -> None:
        """Decoding into the kind: metadata types, pruning (unknown fields: 400 under Strict, else a
        warning), nulls, defaults; built-in kinds also refuse wrong JSON types and bad times (400)."""
        meta = obj.get("metadata", {})
        if old is None or meta is not old.get("metadata"):  # a status write keeps the stored metadata
            problem = _meta_decode_error(meta)
            if problem is not None:
                raise self.cannot_handle(problem)
        outcome = Outcome()
        self.schema.prepare(obj, old, outcome)
        if outcome.unknown and opts.field_validation != "Ignore":
            if opts.field_validation == "Strict":
                listed = ", ".join(f'unknown field "{u}"' for u in outcome.unknown)
                raise self.cannot_handle(f"strict decoding error: {listed}")
            for u in outcome.unknown:
                opts.warn(f'unknown field "{u}"')
        if self.typed:
            self._typed_decode(obj, old)
        if outcome.errors:  # duplicates in list-type map/set: found while walking, reported as Invalid
            self._raise(obj, outcome.errors)

    def _typed_decode(self, obj: Obj, old: Obj | None) -> None:
        for err in self.schema.type_errors(obj, old):
            path, want, value = err
            struct = (
                GO_STRUCTS.get(f"{self.resource.kind}.{path[0]}", self.resource.kind)
                if path
                else self.resource.kind
            )
            raise self.cannot_handle(
                f"json: cannot unmarshal {_go_json_kind(value)} into Go struct field "
                f"{struct}.{field_path(path)} of type {want}"
            )
        if self.times is not None:
            self.times(obj, self.resource.kind)

    def validate(self, obj: Obj, old: Obj | None) -> None:
        """ObjectMeta, schema, CEL and the kind's own rules: 422 Invalid with every error as a cause."""
        meta = obj["metadata"]
        errs: list[FieldError] = []
        if old is None or not _same_user_meta(meta, old["metadata"]):
            # Unchanged metadata was valid when it was stored (a status write never changes it).
            errs = object_meta_errors(meta, namespaced=self.resource.namespaced, label_name=self.label_names)
        outcome = Outcome(errors=errs)
        self.schema.validate(obj, old, outcome)
        if self.extra is not None:
            outcome.errors.extend(self.extra(obj))
        if outcome.errors:
            self._raise(obj, outcome.errors)

    def _raise(self, obj: Obj, errors: list[FieldError]) -> None:
        r = self.resource
        name = str((obj.get("metadata") or {}).get("name") or "")
        raise invalid(r.kind, r.group, name, errors)


def _same_user_meta(meta: Obj, old: Obj) -> bool:
    if meta is old:
        return True
    return all(
        meta.get(k) == old.get(k)
        for k in ("name", "generateName", "labels", "annotations", "finalizers", "ownerReferences")
    )


# -- the built-in kinds' own rules ---------------------------------------------------------------------------
def _lease_rules(obj: Obj) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errs: list[FieldError] = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        errs.append(
            FieldError("spec.leaseDurationSeconds", "Invalid", "must be greater than 0", str(duration))
        )
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        errs.append(
            FieldError(
                "spec.leaseTransitions", "Invalid", "must be greater than or equal to 0", str(transitions)
            )
        )
    if spec.get("preferredHolder") and not spec.get("strategy"):
        errs.append(
            FieldError("spec.preferredHolder", "Forbidden", "may only be specified if `strategy` is defined")
        )
    return errs


def _micro_times(obj: Obj, kind: str, fields: tuple[str, ...], where: str) -> None:
    holder = obj.get(where) if where else obj
    if not isinstance(holder, dict):
        return
    for fld in fields:
        value = holder.get(fld)
        if value is None:
            continue
        if not _MICRO_RE.match(value):
            raise bad_request(
                f'{kind} in version "v1" cannot be handled as a {kind}: parsing time "{value}" as '
                f'"{_MICRO_LAYOUT}": cannot parse "{value}" as "{_MICRO_LAYOUT}"'
            )
        holder[fld] = normalize_micro(value)


def normalize_micro(value: str) -> str:
    """metav1.MicroTime as the apiserver serializes it: UTC, six fractional digits, "Z"."""
    if value.endswith("Z"):
        return value
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def normalize_time(kind: str, value: str) -> str:
    """metav1.Time: RFC 3339 in, UTC with second precision out."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise bad_request(
            f'{kind} in version "v1" cannot be handled as a {kind}: parsing time "{value}" as '
            f'"2006-01-02T15:04:05Z07:00": cannot parse "{value}" as "2006-01-02T15:04:05Z07:00"'
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _lease_times(obj: Obj, kind: str) -> None:
    _micro_times(obj, kind, ("acquireTime", "renewTime"), "spec")


def _event_times(obj: Obj, kind: str) -> None:
    _micro_times(obj, kind, ("eventTime",), "")
    for fld in ("firstTimestamp", "lastTimestamp"):
        if isinstance(obj.get(fld), str):
            obj[fld] = normalize_time(kind, obj[fld])


def builtin_validator(resource: ResourceKind) -> KindValidator | None:
    schema = BUILTIN_SCHEMAS.get(resource)
    if schema is None:
        return None
    if resource == LEASES:
        return KindValidator(resource, schema, typed=True, extra=_lease_rules, times=_lease_times)
    if resource == EVENTS:
        return KindValidator(resource, schema, typed=True, times=_event_times)
    return KindValidator(resource, schema, typed=True)


def serializable(obj: Obj, kind: str) -> bytes:
    """The stored form must serialize: refuse, before anything is stored, what would break every later LIST
    (orjson nests at most 254 levels; the schemas keep real objects far below that)."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError as exc:
        raise bad_request(f"{kind} cannot be stored: {exc}") from None
