"""HTTP face of the simulated cluster: routing and the request handlers for reads, LISTs and writes
(aiohttp.web; docs/design/k8s-protocol.md §1-§3). WATCH streams are served by :mod:`app.sim.watch`,
discovery documents come from :mod:`app.sim.discovery`, OpenAPI from :mod:`app.sim.openapi`.

Every API response carries ``Audit-Id`` and ``Cache-Control: no-cache, private`` like the apiserver's;
writes are validated (:mod:`app.sim.validation`) and honour ``dryRun``, ``fieldValidation``,
``fieldManager`` and (apply) ``force``; warnings go out as ``Warning: 299 - "..."`` headers.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
import yaml
from aiohttp import web

from app.sim import protobuf
from app.sim.core import NAMESPACES
from app.sim.discovery import AGGREGATED_V2, AGGREGATED_V2BETA1, aggregated_document, discovery_document
from app.sim.faults import FaultResponse, Faults, RequestInfo
from app.sim.list_options import ListOptions, parse_bool, parse_list_options
from app.sim.negotiation import JSON, Representation, body_format, negotiate, not_acceptable
from app.sim.openapi import documents
from app.sim.printers import partial_list, partial_metadata, table
from app.sim.status import (
    FieldError,
    StoreError,
    bad_request,
    invalid,
    resource_not_found,
    status_body,
    too_large_rv,
)
from app.sim.store import Store
from app.sim.validation import FieldValidation, WriteOptions
from app.sim.watch import WatchStreams

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

JSON_TYPE: Final = "application/json"
PROTOBUF_V2: Final = (
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
)
_PATCH_TYPES: Final = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply-cbor",
    "application/strategic-merge-patch+json": "strategic",
}
_FIELD_VALIDATION: Final = ("Ignore", "Warn", "Strict")


def _error_response(err: StoreError) -> web.Response:
    return web.Response(
        body=orjson.dumps(err.status), status=err.code, content_type=JSON_TYPE, headers=err.headers
    )


def _fault_response(fault: FaultResponse) -> web.Response:
    resp = web.Response(body=fault.body, status=fault.status, headers=fault.headers)
    resp.headers["Content-Type"] = fault.content_type
    return resp


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=JSON_TYPE)


def not_found_response() -> web.Response:
    return _error_response(resource_not_found())


def go_json_error(raw: bytes, exc: Exception) -> str:
    """encoding/json's wording for a body that is not JSON ("invalid character 'x' looking for ...")."""
    pos = getattr(exc, "pos", 0) or 0
    text = raw.decode("utf-8", "replace")
    if pos >= len(text.rstrip()):
        return "unexpected end of JSON input"
    return f"invalid character {text[pos]!r} looking for beginning of value"


