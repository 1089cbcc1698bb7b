"""Write handlers of the simulated apiserver: create, update, patch (JSON, merge, apply), delete and
deletecollection (docs/design/k8s-protocol.md §3).

It exists so what each write verb asks of the store, and which status code and body it answers with, sits in
one place apart from reads and routing; decoding the request and its error wording is
:mod:`kubesim.apiserver.http.decoding`'s, validation and the write rules are the store's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kubesim.apiserver.core import NAMESPACES
from kubesim.apiserver.http.decoding import (
    check_body_version,
    field_manager,
    patch_type,
    read_body,
    read_delete_options,
    read_patch,
    write_options,
)
from kubesim.apiserver.http.faults import RequestInfo
from kubesim.apiserver.http.list_options import parse_list_options
from kubesim.apiserver.http.negotiation import Representation
from kubesim.apiserver.http.responses import json_response, method_not_allowed, object_response
from kubesim.apiserver.schema.validation import WriteOptions
from kubesim.apiserver.status import FieldError, bad_request, invalid
from kubesim.apiserver.storage.store import Store


class WriteHandlers:
    """The write verbs against one store.

    ``auto_namespaces``: a write into a namespace that does not exist creates it first (see
    :class:`kubesim.apiserver.http.server.SimServer`).
    """

    def __init__(self, store: Store, *, auto_namespaces: bool) -> None:
        self.store = store
        self.auto_namespaces = auto_namespaces

    def _options(self, request: web.Request, *, apply: bool = False) -> WriteOptions:
        return write_options(request, auto_namespaces=self.auto_namespaces, apply=apply)

    async def create(
        self, request: web.Request, info: RequestInfo, rep: Representation
    ) -> web.StreamResponse:
        assert info.resource is not None
        schema = self.store.schema(info.resource)
        body = await read_body(request, schema)
        wopts = self._options(request)
        if (
            isinstance(body.get("metadata"), dict)
            and info.namespace
            and not body["metadata"].get("namespace")
        ):
            body["metadata"]["namespace"] = info.namespace
        check_body_version(info, schema, body)
        obj = self.store.create(
            info.resource, info.namespace, body, field_manager=field_manager(request), opts=wopts
        )
        return object_response(obj, 201, rep, wopts)

    async def bind(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        """POST pods/<name>/binding (what the scheduler sends): 201 and a Success Status."""
        assert info.resource is not None and info.namespace is not None and info.name is not None
        body = await read_body(request, self.store.schema(info.resource))
        self.store.bind_pod(info.namespace, info.name, body, field_manager=field_manager(request))
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        return json_response(success, 201)

    async def update(
        self, request: web.Request, info: RequestInfo, rep: Representation
    ) -> web.StreamResponse:
        assert info.resource is not None
        schema = self.store.schema(info.resource)
        body = await read_body(request, schema)
        wopts = self._options(request)
        meta = body.setdefault("metadata", {})
        if isinstance(meta, dict):
            if meta.get("name") and meta["name"] != info.name:
                raise bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the URL "
                    f"({info.name})"
                )
            meta["name"] = info.name
        check_body_version(info, schema, body)
        obj, created = self.store.update_or_create(
            info.resource,
            info.namespace,
            body,
            subresource=info.subresource,
            field_manager=field_manager(request),
            opts=wopts,
        )
        return object_response(obj, 201 if created else 200, rep, wopts)

    async def patch(self, request: web.Request, info: RequestInfo, rep: Representation) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        kind = patch_type(request.content_type, typed=self.store.schema(info.resource).typed)
        patch = await read_patch(request, kind)
        manager = field_manager(request)
        wopts = self._options(request, apply=kind == "apply")
        if kind == "apply":
            if not request.query.get("fieldManager"):
                raise invalid(
                    "PatchOptions",
                    "meta.k8s.io",
                    "",
                    [FieldError("fieldManager", "Required", "is required for apply patch")],
                )
            if not isinstance(patch, dict):
                raise bad_request("error decoding YAML: apply patch must be an object")
            obj, created = self.store.apply(
                info.resource,
                info.namespace,
                info.name,
                patch,
                field_manager=manager,
                subresource=info.subresource,
                opts=wopts,
            )
            return object_response(obj, 201 if created else 200, rep, wopts)
        obj = self.store.patch(
            info.resource,
            info.namespace,
            info.name,
            patch,
            subresource=info.subresource,
            patch_type=kind,
            field_manager=manager,
            opts=wopts,
        )
        return object_response(obj, 200, rep, wopts)

    async def delete(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        if info.subresource is not None:
            return method_not_allowed()
        options = await read_delete_options(request)
        wopts = self._options(request)
        if options.get("dryRun"):
            wopts.dry_run = True
        last = self.store.delete(
            info.resource, info.namespace, info.name, preconditions=options.get("preconditions"), opts=wopts
        )
        pending = bool(last["metadata"].get("deletionTimestamp")) and (
            bool(last["metadata"].get("finalizers")) or info.resource == NAMESPACES
        )
        if pending:
            # handlers/delete.go: 200 with the object; 202 only when orphanDependents=false was asked for.
            status = 202 if options.get("orphanDependents") is False else 200
            return json_response(last, status)
        if self.store.schema(info.resource).typed:
            # Built-in kinds answer a finished delete with a Success Status; custom resources with the object.
            res = info.resource
            details = {
                "name": info.name,
                "group": res.group,
                "kind": res.plural,
                "uid": last["metadata"]["uid"],
            }
            body: dict[str, Any] = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }
            return json_response(body)
        return json_response(last)

    async def delete_collection(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None
        options = await read_delete_options(request)
        wopts = self._options(request)
        if options.get("dryRun"):
            wopts.dry_run = True
        opts = parse_list_options(request.query)
        deleted = self.store.delete_collection(
            info.resource, info.namespace, predicate=opts.predicate, opts=wopts
        )
        schema = self.store.schema(info.resource)
        body = {
            "apiVersion": info.resource.api_version,
            "kind": schema.list_kind,
            "metadata": {"resourceVersion": str(self.store.resource_version)},
            "items": deleted,
        }
        return json_response(body)
