"""HTTP face of the simulated cluster: routing, LIST/WATCH/write handlers, discovery (aiohttp.web).

Wire behaviour follows docs k8s-protocol.md §1-§3. Watch events are serialized once by the store and the
same bytes go to every watcher; each watcher has a bounded queue and is closed (like the apiserver's cacher
closes an unresponsive watcher) when it overflows, so one slow client never blocks the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import yaml
from aiohttp import web

from app.kube.resources import ResourceKind
from app.sim.faults import FaultResponse, Faults, RequestInfo, Target
from app.sim.store import (
    Entry,
    FieldError,
    Store,
    StoreError,
    WatchEvent,
    bad_request,
    event_line,
    invalid,
    status_body,
    too_large_rv,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Predicate = Callable[[Entry], bool]

JSON = "application/json"
NOT_FOUND_MESSAGE = "the server could not find the requested resource"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_WRITE_BATCH_BYTES = 256 * 1024  # initial-event batches: big enough to amortize, small enough to interleave


def parse_bool(value: str | None) -> bool:
    """Query booleans as the apiserver converts them: absent, "0" and "false" are false, all else true."""
    return value is not None and value.lower() not in ("0", "false")


def _error_response(err: StoreError) -> web.Response:
    return web.Response(
        body=orjson.dumps(err.status), status=err.code, content_type=JSON, headers=err.headers
    )


def _fault_response(fault: FaultResponse) -> web.Response:
    resp = web.Response(body=fault.body, status=fault.status, headers=fault.headers)
    resp.headers["Content-Type"] = fault.content_type
    return resp


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=JSON)


def not_found_response() -> web.Response:
    return _error_response(StoreError.make(404, "NotFound", NOT_FOUND_MESSAGE, {}))


# ---------------------------------------------------------------------------------------------- selectors

_LABEL_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_LABEL_OP_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")


Labels = dict[str, str]
LabelCheck = Callable[[Labels], bool]


def _label_equals(key: str, value: str, negate: bool) -> LabelCheck:
    def check(labels: Labels) -> bool:
        return (labels.get(key) == value) != negate

    return check


def _label_in(key: str, members: frozenset[str], negate: bool) -> LabelCheck:
    def check(labels: Labels) -> bool:
        # notin also matches objects without the label, as in apimachinery.
        return (labels.get(key) in members) != negate

    return check


def _label_exists(key: str, negate: bool) -> LabelCheck:
    def check(labels: Labels) -> bool:
        return (key in labels) != negate

    return check


def _split_terms(selector: str) -> list[str]:
    # Commas inside "in (a,b)" do not separate requirements.
    terms: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return [t for t in terms if t.strip()]


def parse_label_selector(selector: str) -> LabelCheck | None:
    """labelSelector with =, ==, !=, in, notin, key, !key; 400 on a parse error."""
    if not selector.strip():
        return None
    checks: list[LabelCheck] = []
    for term in _split_terms(selector):
        op = _LABEL_OP_RE.match(term)
        if op:
            key, operator, value = op.groups()
            checks.append(_label_equals(key, value, operator == "!="))
            continue
        st = _LABEL_SET_RE.match(term)
        if st is None:
            raise bad_request(
                f"unable to parse requirement: found '{term.strip()}', expected: valid selector"
            )
        negate, key, set_op, values = st.groups()
        if set_op:
            if negate:
                raise bad_request(f"unable to parse requirement: unexpected '!' before '{key}'")
            members = frozenset(v.strip() for v in values.split(",") if v.strip())
            checks.append(_label_in(key, members, set_op == "notin"))
        else:
            checks.append(_label_exists(key, bool(negate)))
    return lambda labels: all(check(labels) for check in checks)


def _key_part_equals(index: int, value: str, negate: bool) -> Predicate:
    def check(entry: Entry) -> bool:
        return (entry.key[index] == value) != negate

    return check


_FIELD_RE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$")


def parse_field_selector(selector: str) -> Predicate | None:
    """fieldSelector for custom resources: only metadata.name and metadata.namespace."""
    if not selector.strip():
        return None
    checks: list[Predicate] = []
    for term in selector.split(","):
        if not term.strip():
            continue
        m = _FIELD_RE.match(term)
        if m is None:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        fld, operator, value = m.groups()
        if fld == "metadata.name":
            index = 1
        elif fld == "metadata.namespace":
            index = 0
        else:
            raise bad_request(f"field label not supported: {fld}")
        checks.append(_key_part_equals(index, value, operator == "!="))
    return lambda e: all(check(e) for check in checks)


def _combine(label: LabelCheck | None, fld: Predicate | None) -> Predicate | None:
    if label is None:
        return fld
    if fld is None:
        return lambda e: label(e.labels)
    return lambda e: fld(e) and label(e.labels)


# ---------------------------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class ListOptions:
    watch: bool
    resource_version: str
    rv_match: str
    continue_token: str
    limit: int
    send_initial_events: bool | None
    allow_bookmarks: bool
    timeout_seconds: int | None
    predicate: Predicate | None
    filtered: bool


def parse_list_options(query: Any) -> ListOptions:
    """ListOptions from the query string, validated like the apiserver (400 parse errors, 422 invalid)."""
    watch = parse_bool(query.get("watch"))
    rv = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    cont = query.get("continue", "")
    sie_raw = query.get("sendInitialEvents")
    sie = None if sie_raw is None else parse_bool(sie_raw)
    try:
        limit = int(query.get("limit") or 0)
        timeout_raw = query.get("timeoutSeconds")
        timeout = int(timeout_raw) if timeout_raw else None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    errors: list[FieldError] = []
    if match:
        if watch and sie is None:
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                )
            )
        if not watch and not rv:
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if cont:
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
            )
        if match == "Exact":
            if rv == "0":
                errors.append(
                    FieldError(
                        "resourceVersionMatch",
                        "Forbidden",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        elif match != "NotOlderThan":
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "NotSupported",
                    'supported values: "Exact", "NotOlderThan", ""',
                    f'"{match}"',
                )
            )
    if sie is not None:
        if not watch:
            errors.append(
                FieldError("sendInitialEvents", "Forbidden", "sendInitialEvents is forbidden for list")
            )
        elif match != "NotOlderThan":
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            )
    if errors:
        raise invalid("ListOptions", "meta.k8s.io", "", errors)
    if cont and rv not in ("", "0"):
        raise bad_request("specifying resource version is not allowed when using continue")
    if rv and rv != "0" and not rv.isdigit():
        raise StoreError.make(
            500, "InternalError", f'Internal error occurred: invalid resource version "{rv}"'
        )
    label = parse_label_selector(query.get("labelSelector", ""))
    fld = parse_field_selector(query.get("fieldSelector", ""))
    return ListOptions(
        watch=watch,
        resource_version=rv,
        rv_match=match,
        continue_token=cont,
        limit=max(limit, 0),
        send_initial_events=sie,
        allow_bookmarks=parse_bool(query.get("allowWatchBookmarks")),
        timeout_seconds=timeout,
        predicate=_combine(label, fld),
        filtered=label is not None or fld is not None,
    )


# ---------------------------------------------------------------------------------------------- watch


def bookmark_line(resource: ResourceKind, rv: int, *, typed: bool, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if typed:
        meta["creationTimestamp"] = None
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    obj = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}
    return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"


class Watcher:
    """One open watch stream: filter, bounded queue of ready-made lines, state set by faults and shutdown."""

    def __init__(self, info: RequestInfo, predicate: Predicate | None, min_rv: int, max_queue: int) -> None:
        self.info = info
        self.predicate = predicate
        self.min_rv = min_rv
        self.max_queue = max_queue
        self.pending: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.overflowed = False
        self.closing = False
        self.abrupt = False
        self.reset_pending = False
        self.reset_after: int | None = None
        self.sent_events = 0

    def line_for(self, ev: WatchEvent) -> bytes | None:
        """The line this watcher sees for an event: None if filtered out, a transition with selectors."""
        if ev.rv <= self.min_rv:
            return None
        ns = self.info.namespace
        if ns is not None and ev.entry.key[0] != ns:
            return None
        pred = self.predicate
        if pred is None:
            return ev.line
        if ev.type == "MODIFIED":
            now, before = pred(ev.entry), ev.prev is not None and pred(ev.prev)
            if now and before:
                return ev.line
            if now:
                return event_line("ADDED", ev.entry.raw)
            if before and ev.prev is not None:
                # Stopped matching: DELETED with the previous content at the new revision.
                last = dict(ev.prev.obj)
                last["metadata"] = dict(last["metadata"], resourceVersion=str(ev.rv))
                return event_line("DELETED", orjson.dumps(last))
            return None
        return ev.line if pred(ev.entry) else None

    def offer(self, ev: WatchEvent) -> None:
        if self.closing or self.overflowed:
            return
        line = self.line_for(ev)
        if line is None:
            return
        if len(self.pending) >= self.max_queue:
            self.overflowed = True
        else:
            self.pending.append(line)
        self.wake.set()


class _Reset(Exception):
    """The stream was cut on purpose (fault); the transport is already aborted."""


# ---------------------------------------------------------------------------------------------- server


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
        watchlist_defaulting: bool = True,
        rv0_ignores_limit: bool = False,
    ) -> None:
        self.store = store
        self.faults = faults
        self.watch_timeout = watch_timeout
        self.bookmark_interval = bookmark_interval
        self.bookmark_before_deadline = bookmark_before_deadline
        self.watch_queue_size = watch_queue_size
        self.too_large_wait = too_large_wait
        self.watchlist_defaulting = watchlist_defaulting
        self.rv0_ignores_limit = rv0_ignores_limit
        self.server_address = "127.0.0.1:0"
        self.counters: dict[str, int] = {"requests": 0, "watches": 0, "watch_overflows": 0}
        self._watchers: dict[ResourceKind, set[Watcher]] = {r: set() for r in store.resources}
        self._resources = {(r.group, r.version, r.plural): r for r in store.resources}
        self._extra_routes: dict[tuple[str, str], Handler] = {}
        self._unsubscribe = store.subscribe(self._on_event)
        faults.attach(self)
        self.app = web.Application(client_max_size=4 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)

    # -- extension --------------------------------------------------------------------------
    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Serve an exact path ahead of the built-in routes (e.g. TokenReview, SubjectAccessReview)."""
        self._extra_routes[(method.upper(), path)] = handler

    # -- WatchControl -----------------------------------------------------------------------
    @property
    def open_watches(self) -> int:
        return sum(len(ws) for ws in self._watchers.values())

    def close_watches(self, *, abrupt: bool = False) -> int:
        n = 0
        for ws in self._watchers.values():
            for w in ws:
                w.closing = True
                w.abrupt = abrupt
                w.wake.set()
                n += 1
        return n

    def reset_watches(self, target: Target) -> int:
        n = 0
        for ws in self._watchers.values():
            for w in ws:
                if target.matches(w.info):
                    w.reset_pending = True
                    w.wake.set()
                    n += 1
        return n

    def wake_watches(self) -> None:
        for ws in self._watchers.values():
            for w in ws:
                w.wake.set()

    def close(self) -> None:
        self._unsubscribe()
        self._unsubscribe = _noop
        self.close_watches()

    def reopen(self) -> None:
        """Listen to the store again after ``close()``: a restarted cluster streams new events."""
        self._unsubscribe()
        self._unsubscribe = self.store.subscribe(self._on_event)

    def _on_event(self, ev: WatchEvent) -> None:
        watchers = self._watchers.get(ev.resource)
        if watchers:
            for w in watchers:
                w.offer(ev)

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
        if len(rest) >= 3 and rest[0] == "namespaces":
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
                if opts.watch:
                    return await self._watch(request, info, opts)
                return await self._list(info, opts)
            if method == "POST" and (info.namespace is not None or not info.resource.namespaced):
                body = await self._body(request)
                obj = self.store.create(info.resource, info.namespace, body, field_manager=_manager(request))
                return _json_response(obj, 201)
            return _method_not_allowed()
        if info.subresource not in (None, "status"):
            return not_found_response()
        if method == "GET":
            if info.subresource and not self.store.schema(info.resource).status_subresource:
                return not_found_response()
            return _json_response(self.store.get(info.resource, info.namespace, info.name))
        if method == "PUT":
            body = await self._body(request)
            meta = body.setdefault("metadata", {})
            if isinstance(meta, dict):
                if meta.get("name") and meta["name"] != info.name:
                    raise bad_request(
                        f"the name of the object ({meta['name']}) does not match the name on the URL "
                        f"({info.name})"
                    )
                meta["name"] = info.name
            obj, created = self.store.update_or_create(
                info.resource,
                info.namespace,
                body,
                subresource=info.subresource,
                field_manager=_manager(request),
            )
            return _json_response(obj, 201 if created else 200)
        if method == "PATCH":
            return await self._patch(request, info)
        if method == "DELETE":
            return await self._delete(request, info)
        return _method_not_allowed()

    async def _body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("couldn't get version/kind; json parse error: expected an object")
        return body

    async def _patch(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        ctype = request.content_type
        types = {
            "application/merge-patch+json": "merge",
            "application/json-patch+json": "json",
            "application/apply-patch+yaml": "apply",
        }
        patch_type = types.get(ctype)
        if patch_type is None:
            raise StoreError.make(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        raw = await request.read()
        try:
            patch = yaml.safe_load(raw) if patch_type == "apply" else orjson.loads(raw)
        except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
            raise bad_request(f"error decoding patch: {exc}") from None
        manager = _manager(request)
        if patch_type == "apply":
            if not request.query.get("fieldManager"):
                raise invalid(
                    "PatchOptions",
                    "meta.k8s.io",
                    "",
                    [FieldError("fieldManager", "Required", "is required for apply patch")],
                )
            try:
                self.store.get_entry(info.resource, info.namespace, info.name)
            except StoreError as err:
                if err.code != 404 or info.subresource is not None or not isinstance(patch, dict):
                    raise
                patch.setdefault("metadata", {})["name"] = info.name
                created = self.store.create(info.resource, info.namespace, patch, field_manager=manager)
                return _json_response(created, 201)
        obj = self.store.patch(
            info.resource,
            info.namespace,
            info.name,
            patch,
            subresource=info.subresource,
            patch_type=patch_type,
            field_manager=manager,
        )
        return _json_response(obj)

    async def _delete(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        assert info.resource is not None and info.name is not None
        if info.subresource is not None:
            return _method_not_allowed()
        preconditions = None
        raw = await request.read()
        if raw.strip():
            try:
                options = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
            if isinstance(options, dict):
                preconditions = options.get("preconditions")
        last = self.store.delete(info.resource, info.namespace, info.name, preconditions=preconditions)
        pending = bool(last["metadata"].get("deletionTimestamp")) and bool(last["metadata"].get("finalizers"))
        if pending:
            return _json_response(last, 202)  # not gone yet: the registry answers 202 Accepted
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

    # -- LIST -------------------------------------------------------------------------------
    async def _read_rv(self, requested: int) -> None:
        """Wait briefly for the store to reach ``requested``; 504 TooLarge like the cacher if it does not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.too_large_wait
        while self.store.resource_version < requested:
            if loop.time() >= deadline:
                raise too_large_rv(requested, self.store.resource_version)
            await asyncio.sleep(0.02)

    async def _list(self, info: RequestInfo, opts: ListOptions) -> web.StreamResponse:
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
        return web.Response(body=body, content_type=JSON)

    # -- WATCH ------------------------------------------------------------------------------
    async def _watch(self, request: web.Request, info: RequestInfo, opts: ListOptions) -> web.StreamResponse:
        assert info.resource is not None
        resource = info.resource
        schema = self.store.schema(resource)
        loop = asyncio.get_running_loop()
        timeout = opts.timeout_seconds if opts.timeout_seconds else random.uniform(*self.watch_timeout)
        deadline = loop.time() + timeout
        rv = opts.resource_version
        legacy_initial = rv in ("", "0")
        sie = opts.send_initial_events
        initial = sie if sie is not None else legacy_initial
        end_bookmark = opts.allow_bookmarks and (
            sie is True or (sie is None and legacy_initial and self.watchlist_defaulting)
        )
        if rv and rv != "0" and (initial or sie is not None):
            # watch-list at NotOlderThan N: the initial state must be at least N.
            while self.store.resource_version < int(rv) and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)

        resp = web.StreamResponse(
            status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"}
        )
        resp.enable_chunked_encoding()
        stall = self.faults.watch_stall(info)
        if stall is not None and not self.faults.watch_stall_sends_headers(info):
            await stall.wait()

        # Everything below up to subscription is synchronous, so no event can slip between the snapshot
        # (or history replay) and the live queue.
        start_lines: list[bytes] = []
        initial_entries: list[Entry] = []
        error_line: bytes | None = None
        if initial:
            initial_entries = self.store.entries(resource, info.namespace)
            min_rv = self.store.resource_version
        elif rv and rv != "0":
            min_rv = int(rv)
            try:
                replay = (
                    self.store.events_since(resource, min_rv) if min_rv <= self.store.resource_version else []
                )
            except StoreError as err:
                error_line = orjson.dumps({"type": "ERROR", "object": err.status}) + b"\n"
                replay = []
        else:
            min_rv = self.store.resource_version
        snapshot_rv = max(self.store.resource_version, int(rv) if rv.isdigit() else 0)
        watcher = Watcher(info, opts.predicate, min_rv, self.watch_queue_size)
        watcher.reset_after = self.faults.take_reset_rule(info)
        if error_line is None and not initial and rv and rv != "0":
            for ev in replay:
                line = watcher.line_for(ev)
                if line is not None:
                    start_lines.append(line)
        if error_line is None:
            self._watchers[resource].add(watcher)
        self.counters["watches"] += 1
        try:
            await resp.prepare(request)  # headers go out now, before any event
            await self._hold_while_stalled(watcher)
            if error_line is not None:
                await resp.write(error_line)
                await resp.write_eof()
                return resp
            if initial:
                await self._write_initial(request, resp, watcher, initial_entries)
                if end_bookmark:
                    await resp.write(
                        bookmark_line(resource, snapshot_rv, typed=schema.typed, initial_end=True)
                    )
            if start_lines:
                await self._send(request, resp, watcher, start_lines)
            await self._pump(
                request,
                resp=resp,
                w=watcher,
                deadline=deadline,
                bookmarks=opts.allow_bookmarks,
                typed=schema.typed,
            )
            if watcher.abrupt:
                _abort(request)
                return resp
            await resp.write_eof()
        except _Reset:
            self.faults.count_reset()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self._watchers[resource].discard(watcher)
        return resp

    async def _hold_while_stalled(self, w: Watcher) -> bool:
        """Send nothing while a stall fault matches this stream; True if it had to wait."""
        stall = self.faults.watch_stall(w.info)
        if stall is None:
            return False
        while not stall.is_set() and not w.closing:
            w.wake.clear()
            await w.wake.wait()
        return True

    async def _write_initial(
        self, request: web.Request, resp: web.StreamResponse, w: Watcher, entries: list[Entry]
    ) -> None:
        pred, batch, size = w.predicate, [], 0
        for entry in entries:
            if pred is not None and not pred(entry):
                continue
            line = event_line("ADDED", entry.raw)
            batch.append(line)
            size += len(line)
            if size >= _WRITE_BATCH_BYTES:
                await self._send(request, resp, w, batch)
                batch, size = [], 0
        if batch:
            await self._send(request, resp, w, batch)

    async def _send(
        self, request: web.Request, resp: web.StreamResponse, w: Watcher, lines: list[bytes]
    ) -> None:
        if w.reset_after is not None and w.sent_events + len(lines) > w.reset_after:
            keep = w.reset_after - w.sent_events
            if keep > 0:
                await resp.write(b"".join(lines[:keep]))
            await self._cut(request, resp, lines[keep])
        await resp.write(b"".join(lines))
        w.sent_events += len(lines)

    async def _cut(self, request: web.Request, resp: web.StreamResponse, line: bytes) -> None:
        await resp.write(line[: max(1, len(line) // 2)])
        await asyncio.sleep(0.01)  # let the half event reach the socket before the reset
        _abort(request)
        raise _Reset

    async def _pump(
        self,
        request: web.Request,
        *,
        resp: web.StreamResponse,
        w: Watcher,
        deadline: float,
        bookmarks: bool,
        typed: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        resource = w.info.resource
        assert resource is not None

        def next_bookmark(now: float) -> float:
            # The cacher's schedule: every interval, and once ~2 s before the deadline if still ahead.
            beat = now + self.bookmark_interval
            pre = deadline - self.bookmark_before_deadline
            beat = min(beat, pre)
            return beat if beat >= now else math.inf

        next_bm = next_bookmark(loop.time()) if bookmarks else math.inf
        while not w.closing:
            if await self._hold_while_stalled(w):
                continue
            if w.overflowed:
                self.counters["watch_overflows"] += 1
                return
            if w.reset_pending:
                pending = (
                    w.pending.popleft()
                    if w.pending
                    else bookmark_line(resource, self.store.resource_version, typed=typed)
                )
                await self._cut(request, resp, pending)
            if w.pending:
                lines = list(w.pending)
                w.pending.clear()
                await self._send(request, resp, w, lines)
                continue
            now = loop.time()
            if now >= deadline:
                return
            if now >= next_bm:
                # Queue drained: every event up to the store revision has been offered to this watcher.
                await resp.write(
                    bookmark_line(resource, max(self.store.resource_version, w.min_rv), typed=typed)
                )
                next_bm = next_bookmark(loop.time())
                continue
            w.wake.clear()
            if w.pending or w.closing or w.overflowed or w.reset_pending:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.wake.wait(), min(deadline, next_bm) - now)

    # -- discovery --------------------------------------------------------------------------
    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for r in self.store.resources:
            if r.group:
                versions = groups.setdefault(r.group, [])
                if r.version not in versions:
                    versions.append(r.version)
        return groups

    def _discovery(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_found_response()
        parts = [p for p in request.path.split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok")
        if parts == ["version"]:
            return _json_response(
                {
                    "major": "1",
                    "minor": "33",
                    "gitVersion": "v1.33.0-sim",
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": "2025-04-23T00:00:00Z",
                    "goVersion": "go1.24.2",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            )
        if parts == ["api"]:
            return _json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.server_address}
                    ],
                }
            )
        groups = self._groups()
        if parts == ["apis"]:
            return _json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_group(g, vs) for g, vs in groups.items()],
                }
            )
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return _json_response(dict(_group(parts[1], groups[parts[1]]), kind="APIGroup", apiVersion="v1"))
        if (len(parts) == 3 and parts[0] == "apis") or parts == ["api", "v1"]:
            group, version = (parts[1], parts[2]) if parts[0] == "apis" else ("", "v1")
            resources = [r for r in self.store.resources if r.group == group and r.version == version]
            if not resources and group:
                return not_found_response()
            return _json_response(
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}" if group else version,
                    "resources": [e for r in resources for e in self._api_resources(r)],
                }
            )
        return not_found_response()

    def _api_resources(self, r: ResourceKind) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["delete", "get", "list", "patch", "create", "update", "watch"],
            }
        ]
        if self.store.schema(r).status_subresource:
            out.append(
                {
                    "name": f"{r.plural}/status",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return out


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def _manager(request: web.Request) -> str:
    """fieldManager, else the User-Agent up to its first "/", as the apiserver derives it."""
    manager = request.query.get("fieldManager")
    if manager:
        return manager
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0] or "unknown"


def _noop() -> None:
    pass


def _method_not_allowed() -> web.Response:
    body = status_body(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )
    return _json_response(body, 405)


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
