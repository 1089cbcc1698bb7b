"""HTTP face of the simulated cluster: the aiohttp application, routing and the dispatch of each request to
its handler (docs/design/k8s-protocol.md §1-§3).

It exists to be the one place that decides who answers a request: authentication and request faults first,
then extra routes (TokenReview, SubjectAccessReview, test hooks), then by path and verb: reads
(:mod:`kubesim.apiserver.http.reads`), writes (:mod:`kubesim.apiserver.http.writes`), WATCH streams
(:mod:`kubesim.apiserver.http.watch`) and non-resource paths: discovery, OpenAPI, health
(:mod:`kubesim.apiserver.http.nonresource`). How responses are encoded is
:mod:`kubesim.apiserver.http.responses`'s.

Every API response carries ``Audit-Id`` and ``Cache-Control: no-cache, private`` like the apiserver's;
writes are validated (:mod:`kubesim.apiserver.schema.validation`) and honour ``dryRun``, ``fieldValidation``,
``fieldManager`` and (apply) ``force``; warnings go out as ``Warning: 299 - "..."`` headers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from kubesim.apiserver.core import PODS
from kubesim.apiserver.http.faults import Faults, RequestInfo
from kubesim.apiserver.http.list_options import parse_bool, parse_list_options
from kubesim.apiserver.http.negotiation import negotiate
from kubesim.apiserver.http.nonresource import NonResourceHandler
from kubesim.apiserver.http.reads import ReadHandlers
from kubesim.apiserver.http.responses import (
    api_headers,
    error_response,
    fault_response,
    method_not_allowed,
    not_found_response,
)
from kubesim.apiserver.http.watch import WatchStreams
from kubesim.apiserver.http.writes import WriteHandlers
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.store import Store

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        404 NotFound as a real apiserver does (``python -m kubesim``, the conformance suites)."""
        self.store = store
        self.faults = faults
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
        self.reads = ReadHandlers(store, too_large_wait=too_large_wait, rv0_ignores_limit=rv0_ignores_limit)
        self.writes = WriteHandlers(store, auto_namespaces=auto_namespaces)
        self.nonresource = NonResourceHandler(store)
        self._resources = {(r.group, r.version, r.plural): r for r in store.resources}
        self._extra_routes: dict[tuple[str, str], Handler] = {}
        faults.attach(self.watches)
        self.app = web.Application(client_max_size=4 * 1024 * 1024)
        self.app.on_response_prepare.append(api_headers)
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
        denied = self.faults.check_auth(
            request.headers.get("Authorization")
        ) or self.faults.check_authorization(info)
        if denied is not None:
            return fault_response(denied)
        fault = await self.faults.before_request(info)
        if fault is not None:
            return fault_response(fault)
        try:
            extra = self._extra_routes.get((request.method, request.path))
            if extra is not None:
                return await extra(request)
            if info.resource is None:
                return self.nonresource.serve(request, self.server_address)
            return await self._resource(request, info)
        except StoreError as err:
            return error_response(err)

    async def _resource(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None
        method = request.method
        accept = request.headers.get("Accept")
        if info.name is None:
            if method == "GET":
                opts = parse_list_options(request.query)
                rep = negotiate(accept, target="watch" if opts.watch else "list")
                if opts.watch:
                    return await self.watches.serve(request, info, opts, rep)
                return await self.reads.list(info, opts, rep, request.query.get("includeObject", "Metadata"))
            if method == "POST" and (info.namespace is not None or not info.resource.namespaced):
                return await self.writes.create(request, info, negotiate(accept, target="object"))
            if method == "DELETE":
                return await self.writes.delete_collection(request, info)
            return method_not_allowed()
        if info.subresource == "binding" and info.resource.coordinates == PODS.coordinates:
            if method != "POST":
                return method_not_allowed()
            return await self.writes.bind(request, info)
        if info.subresource not in (None, "status"):
            return not_found_response()
        schema = self.store.schema(info.resource)
        if info.subresource and not schema.status_subresource:
            return not_found_response()
        if method == "GET":
            return await self.reads.get(request, info, negotiate(accept, target="object"))
        if method == "PUT":
            return await self.writes.update(request, info, negotiate(accept, target="object"))
        if method == "PATCH":
            return await self.writes.patch(request, info, negotiate(accept, target="object"))
        if method == "DELETE":
            return await self.writes.delete(request, info)
        return method_not_allowed()
