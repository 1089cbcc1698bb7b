"""One WATCH stream's view of the store: which events it sees, in which form, and how many may wait.

It exists apart from :mod:`kubesim.apiserver.http.watch` (which registers streams and writes them to the
socket) because this part is synchronous and per event: the store calls :meth:`Watcher.offer` for every
committed event, so filtering, selector transitions (a MODIFIED that stops matching becomes DELETED) and the
bounded queue are kept here, free of I/O. Events are serialized once by the store and the same bytes go to
every JSON watcher; only Table and PartialObjectMetadata watchers render their own lines.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from kubesim.apiserver.http.faults import RequestInfo
from kubesim.apiserver.http.negotiation import Representation
from kubesim.apiserver.http.printers import partial_metadata, table
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.storage.strategy import ResourceSchema
from kubesim.apiserver.storage.table import Entry, Obj, Predicate, WatchEvent, event_line

Render = Callable[[str, Obj], bytes]

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def bookmark_line(resource: ResourceKind, rv: int, *, typed: bool, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if typed:
        meta["creationTimestamp"] = None
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    obj = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}
    return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"


def renderer(schema: ResourceSchema, rep: Representation, include: str) -> Render | None:
    """Per-watcher serialization for Table or PartialObjectMetadata watches (None: the shared JSON lines)."""
    if rep.form == "table":

        def as_table(type_: str, obj: Obj) -> bytes:
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            if type_ == "BOOKMARK":  # no row: only the revision (and the initial-events-end annotation)
                return _line(
                    type_,
                    {
                        "kind": "Table",
                        "apiVersion": rep.api_version,
                        "metadata": obj["metadata"],
                        "columnDefinitions": [],
                        "rows": [],
                    },
                )
            return _line(type_, table(schema, [obj], meta, include=include, api_version=rep.api_version))

        return as_table
    if rep.form == "partial":
        return lambda type_, obj: _line(type_, partial_metadata(obj, rep.api_version))
    return None


def _line(type_: str, obj: Obj) -> bytes:
    return orjson.dumps({"type": type_, "object": obj}) + b"\n"


class Watcher:
    """One open watch stream: filter, bounded queue of ready-made lines, state set by faults and shutdown."""

    def __init__(
        self,
        info: RequestInfo,
        predicate: Predicate | None,
        min_rv: int,
        max_queue: int,
        render: Render | None = None,
    ) -> None:
        self.info = info
        self.render = render
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
        render = self.render
        if pred is None:
            return ev.line if render is None else render(ev.type, ev.entry.obj)
        if ev.type == "MODIFIED":
            now, before = pred(ev.entry), ev.prev is not None and pred(ev.prev)
            if now and before:
                return ev.line if render is None else render(ev.type, ev.entry.obj)
            if now:
                return event_line("ADDED", ev.entry.raw) if render is None else render("ADDED", ev.entry.obj)
            if before and ev.prev is not None:
                # Stopped matching: DELETED with the previous content at the new revision.
                last = dict(ev.prev.obj)
                last["metadata"] = dict(last["metadata"], resourceVersion=str(ev.rv))
                return (
                    event_line("DELETED", orjson.dumps(last)) if render is None else render("DELETED", last)
                )
            return None
        if not pred(ev.entry):
            return None
        return ev.line if render is None else render(ev.type, ev.entry.obj)

    def initial_line(self, entry: Entry) -> bytes:
        return event_line("ADDED", entry.raw) if self.render is None else self.render("ADDED", entry.obj)

    def bookmark(self, resource: ResourceKind, rv: int, *, typed: bool, initial_end: bool = False) -> bytes:
        if self.render is None:
            return bookmark_line(resource, rv, typed=typed, initial_end=initial_end)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return self.render("BOOKMARK", {"metadata": meta})

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
