"""Read handlers of the simulated apiserver: GET of one object and LIST of a collection
(docs/design/k8s-protocol.md §1), in the representation the client negotiated.

It exists so the LIST semantics (resourceVersion and resourceVersionMatch, limit and continue,
remainingItemCount, the 504 a too-new resourceVersion gets) sit apart from writes and routing. The JSON LIST
body is spliced from the bytes the store keeps per object, because LIST is the hot path of every informer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import yaml
from aiohttp import web

from kubesim.apiserver.http.faults import RequestInfo
from kubesim.apiserver.http.list_options import ListOptions
from kubesim.apiserver.http.negotiation import JSON, Representation
from kubesim.apiserver.http.printers import partial_list, table
from kubesim.apiserver.http.responses import JSON_TYPE, json_response, object_response
from kubesim.apiserver.status import too_large_rv
from kubesim.apiserver.storage.store import Store


class ReadHandlers:
    """GET and LIST against one store.

    ``too_large_wait``: how long a LIST at a resourceVersion the store has not reached yet waits before
    the cacher's 504. ``rv0_ignores_limit``: a LIST at resourceVersion "0" ignores ``limit`` and answers
    whole, as an apiserver whose watch cache does not paginate does.
    """

    def __init__(self, store: Store, *, too_large_wait: float, rv0_ignores_limit: bool) -> None:
        self.store = store
        self.too_large_wait = too_large_wait
        self.rv0_ignores_limit = rv0_ignores_limit

    async def get(self, request: web.Request, info: RequestInfo, rep: Representation) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        obj = self.store.get(info.resource, info.namespace, info.name)
        return object_response(
            obj,
            200,
            rep,
            None,
            schema=self.store.schema(info.resource),
            include=request.query.get("includeObject", "Metadata"),
        )

    async def _read_rv(self, requested: int) -> None:
        """Wait briefly for the store to reach ``requested``; 504 TooLarge like the cacher if it does not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.too_large_wait
        while self.store.resource_version < requested:
            if loop.time() >= deadline:
                raise too_large_rv(requested, self.store.resource_version)
            await asyncio.sleep(0.02)

    async def list(
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
            return json_response(doc)
        if schema.typed:
            # Built-in kinds' items carry no apiVersion/kind in a LIST, as the apiserver encodes them.
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
