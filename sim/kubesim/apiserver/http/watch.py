"""WATCH streams of the simulated apiserver (docs/design/k8s-protocol.md §2): initial events, resume from a
resourceVersion, bookmarks, the watch-list end marker, and the faults that act on open streams.

Its job is the set of open streams and writing each one to its socket; what one stream sees of each event is
:class:`kubesim.apiserver.http.watcher.Watcher`'s. Watch events are serialized once by the store and the same
bytes go to every watcher; each watcher has a bounded queue and is closed (like the apiserver's cacher closes
an unresponsive watcher) when it overflows, so one slow client never blocks the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random

import orjson
from aiohttp import web

from kubesim.apiserver.http.faults import Faults, RequestInfo, Target
from kubesim.apiserver.http.list_options import ListOptions
from kubesim.apiserver.http.negotiation import JSON, Representation
from kubesim.apiserver.http.watcher import Watcher, renderer
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.store import Store
from kubesim.apiserver.storage.table import Entry, WatchEvent

_WRITE_BATCH_BYTES = 256 * 1024  # initial-event batches: big enough to amortize, small enough to interleave
_HEADERS = {"Content-Type": "application/json", "Cache-Control": "no-cache, private"}


class _Reset(Exception):
    """The stream was cut on purpose (fault); the transport is already aborted."""


class WatchStreams:
    """Every open watch stream: fed by the store as events commit, served by :meth:`serve`, and acted on by
    faults (the ``WatchControl`` they attach to)."""

    def __init__(
        self,
        store: Store,
        faults: Faults,
        counters: dict[str, int],
        *,
        watch_timeout: tuple[float, float],
        bookmark_interval: float,
        bookmark_before_deadline: float,
        queue_size: int,
        watchlist_defaulting: bool,
    ) -> None:
        self.store = store
        self.faults = faults
        self.counters = counters  # the server's: "watches" and "watch_overflows" are counted here
        self.watch_timeout = watch_timeout
        self.bookmark_interval = bookmark_interval
        self.bookmark_before_deadline = bookmark_before_deadline
        self.queue_size = queue_size
        self.watchlist_defaulting = watchlist_defaulting
        self._watchers: dict[ResourceKind, set[Watcher]] = {r: set() for r in store.resources}
        self._unsubscribe = store.subscribe(self._on_event)

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

    def detach(self) -> None:
        """Stop listening to the store and end every stream (the server stops)."""
        self._unsubscribe()
        self._unsubscribe = _noop
        self.close_watches()

    def attach(self) -> None:
        """Listen to the store again after :meth:`detach`: a restarted server streams new events."""
        self._unsubscribe()
        self._unsubscribe = self.store.subscribe(self._on_event)

    def _on_event(self, ev: WatchEvent) -> None:
        watchers = self._watchers.get(ev.resource)
        if watchers:
            for w in watchers:
                w.offer(ev)

    async def serve(
        self, request: web.Request, info: RequestInfo, opts: ListOptions, rep: Representation = JSON
    ) -> web.StreamResponse:
        """One WATCH request, from its initial events (or history replay) to the end of the stream."""
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

        resp = web.StreamResponse(status=200, headers=_HEADERS)
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
        render = renderer(schema, rep, request.query.get("includeObject", "Metadata"))
        watcher = Watcher(info, opts.predicate, min_rv, self.queue_size, render)
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
                        watcher.bookmark(resource, snapshot_rv, typed=schema.typed, initial_end=True)
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
            line = w.initial_line(entry)
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
                    else w.bookmark(resource, self.store.resource_version, typed=typed)
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
                    w.bookmark(resource, max(self.store.resource_version, w.min_rv), typed=typed)
                )
                next_bm = next_bookmark(loop.time())
                continue
            w.wake.clear()
            if w.pending or w.closing or w.overflowed or w.reset_pending:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.wake.wait(), min(deadline, next_bm) - now)


def _noop() -> None:
    pass


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
