"""Response encoding of the simulated apiserver: how a Status, an object or a fault becomes an HTTP response.

It exists so the read, write and routing modules build responses the same way: JSON bodies by orjson,
objects in the representation the client negotiated (JSON, YAML, Table, PartialObjectMetadata), write
warnings as ``Warning: 299 - "..."`` headers, and the headers the apiserver's filters add to every answer.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import orjson
import yaml
from aiohttp import web

from kubesim.apiserver.http.faults import FaultResponse
from kubesim.apiserver.http.negotiation import Representation
from kubesim.apiserver.http.printers import partial_metadata, table
from kubesim.apiserver.schema.validation import WriteOptions
from kubesim.apiserver.status import StoreError, resource_not_found, status_body
from kubesim.apiserver.storage.strategy import ResourceSchema

JSON_TYPE: Final = "application/json"


def error_response(err: StoreError) -> web.Response:
    return web.Response(
        body=orjson.dumps(err.status), status=err.code, content_type=JSON_TYPE, headers=err.headers
    )


def fault_response(fault: FaultResponse) -> web.Response:
    resp = web.Response(body=fault.body, status=fault.status, headers=fault.headers)
    resp.headers["Content-Type"] = fault.content_type
    return resp


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=JSON_TYPE)


def not_found_response() -> web.Response:
    return error_response(resource_not_found())


def method_not_allowed() -> web.Response:
    body = status_body(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )
    return json_response(body, 405)


def object_response(
    obj: Any,
    status: int,
    rep: Representation,
    wopts: WriteOptions | None,
    *,
    schema: ResourceSchema | None = None,
    include: str = "Metadata",
) -> web.Response:
    """One object as negotiated; a Table needs the kind's ``schema`` (its printer columns), so without one
    the object goes out as JSON, as it did for writes, which never answer with a Table."""
    if rep.form == "yaml":
        resp = web.Response(
            body=yaml.safe_dump(obj, sort_keys=False).encode(),
            status=status,
            content_type="application/yaml",
        )
    elif rep.form == "table" and schema is not None:
        meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
        resp = json_response(table(schema, [obj], meta, include=include, api_version=rep.api_version), status)
    elif rep.form == "partial":
        resp = json_response(partial_metadata(obj, rep.api_version), status)
    else:
        resp = json_response(obj, status)
    if wopts is not None and wopts.warnings:
        for text in wopts.warnings:
            resp.headers.add("Warning", f"299 - {orjson.dumps(text).decode()}")
    return resp


async def api_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The apiserver's filters: an Audit-Id for every request, and API responses are never cached."""
    response.headers.setdefault("Audit-Id", str(uuid.uuid4()))
    response.headers.setdefault("Cache-Control", "no-cache, private")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