class SimServer:
    def __init__(
        self,
        store: Store,
        faults: Faults,
        *,
        watch_timeout: tuple[float, float] = (1800.0, 3600.0),
        bookmark_interval: float = 60.0,
        bookmark_before_deadline: float = 2.0,
        watch_queue_size: int = 10_000,
        too_large_wait: float = 0.2,
        watchlist_defaulting: bool = False,
        rv0_ignores_limit: bool = False,
        auto_namespaces: bool = True,
    ) -> None:
        """``auto_namespaces``: a write into a namespace that does not exist creates it first, for test
        clusters whose clients assume their namespace exists (as a pod's own always does). False answers
        404 NotFound as a real apiserver does (``python -m app.sim``, the conformance suites)."""
        self.store = store
        self.faults = faults
        self.too_large_wait = too_large_wait
        self.rv0_ignores_limit = rv0_ignores_limit
        self.auto_namespaces = auto_namespaces
        self.server_address = "127.0.0.1:0"
        self.counters: dict[str, int] = {"requests": 0, "watches": 0, "watch_overflows": 0}
        self.watches = WatchStreams(
            store,
            faults,
            self.counters,
            watch_timeout=watch_timeout,
            bookmark_interval=bookmark_interval,
            bookmark_before_deadline=bookmark_before_deadline,
            queue_size=watch_queue_size,
            watchlist_defaulting=watchlist_defaulting,
        )
        self._resources = {(r.group, r.version, r.plural): r for r in store.resources}
        self._extra_routes: dict[tuple[str, str], Handler] = {}
        self._openapi: tuple[bytes, bytes, bytes, dict[str, bytes]] | None = None
        faults.attach(self.watches)
        self.app = web.Application(client_max_size=4 * 1024 * 1024)
        self.app.on_response_prepare.append(_api_headers)
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Serve an exact path ahead of the built-in routes (e.g. TokenReview, SubjectAccessReview)."""
        self._extra_routes[(method.upper(), path)] = handler

    def close(self) -> None:
        """The server stops: open watch streams end and no longer follow the store."""
        self.watches.detach()

    def reopen(self) -> None:
        """After :meth:`close`: a restarted cluster streams new events."""
        self.watches.attach()

    # -- dispatch ---------------------------------------------------------------------------
    def _route(self, request: web.Request) -> RequestInfo | None:
        parts = [p for p in request.path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        elif len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in self._resources:
            namespace, rest = rest[1], rest[2:]
        if not 1 <= len(rest) <= 3:
            return None
        resource = self._resources.get((group, version, rest[0]))
        if resource is None or (namespace is not None and not resource.namespaced):
            return None
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if name is not None and resource.namespaced and namespace is None:
            return None
        watch = request.method == "GET" and name is None and parse_bool(request.query.get("watch"))
        return RequestInfo(request.method, request.path, resource, namespace, name, sub, watch)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.counters["requests"] += 1
        info = self._route(request)
        if info is None:
            info = RequestInfo(request.method, request.path, None, None, None, None, False)
        denied = self.faults.check_auth(request.headers.get("Authorization"))
        if denied is not None:
            return _fault_response(denied)
        fault = await self.faults.before_request(info)
        if fault is not None:
            return _fault_response(fault)
        try:
            extra = self._extra_routes.get((request.method, request.path))
            if extra is not None:
                return await extra(request)
            if info.resource is None:
                return self._discovery(request)
            return await self._resource(request, info)
        except StoreError as err:
            return _error_response(err)

    async def _resource(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None
        method = request.method
        if info.name is None:
            if method == "GET":
                opts = parse_list_options(request.query)
                rep = negotiate(request.headers.get("Accept"), target="watch" if opts.watch else "list")
                if opts.watch:
                    return await self.watches.serve(request, info, opts, rep)
                return await self._list(info, opts, rep, request.query.get("includeObject", "Metadata"))
            if method == "POST" and (info.namespace is not None or not info.resource.namespaced):
                rep = negotiate(request.headers.get("Accept"), target="object")
                body = await self._body(request, info)
                wopts = self._write_options(request)
                if (
                    isinstance(body.get("metadata"), dict)
                    and info.namespace
                    and not body["metadata"].get("namespace")
                ):
                    body["metadata"]["namespace"] = info.namespace
                self._check_body_version(info, body)
                obj = self.store.create(
                    info.resource, info.namespace, body, field_manager=_manager(request), opts=wopts
                )
                return self._respond(obj, 201, rep, wopts)
            if method == "DELETE":
                return await self._delete_collection(request, info)
            return _method_not_allowed()
        if info.subresource not in (None, "status"):
            return not_found_response()
        schema = self.store.schema(info.resource)
        if info.subresource and not schema.status_subresource:
            return not_found_response()
        if method == "GET":
            rep = negotiate(request.headers.get("Accept"), target="object")
            obj = self.store.get(info.resource, info.namespace, info.name)
            return self._respond(obj, 200, rep, None, request.query.get("includeObject", "Metadata"), info)
        if method == "PUT":
            rep = negotiate(request.headers.get("Accept"), target="object")
            body = await self._body(request, info)
            wopts = self._write_options(request)
            meta = body.setdefault("metadata", {})
            if isinstance(meta, dict):
                if meta.get("name") and meta["name"] != info.name:
                    raise bad_request(
                        f"the name of the object ({meta['name']}) does not match the name on the URL "
                        f"({info.name})"
                    )
                meta["name"] = info.name
            self._check_body_version(info, body)
            obj, created = self.store.update_or_create(
                info.resource,
                info.namespace,
                body,
                subresource=info.subresource,
                field_manager=_manager(request),
                opts=wopts,
            )
            return self._respond(obj, 201 if created else 200, rep, wopts)
        if method == "PATCH":
            return await self._patch(request, info)
        if method == "DELETE":
            return await self._delete(request, info)
        return _method_not_allowed()

    def _respond(  # noqa: PLR0917
        self,
        obj: Any,
        status: int,
        rep: Representation,
        wopts: WriteOptions | None,
        include: str = "Metadata",
        info: RequestInfo | None = None,
    ) -> web.Response:
        if rep.form == "yaml":
            resp = web.Response(
                body=yaml.safe_dump(obj, sort_keys=False).encode(),
                status=status,
                content_type="application/yaml",
            )
        elif rep.form == "table" and info is not None and info.resource is not None:
            schema = self.store.schema(info.resource)
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            resp = _json_response(
                table(schema, [obj], meta, include=include, api_version=rep.api_version), status
            )
        elif rep.form == "partial":
            resp = _json_response(partial_metadata(obj, rep.api_version), status)
        else:
            resp = _json_response(obj, status)
        if wopts is not None and wopts.warnings:
            for text in wopts.warnings:
                resp.headers.add("Warning", f"299 - {orjson.dumps(text).decode()}")
        return resp

    def _write_options(self, request: web.Request, *, apply: bool = False) -> WriteOptions:
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
            require_namespace=not self.auto_namespaces,
            force=parse_bool(force),
            warnings=[],
        )

    def _check_body_version(self, info: RequestInfo, body: dict[str, Any]) -> None:
        """The decoder's checks: custom resources need a kind; apiVersion must be the URL's."""
        assert info.resource is not None
        res = info.resource
        api_version = body.get("apiVersion")
        if not body.get("kind") and not self.store.schema(res).typed:
            raise bad_request(f"Object 'Kind' is missing in '{orjson.dumps(body).decode()}'")
        if api_version and api_version != res.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({res.api_version})"
            )
        if not api_version and not self.store.schema(res).typed:
            raise bad_request(
                f"the API version in the data () does not match the expected API version ({res.api_version})"
            )

    async def _body(self, request: web.Request, info: RequestInfo) -> dict[str, Any]:
        assert info.resource is not None
        raw = await request.read()
        fmt = body_format(
            request.headers.get("Content-Type", ""), typed=self.store.schema(info.resource).typed
        )
        if fmt == "protobuf":
            return protobuf.decode(raw)
        try:
            body = yaml.safe_load(raw) if fmt == "yaml" else orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(
                f"couldn't get version/kind; json parse error: {go_json_error(raw, exc)}"
            ) from None
        except yaml.YAMLError as exc:
            raise bad_request(f"error converting YAML to JSON: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request(
                "couldn't get version/kind; json parse error: json: cannot unmarshal "
                f"{_json_kind(body)} into Go value of type struct {{ APIVersion string "
                '"json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }'
            )
        return body

    async def _patch(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        rep = negotiate(request.headers.get("Accept"), target="object")
        typed = self.store.schema(info.resource).typed
        patch_type = _PATCH_TYPES.get(request.content_type)
        if patch_type == "strategic" and typed:
            # The built-in kinds served here have no lists with a patch merge key outside metadata, so a
            # strategic merge patch merges like a JSON merge patch (directives are not supported).
            patch_type = "merge"
        if patch_type not in ("merge", "json", "apply"):
            accepted = (
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            )
            if typed:
                accepted += ", application/strategic-merge-patch+json"
            raise StoreError.make(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + accepted,
            )
        raw = await request.read()
        try:
            patch = yaml.safe_load(raw) if patch_type == "apply" else orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"error decoding patch: {go_json_error(raw, exc)}") from None
        except yaml.YAMLError as exc:
            raise bad_request(f"error converting YAML to JSON: {exc}") from None
        manager = _manager(request)
        wopts = self._write_options(request, apply=patch_type == "apply")
        if patch_type == "apply":
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
            return self._respond(obj, 201 if created else 200, rep, wopts)
        obj = self.store.patch(
            info.resource,
            info.namespace,
            info.name,
            patch,
            subresource=info.subresource,
            patch_type=patch_type,
            field_manager=manager,
            opts=wopts,
        )
        return self._respond(obj, 200, rep, wopts)

    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            options = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(
                f"couldn't get version/kind; json parse error: {go_json_error(raw, exc)}"
            ) from None
        return options if isinstance(options, dict) else {}

    async def _delete(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        if info.subresource is not None:
            return _method_not_allowed()
        options = await self._delete_options(request)
        wopts = self._write_options(request)
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
            return _json_response(last, status)
        if self.store.schema(info.resource).typed:
            res = info.resource
            details = {
                "name": info.name,
                "group": res.group,
                "kind": res.plural,
                "uid": last["metadata"]["uid"],
            }
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }
            return _json_response(body)
        return _json_response(last)

    async def _delete_collection(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None
        options = await self._delete_options(request)
        wopts = self._write_options(request)
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
        return _json_response(body)

    # -- LIST -------------------------------------------------------------------------------
    async def _read_rv(self, requested: int) -> None:
        """Wait briefly for the store to reach ``requested``; 504 TooLarge like the cacher if it does not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.too_large_wait
        while self.store.resource_version < requested:
            if loop.time() >= deadline:
                raise too_large_rv(requested, self.store.resource_version)
            await asyncio.sleep(0.02)

    async def _list(
        self, info: RequestInfo, opts: ListOptions, rep: Representation = JSON, include: str = "Metadata"
    ) -> web.StreamResponse:
        assert info.resource is not None
        schema = self.store.schema(info.resource)
        rv, limit = opts.resource_version, opts.limit
        at_rv: int | None = None
        if rv == "0" and self.rv0_ignores_limit:
            limit = 0
        if rv and rv != "0":
            requested = int(rv)
            exact = opts.rv_match == "Exact" or (not opts.rv_match and limit > 0)
            await self._read_rv(requested)
            at_rv = requested if exact else None
        page = self.store.list_page(
            info.resource,
            info.namespace,
            limit=limit,
            continue_token=opts.continue_token or None,
            at_rv=at_rv,
            predicate=opts.predicate,
        )
        meta: dict[str, Any] = {}
        if not schema.typed or page.continue_token:
            meta["continue"] = page.continue_token
        meta["resourceVersion"] = str(page.resource_version)
        if page.remaining is not None and not opts.filtered:
            meta["remainingItemCount"] = page.remaining
        if rep.form != "json":
            objs = [e.obj for e in page.items]
            if rep.form == "table":
                doc = table(schema, objs, meta, include=include, api_version=rep.api_version)
            elif rep.form == "partial-list":
                doc = partial_list(objs, meta, rep.api_version)
            else:
                full: dict[str, Any] = {
                    "apiVersion": info.resource.api_version,
                    "kind": schema.list_kind,
                    "metadata": meta,
                    "items": objs,
                }
                return web.Response(
                    body=yaml.safe_dump(full, sort_keys=False).encode(), content_type="application/yaml"
                )
            return _json_response(doc)
        if schema.typed:
            items = b",".join(
                orjson.dumps({k: v for k, v in e.obj.items() if k not in ("apiVersion", "kind")})
                for e in page.items
            )
        else:
            items = b",".join(e.raw for e in page.items)
        head = orjson.dumps(
            {"apiVersion": info.resource.api_version, "kind": schema.list_kind, "metadata": meta}
        )
        body = head[:-1] + b',"items":[' + items + b"]}"
        return web.Response(body=body, content_type=JSON_TYPE)

    # -- discovery and OpenAPI ----------------------------------------------------------------
    def _discovery(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_found_response()
        parts = [p for p in request.path.split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok")
        if parts and parts[0] == "openapi":
            return self._openapi_response(request, parts)
        rep = negotiate(request.headers.get("Accept"), target="discovery")
        if rep.form == "aggregated" and parts in (["api"], ["apis"]):
            doc = aggregated_document(self.store, parts == ["api"], rep.version)
            resp = _json_response(doc)
            resp.headers["Content-Type"] = AGGREGATED_V2 if rep.version == "v2" else AGGREGATED_V2BETA1
            return resp
        document = discovery_document(self.store, parts, self.server_address)
        return not_found_response() if document is None else _json_response(document)

    def _openapi_response(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        if self._openapi is None:
            self._openapi = documents([self.store.schema(r) for r in self.store.resources])
        v2_json, v2_pb, v3_root, per_gv = self._openapi
        accept = request.headers.get("Accept", "")
        if parts == ["openapi", "v2"]:
            if any(p in accept for p in PROTOBUF_V2) and "application/json" not in accept.split(",")[0]:
                return web.Response(body=v2_pb, content_type=PROTOBUF_V2[1])
            if accept and "json" not in accept and "*/*" not in accept:
                raise not_acceptable(f"application/json, {PROTOBUF_V2[0]}")
            return web.Response(body=v2_json, content_type=JSON_TYPE)
        if parts == ["openapi", "v3"]:
            return web.Response(body=v3_root, content_type=JSON_TYPE)
        key = "/".join(parts[2:])
        if parts[:2] == ["openapi", "v3"] and key in per_gv:
            return web.Response(body=per_gv[key], content_type=JSON_TYPE)
        return not_found_response()


async def _api_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The apiserver's filters: an Audit-Id for every request, and API responses are never cached."""
    response.headers.setdefault("Audit-Id", str(uuid.uuid4()))
    response.headers.setdefault("Cache-Control", "no-cache, private")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")


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


def _manager(request: web.Request) -> str:
    """fieldManager, else the User-Agent up to its first "/", as the apiserver derives it."""
    manager = request.query.get("fieldManager")
    if manager:
        return manager
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0] or "unknown"


def _method_not_allowed() -> web.Response:
    body = status_body(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )
    return _json_response(body, 405)
