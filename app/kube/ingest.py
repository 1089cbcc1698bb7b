"""What the API server sends, applied to the informer's cache; and where that leaves the informer.

client-go's reflector ``syncWith`` (a complete list) and ``watchHandler`` (one watch event), without
the I/O (app/kube/reflector.py does that). docs/design/k8s-protocol.md §2 and §6:

- A list replaces the cache (which diffs it) and sets the resourceVersion to resume from.
- A watch line is decoded straight into the projector's msgspec wire type (the per-event hot path,
  inline here); anything that fails takes the tolerant path (orjson, ``projector.from_json``). An object
  event goes to the cache and advances the resourceVersion, a BOOKMARK only advances it, an ERROR ends
  the watch (``WatchStop``). An unusable object is skipped and counted, its resourceVersion still
  taken (it is not replayed); an unusable DELETED still deletes, reporting the cached last state.
- A streaming list (a watch with ``sendInitialEvents=true``, k8s-protocol.md §2 "Start semantics"):
  between ``begin_initial`` and the BOOKMARK annotated ``k8s.io/initial-events-end: "true"`` the object
  events are collected, not applied, exactly as LIST pages are; that bookmark is then a complete list
  (``replace``, the same relist diff) at the bookmark's resourceVersion, and the same lines go on as a
  live watch.
- Nothing a server sends raises out of here except ``WatchStop``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import msgspec
import orjson

from app.kube.cache import ADDED, DELETED, MODIFIED, OBJECT_EVENTS, Cache, KubeObject
from app.kube.decode import Decoder, decode_deep, raw_key, raw_rv
from app.kube.informer_telemetry import InformerCounters
from app.kube.lines import Line
from app.kube.logthrottle import KeyedOnce, RateLimit, short

log = logging.getLogger(__name__)

T = TypeVar("T", bound=KubeObject)

INITIAL_EVENTS_END = "k8s.io/initial-events-end"

# Retry-After is honoured, but a broken proxy asking for an hour must not park the informer that long.
MAX_RETRY_AFTER = 60.0


class WatchStop(Exception):
    """Why a watch ended and what comes next. Raised from line processing only on rare paths."""

    def __init__(
        self,
        reason: str,
        *,
        relist: str | None = None,
        fresh: bool = False,
        backoff: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason  # informer_telemetry.WATCH_RESTART_REASONS
        self.relist = relist  # informer_telemetry.RELIST_REASONS, None = resume from the last RV
        self.fresh = fresh  # relist with RV "" (consistent read): the RV we hold is unusable
        self.backoff = backoff or relist is not None
        self.retry_after = min(retry_after or 0.0, MAX_RETRY_AFTER)


def watch_error_stop(status: Any) -> WatchStop:
    """What an ERROR event (its ``object``, normally a Status) means for the next step."""
    code, reason, message = _status_fields(status)
    if code == 410 or reason in ("Expired", "Gone"):
        return WatchStop("expired", relist="expired", fresh=True)
    too_large = code == 504 and isinstance(message, str) and "too large resource version" in message.lower()
    return WatchStop("error", relist="watch_error", fresh=too_large)


def _initial_events_end(raw: Any) -> bool:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true"


def _status_fields(status: Any) -> tuple[Any, Any, Any]:
    if not isinstance(status, dict):
        return None, None, None
    return status.get("code"), status.get("reason"), status.get("message")


class Ingest(Generic[T]):
    """Applies lists and watch lines to ``cache``. State for the reflector and the informer to read:
    ``resource_version`` (where the next watch resumes), ``synced`` (a first list was applied),
    ``last_activity`` (last byte received, list completed or watch established: the reflector sets it
    per chunk) and ``last_event`` (last event, bookmark or completed list), both readings of ``clock``."""

    def __init__(
        self,
        decoder: Decoder[T],
        cache: Cache[T],
        counters: InformerCounters,
        *,
        name: str,
        clock: Callable[[], float],
    ) -> None:
        self._decoder = decoder
        self._cache = cache
        self.counters = counters
        self.name = name
        self._clock = clock
        # Hot-path aliases. ``_store`` is the cache's dict, re-read after every ``cache.replace``.
        # With a status wire type (Projector), lines are decoded into it, and into the whole wire type only
        # when ``from_status_wire`` needs the spec (``_full``).
        self._from_status = decoder.from_status_wire
        if decoder.status_event_decoder is None:
            self._event_decoder = decoder.event_decoder
            self._full = None
        else:
            self._event_decoder = decoder.status_event_decoder
            self._full = decoder.event_decoder
        self._decode = self._event_decoder.decode
        self._from_wire = decoder.from_wire
        self._wire_key = decoder.wire_key
        self._wire_rv = decoder.wire_rv
        self._apply = cache.apply
        self._store = cache.store

        self.resource_version = ""
        self.synced = False
        # A streaming list in progress: what it collected so far, and what to call once it is complete.
        self._initial: tuple[dict[str, T], set[str]] | None = None
        self._held_rv = ""
        self._on_initial_end: Callable[[], None] | None = None
        now = clock()
        self.last_activity = now
        self.last_event = now
        self._logged = KeyedOnce()
        self._rate = RateLimit(clock=clock)

    # --- LIST --------------------------------------------------------------------------------------

    def list_page(
        self, body: bytes, items: dict[str, T], unusable: set[str], *, max_object_bytes: int | None = None
    ) -> tuple[str, str]:
        """Decode one page into ``items``/``unusable`` (see ``Decoder.page``); (resourceVersion, continue).

        Objects above ``max_object_bytes`` are skipped and counted as ``too_large``, as watch lines are.
        """
        # A relist reuses what it can of the current cache.
        return self._decoder.page(
            body, self._store, items, unusable, self._skip_object, max_object_bytes=max_object_bytes
        )

    def replace(self, items: dict[str, T], list_rv: str, unusable: set[str]) -> None:
        """A complete list: the cache diffs it and notifies; synced from then on."""
        rv = self.resource_version
        since = int(rv) if rv.isdigit() else 0  # held before the gap, for the handler's on_relist
        if list_rv:
            self.resource_version = list_rv
        self._cache.replace(items, unusable, initial=not self.synced, since=since, list_rv=list_rv)
        self._store = self._cache.store
        self.synced = True
        self.counters.lists += 1
        now = self._clock()
        self.last_event = now
        self.last_activity = now

    # --- streaming list ------------------------------------------------------------------------------

    @property
    def collecting(self) -> bool:
        """A streaming list has begun and its initial-events-end bookmark has not arrived yet."""
        return self._initial is not None

    def begin_initial(self, on_end: Callable[[], None] | None = None) -> None:
        """The watch about to be read is a streaming list: collect its initial events as a LIST's items.

        The resourceVersion stays where it was until the end bookmark (a sync cut short resumes nowhere:
        initial events are in no resourceVersion order), so ``replace`` sees the one held before the gap.
        """
        self._initial = ({}, set())
        self._held_rv = self.resource_version
        self._on_initial_end = on_end
        self._apply = self._collect

    def abort_initial(self) -> None:
        """The streaming list ended before its end bookmark: drop what it collected."""
        if self._initial is not None:
            self._initial = None
            self.resource_version = self._held_rv
            self._on_initial_end = None
            self._apply = self._cache.apply

    def _collect(self, etype: str, obj: T) -> None:
        # Called after the hot path took the object's resourceVersion: put the held one back.
        self.resource_version = self._held_rv
        assert self._initial is not None
        items, unusable = self._initial
        key = obj.key
        unusable.discard(key)
        if etype == DELETED:  # not expected before the end bookmark; a LIST would not list it either
            items.pop(key, None)
        else:
            items[key] = obj

    def _end_initial(self, rv: str) -> None:
        assert self._initial is not None
        items, unusable = self._initial
        on_end = self._on_initial_end
        self.abort_initial()  # back to live application, the resourceVersion held before the gap
        self.replace(items, rv, unusable)
        if on_end is not None:
            on_end()

    # --- WATCH -------------------------------------------------------------------------------------

    def process_line(self, line: Line) -> None:
        """One watch line. Fast path: typed decode of ADDED/MODIFIED/DELETED; the rest goes tolerant."""
        try:
            event = self._decode(line)  # decode_deep inlined: one Python call less per line
        except msgspec.DecodeError:  # includes ValidationError (wrong shape, BOOKMARK, ERROR Status)
            self._process_line_tolerant(line)
            return
        except RecursionError:
            try:
                event = decode_deep(self._event_decoder, line)
            except msgspec.DecodeError:
                self._process_line_tolerant(line)
                return
        etype = event.type
        if etype in OBJECT_EVENTS:
            try:
                wire = event.object
                wire_key = self._wire_key
                wire_rv = self._wire_rv
                if wire_key is None:
                    obj = self._from_wire(wire)
                elif self._full is None:
                    obj = self._from_wire(wire, self._store.get(wire_key(wire)))
                else:
                    previous = self._store.get(wire_key(wire))
                    updated = None if previous is None else self._from_status(wire, previous)  # type: ignore[misc]
                    if updated is None:  # new, or its spec may have changed: the whole object
                        wire = decode_deep(self._full, line).object
                        updated = self._from_wire(wire, previous)
                    obj = updated
            except Exception:
                self._process_line_tolerant(line)
                return
            if obj.key:
                # The wire's string where the projector names it: a projection may store it as an int.
                rv = obj.resource_version if wire_rv is None else wire_rv(wire)
                if rv:
                    self.resource_version = rv  # for DELETED this is the deletion RV
                self.last_event = self.last_activity
                self._apply(etype, obj)
                return
        self._process_line_tolerant(line)

    def _process_line_tolerant(self, line: Line) -> None:
        c = self.counters
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            self._skip_object("malformed", None, "")
            return
        etype = doc.get("type")
        raw = doc.get("object")
        if etype == "BOOKMARK":
            c.bookmark += 1
            rv = raw_rv(raw)
            if self._initial is not None:
                if _initial_events_end(raw):
                    self._end_initial(rv)
                    return
                rv = ""  # a progress bookmark inside the initial events: not a place to resume from
            if rv:
                self.resource_version = rv
            self.last_event = self._clock()
            return
        if etype == "ERROR":
            c.error += 1
            self._watch_error(raw)
        if etype not in OBJECT_EVENTS:
            self._skip_object("malformed", None, "")
            return
        obj = self._decoder.project_json(raw)
        if obj is not None:
            # The object's as sent (a projection may keep none: a pod's only while Failed).
            rv = raw_rv(raw) or obj.resource_version
            if rv:
                self.resource_version = rv
            self.last_event = self.last_activity
            self._apply(cast(str, etype), obj)
            return
        key, rv = raw_key(raw), raw_rv(raw)
        if self._initial is not None:
            # As an unusable LIST item: the cache keeps the key's last good state.
            items, unusable = self._initial
            if key is not None:
                items.pop(key, None)
                if etype == DELETED:
                    unusable.discard(key)
                else:
                    unusable.add(key)
            self._skip_object("malformed", key, rv)
            return
        # Unusable object: keep our last good state, but do not replay it (advance the RV).
        if etype == ADDED:
            c.added += 1
        elif etype == MODIFIED:
            c.modified += 1
        else:
            c.deleted += 1
        self.last_event = self._clock()
        if rv:
            self.resource_version = rv
        if etype == DELETED and key is not None and self._cache.discard(key):
            return
        self._skip_object("malformed", key, rv)

    def _watch_error(self, status: Any) -> None:
        stop = watch_error_stop(status)
        code, reason, message = _status_fields(status)
        if stop.reason == "expired":
            log.info("informer %s: watch expired (%s); relisting", self.name, message)
        else:
            log.warning(
                "informer %s: watch ERROR event %s %s: %s; relisting", self.name, code, reason, message
            )
        raise stop

    def _skip_object(self, reason: str, key: str | None, rv: str) -> None:
        self.counters.skipped[reason] += 1
        if key is not None:
            if self._logged.first(key, rv):
                log.warning(
                    "informer %s: skipped %s object %s (rv %s)",
                    self.name,
                    reason,
                    short(key),
                    short(rv or "?"),
                )
            return
        suppressed = self._rate.allow(reason)
        if suppressed is not None:
            log.warning(
                "informer %s: skipped a %s watch line or object without a usable name (%d more not logged)",
                self.name,
                reason,
                suppressed,
            )
