"""Non-resource paths of the simulated apiserver: health probes, discovery (/api, /apis, per group-version,
aggregated) and /openapi/v2, /openapi/v3.

It exists to keep the documents clients read before they touch a resource apart from the resource handlers:
the documents themselves come from :mod:`kubesim.apiserver.http.discovery` and
:mod:`kubesim.apiserver.http.openapi`; this module picks one by path and Accept header and caches the OpenAPI
bytes, which are built once from the served kinds.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from kubesim.apiserver.http.discovery import (
    AGGREGATED_V2,
    AGGREGATED_V2BETA1,
    aggregated_document,
    discovery_document,
)
from kubesim.apiserver.http.negotiation import negotiate, not_acceptable
from kubesim.apiserver.http.openapi import documents
from kubesim.apiserver.http.responses import JSON_TYPE, json_response, not_found_response
from kubesim.apiserver.storage.store import Store

PROTOBUF_V2: Final = (
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
)


class NonResourceHandler:
    """Answers every request whose path names no served resource.

    ``server_address`` is read per request: the cluster sets it once it knows its port.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._openapi: tuple[bytes, bytes, bytes, dict[str, bytes]] | None = None

    def serve(self, request: web.Request, server_address: str) -> web.StreamResponse:
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
            resp = json_response(doc)
            resp.headers["Content-Type"] = AGGREGATED_V2 if rep.version == "v2" else AGGREGATED_V2BETA1
            return resp
        document = discovery_document(self.store, parts, server_address)
        return not_found_response() if document is None else json_response(document)

    def _openapi_response(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        if self._openapi is None:
            self._openapi = documents([self.store.schema(r) for r in self.store.resources])
        v2_json, v2_pb, v3_root, per_gv = self._openapi
        accept = request.headers.get("Accept", "")
        if parts == ["openapi", "v2"]:
            # kubectl <= 1.26 asks for protobuf first; a client that prefers JSON gets JSON.
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
