"""Request decoding for writes: what a write request carries (body, patch, DeleteOptions, query options,
field manager), decoded and checked with the apiserver's wording.

It exists apart from the write handlers because clients match these error messages (encoding/json's
"invalid character ...", the decoder's apiVersion/kind checks, 422 on unknown option values), so their
exact wording lives in one place; the handlers only decide what the store does with the decoded input.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
import yaml
from aiohttp import web

from kubesim.apiserver.http import protobuf
from kubesim.apiserver.http.faults import RequestInfo
from kubesim.apiserver.http.list_options import parse_bool
from kubesim.apiserver.http.negotiation import body_format
from kubesim.apiserver.schema.validation import FieldValidation, WriteOptions
from kubesim.apiserver.status import FieldError, StoreError, bad_request, invalid
from kubesim.apiserver.storage.strategy import ResourceSchema

PATCH_TYPES: Final = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply-cbor",
    "application/strategic-merge-patch+json": "strategic",
}
_FIELD_VALIDATION: Final = ("Ignore", "Warn", "Strict")


def go_json_error(raw: bytes, exc: Exception) -> str:
    """encoding/json's wording for a body that is not JSON ("invalid character 'x' looking for ...")."""
    pos = getattr(exc, "pos", 0) or 0
    text = raw.decode("utf-8", "replace")
    if pos >= len(text.rstrip()):
        return "unexpected end of JSON input"
    return f"invalid character {text[pos]!r} looking for beginning of value"


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "null" if value is None else "object"


def field_manager(request: web.Request) -> str:
    """fieldManager, else the User-Agent up to its first "/", as the apiserver derives it."""
    manager = request.query.get("fieldManager")
    if manager:
        return manager
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0] or "unknown"


def write_options(request: web.Request, *, auto_namespaces: bool, apply: bool = False) -> WriteOptions:
    """dryRun, fieldValidation and force as the apiserver validates them (422 on unknown values)."""
    query = request.query
    errors: list[FieldError] = []
    dry = query.getall("dryRun", [])
    for value in dry:
        if value != "All":
            errors.append(FieldError("dryRun", "NotSupported", 'supported values: "All"', f'"{value}"'))
    validation = query.get("fieldValidation") or "Warn"
    if validation not in _FIELD_VALIDATION:
        errors.append(
            FieldError(
                "fieldValidation",
                "NotSupported",
                'supported values: "Ignore", "Strict", "Warn"',
                f'"{validation}"',
            )
        )
    force = query.get("force")
    if force is not None and not apply:
        errors.append(FieldError("force", "Forbidden", "may not be specified for non-apply patch"))
    manager = query.get("fieldManager")
    if manager is not None and len(manager) > 128:
        errors.append(FieldError("fieldManager", "TooLong", "may not be more than 128 bytes"))
    if errors:
        kind = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions"}.get(
            request.method, "DeleteOptions"
        )
        raise invalid(kind, "meta.k8s.io", "", errors)
    field_validation: FieldValidation = validation  # type: ignore[assignment]
    return WriteOptions(
        validate=True,
        field_validation=field_validation,
        dry_run=bool(dry),
        require_namespace=not auto_namespaces,
        force=parse_bool(force),
        warnings=[],
    )


def check_body_version(info: RequestInfo, schema: ResourceSchema, body: dict[str, Any]) -> None:
    """The decoder's checks: custom resources need a kind; apiVersion must be the URL's."""
    assert info.resource is not None
    res = info.resource
    api_version = body.get("apiVersion")
    if not body.get("kind") and not schema.typed:
        raise bad_request(f"Object 'Kind' is missing in '{orjson.dumps(body).decode()}'")
    if api_version and api_version != res.api_version:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({res.api_version})"
        )
    if not api_version and not schema.typed:
        raise bad_request(
            f"the API version in the data () does not match the expected API version ({res.api_version})"
        )


async def read_body(request: web.Request, schema: ResourceSchema) -> dict[str, Any]:
    """A create or update body in JSON, YAML or (built-in kinds) protobuf; 400 unless it is an object."""
    raw = await request.read()
    fmt = body_format(request.headers.get("Content-Type", ""), typed=schema.typed)
    if fmt == "protobuf":
        return protobuf.decode(raw)
    try:
        body = yaml.safe_load(raw) if fmt == "yaml" else orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"couldn't get version/kind; json parse error: {go_json_error(raw, exc)}") from None
    except yaml.YAMLError as exc:
        raise bad_request(f"error converting YAML to JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(
            "couldn't get version/kind; json parse error: json: cannot unmarshal "
            f"{_json_kind(body)} into Go value of type struct {{ APIVersion string "
            '"json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }'
        )
    return body


def patch_type(content_type: str, *, typed: bool) -> str:
    """The patch type of a PATCH's Content-Type; 415 for one the server does not accept."""
    kind = PATCH_TYPES.get(content_type)
    if kind == "strategic" and typed:
        # The built-in kinds served here have no lists with a patch merge key outside metadata, so a
        # strategic merge patch merges like a JSON merge patch (directives are not supported).
        kind = "merge"
    if kind not in ("merge", "json", "apply"):
        accepted = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        if typed:
            accepted += ", application/strategic-merge-patch+json"
        raise StoreError.make(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: " + accepted,
        )
    return kind


async def read_patch(request: web.Request, kind: str) -> Any:
    """The patch document: YAML for apply (JSON is YAML), JSON otherwise."""
    raw = await request.read()
    try:
        return yaml.safe_load(raw) if kind == "apply" else orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"error decoding patch: {go_json_error(raw, exc)}") from None
    except yaml.YAMLError as exc:
        raise bad_request(f"error converting YAML to JSON: {exc}") from None


async def read_delete_options(request: web.Request) -> dict[str, Any]:
    """DeleteOptions from the body; an empty body or a non-object means none."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        options = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"couldn't get version/kind; json parse error: {go_json_error(raw, exc)}") from None
    return options if isinstance(options, dict) else {}
