"""Generic list+watch cache, ``Informer[T]``: client-go's Reflector + store + handler dispatch, in asyncio.

Behaviour (k8s-protocol.md §2 and §6):
- LIST pages (``limit``/``continue``), then Replace: the cache is diffed against the list, so a relist tells
  handlers exactly what changed while the watch was down (added / updated / deleted with last state).
- WATCH from the list's ``metadata.resourceVersion`` (never from a max over items), with bookmarks and a
  random server-side ``timeoutSeconds``; a client-side inactivity bound (aiohttp ``sock_read``) catches
  half-open connections that would otherwise hang forever.
- A clean end of stream, a reset or an inactive connection resumes from the last RV without relisting;
  410 Expired and other errors relist; refused connections and 429 back off and resume.
- Every line is decoded straight into the projector's msgspec wire type; anything that fails takes a
  tolerant path (orjson + ``projector.from_json``), and what is still unusable is skipped and counted.
  Nothing a server sends can raise out of ``run()``.

The informer knows nothing of what it caches: ``T`` only needs ``key``, ``uid`` and ``resource_version``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import aiohttp
import msgspec
import orjson

from app.kube.backoff import Backoff
from app.kube.client import ApiError, KubeClient
from app.kube.informer_telemetry import InformerCounters, InformerTelemetry
from app.kube.resources import ResourceKind

if TYPE_CHECKING:
    from app.config import Settings

log = logging.getLogger(__name__)


# --- contracts -------------------------------------------------------------------------------------


class KubeObject(Protocol):
    """What the informer needs of a cached projection."""

    @property
    def key(self) -> str: ...  # "namespace/name", or "name" when cluster-scoped
    @property
    def uid(self) -> str: ...
    @property
    def resource_version(self) -> str: ...


T = TypeVar("T", bound=KubeObject)
T_co = TypeVar("T_co", bound=KubeObject, covariant=True)
T_contra = TypeVar("T_contra", bound=KubeObject, contravariant=True)
W = TypeVar("W")


class Projector(Protocol[T_co]):
    """Optional extensions, looked up with ``getattr`` (a projector without them works as before):

    - ``wire_key(wire) -> str``: the key the projection of ``wire`` will have. When present the informer
      passes the cached projection under that key (or None) as ``from_wire(wire, previous)``, so the
      projector can reuse what an update did not change;
    - ``same_uid(a, b) -> bool``: ``a.uid == b.uid``, for projections that store the uid compactly.
    """

    # msgspec Struct for one object (typed fast path), with only the fields the caller needs.
    wire_type: type

    def from_wire(self, wire: Any) -> T_co: ...

    def from_json(self, obj: Any) -> T_co | None:
        """Tolerant path from a JSON value; None means unusable (no key or uid)."""
        ...


class InformerHandler(Protocol[T_contra]):
    """Synchronous notifications, called on the event loop: keep them cheap. Exceptions are contained.

    Optional: ``on_relist(since: int | None)``, if the handler has it, is called before the notifications
    of a relist diff (after the initial list) with the resourceVersion the informer held before the gap,
    and with None after them."""

    def on_added(self, obj: T_contra, initial: bool) -> None: ...  # initial: part of the first LIST
    def on_updated(self, old: T_contra, new: T_contra) -> None: ...
    def on_deleted(self, last: T_contra) -> None: ...


@dataclass(frozen=True, slots=True)
class InformerOptions:
    page_size: int = 500
    watch_timeout_range: tuple[int, int] = (300, 600)  # server-side timeoutSeconds, drawn per watch
    inactivity_timeout: float = 90.0  # no byte for this long = dead watch (bookmarks come ~every 60 s)
    max_object_bytes: int = 4 * 1024 * 1024  # a longer watch line is skipped (then relist)
    backoff_base: float = 0.8
    backoff_cap: float = 30.0
    backoff_reset: float = 120.0  # failure-free time after which backoff starts small again
    list_timeout: float = 60.0  # per LIST page, end to end (servers cut non-watch requests at 60 s)
    connect_timeout: float = 10.0
    short_watch: float = 1.0  # a watch ending this fast with nothing received is a failure (no hot loop)

    @classmethod
    def from_settings(cls, settings: Settings) -> InformerOptions:
        return cls(
            page_size=settings.list_page_size,
            watch_timeout_range=(settings.watch_timeout_min_seconds, settings.watch_timeout_max_seconds),
            inactivity_timeout=settings.watch_inactivity_timeout_seconds,
            max_object_bytes=settings.max_object_bytes,
        )


# --- wire envelopes (typed fast path) -----------------------------------------------------------


class WatchEvent(msgspec.Struct, Generic[W]):
    """One watch line; ``WatchEvent[wire_type]`` decodes the object straight into the projector's type."""

    type: str
    object: W


class ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(name="continue", default="")


class ListPage(msgspec.Struct, Generic[W]):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[W] | None = None


# Retry-After is honoured, but a broken proxy asking for an hour must not park the informer that long.
_MAX_RETRY_AFTER = 60.0

_ADDED = "ADDED"
_MODIFIED = "MODIFIED"
_DELETED = "DELETED"
_OBJECT_EVENTS = frozenset((_ADDED, _MODIFIED, _DELETED))
_QUICK_RELIST_INTERVAL = 10.0  # at most one un-backed-off relist after 410 Expired per this many seconds
# Under a firehose the watch loop yields to the event loop after this many lines or this long, whichever
# comes first (a line costs ~10-30 us: a slice stays near 1 ms).
_YIELD_LINES = 64
_YIELD_SECONDS = 0.001


class _WatchStop(Exception):
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
        self.retry_after = min(retry_after or 0.0, _MAX_RETRY_AFTER)


# Ways a watch ends that need nothing but a new watch from the last RV.
_CLOSED = _WatchStop("closed")
_INACTIVE = _WatchStop("inactivity")
_RESET = _WatchStop("reset")


# Deeper JSON than the interpreter's recursion limit makes msgspec raise RecursionError, even inside
# fields it skips; one such object would otherwise fail every LIST. Retrying under a higher limit
# decodes it (msgspec's per-level C stack use is small); past that the object counts as malformed.
_DEEP_RECURSION_LIMIT = 20_000


def _decode_deep(decoder: msgspec.json.Decoder[Any], data: bytes | bytearray | memoryview) -> Any:
    try:
        return decoder.decode(data)
    except RecursionError:
        pass
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, _DEEP_RECURSION_LIMIT))
    try:
        return decoder.decode(data)
    except RecursionError as exc:
        raise msgspec.DecodeError(f"JSON nested too deeply: {exc}") from None
    finally:
        sys.setrecursionlimit(previous)


def _meta(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        meta = raw.get("metadata")
        if isinstance(meta, dict):
            return meta
    return {}


def _raw_rv(raw: Any) -> str:
    rv = _meta(raw).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def _raw_key(raw: Any) -> str | None:
    meta = _meta(raw)
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        return None
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _same_uid(a: KubeObject, b: KubeObject) -> bool:
    return a.uid == b.uid


_MAX_LOGGED_KEY = 300  # characters of a key or name in a log line (a hostile one can be megabytes)


def _short(text: str) -> str:
    return text if len(text) <= _MAX_LOGGED_KEY else f"{text[:_MAX_LOGGED_KEY]}...({len(text)} chars)"


class _LogOnce:
    """Logs a skipped object once per (key, resourceVersion); unkeyed problems at most once per interval."""

    _MAX_KEYS = 10_000  # bounded memory under a flood of distinct malformed objects

    def __init__(self, interval: float = 30.0) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def keyed(self, key: str, rv: str) -> bool:
        marker = (key, rv)
        if marker in self._seen:
            return False
        if len(self._seen) >= self._MAX_KEYS:
            self._seen.clear()
        self._seen.add(marker)
        return True

    def rate_limited(self, what: str) -> int | None:
        """None: stay quiet; else how many were suppressed since the last log line."""
        now = time.monotonic()
        if now - self._last.get(what, -1e18) < self._interval:
            self._suppressed[what] = self._suppressed.get(what, 0) + 1
            return None
        self._last[what] = now
        return self._suppressed.pop(what, 0)


# --- the informer ----------------------------------------------------------------------------------


class Informer(Generic[T]):
    def __init__(
        self,
        client: KubeClient,
        resource: ResourceKind,
        namespace: str | None,
        projector: Projector[T],
        handler: InformerHandler[T],
        *,
        options: InformerOptions | None = None,
        telemetry: InformerTelemetry | None = None,
        name: str | None = None,
        on_limit: Callable[[str], None] | None = None,
    ) -> None:
        self._client = client
        self.resource = resource
        self.namespace = namespace if resource.namespaced else None
        self._path = resource.collection_path(self.namespace)
        self._projector = projector
        self._on_limit = on_limit  # told when a safety limit drops something (self-telemetry)
        self._handler = handler
        self._options = options or InformerOptions()
        self.name = name or (f"{resource.plural}/{self.namespace}" if self.namespace else resource.plural)

        opts = self._options
        self._backoff = Backoff(opts.backoff_base, opts.backoff_cap, reset_after=opts.backoff_reset)
        self._last_quick_relist = -math.inf
        self._last_watch_silent = False  # the previous watch ended by the inactivity timeout
        # Generic msgspec Structs are parametrised at runtime with the projector's wire type.
        self._event_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            cast(Any, WatchEvent)[projector.wire_type]
        )
        self._page_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            cast(Any, ListPage)[projector.wire_type]
        )
        self._from_wire: Callable[..., T] = projector.from_wire
        # Incremental projection (see Projector): from_wire(wire, cached projection under its key).
        self._wire_key: Callable[[Any], str] | None = getattr(projector, "wire_key", None)
        self._same_uid: Callable[[T, T], bool] = getattr(projector, "same_uid", None) or _same_uid

        self._store: dict[str, T] = {}
        self.synced = False
        self.resource_version = ""
        now = time.monotonic()
        self.last_activity = now  # last byte received, list completed or watch established
        self.last_event = now  # last event, bookmark or completed list
        self._watching = False
        self._received = 0  # bytes received on the current watch ("very short watch" detection)
        self._log = _LogOnce()
        self.counters: InformerCounters = (
            telemetry.register(self) if telemetry is not None else InformerCounters()
        )

    # --- read-only state ---------------------------------------------------------------------------

    @property
    def stale(self) -> bool:
        """Nothing received for longer than the inactivity timeout (watching or not)."""
        return time.monotonic() - self.last_activity > self._options.inactivity_timeout

    @property
    def watching(self) -> bool:
        return self._watching

    def __len__(self) -> int:
        return len(self._store)

    def get(self, key: str) -> T | None:
        return self._store.get(key)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._store.items()))

    def keys(self) -> list[str]:
        return list(self._store)

    # --- main loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never raises otherwise."""
        need_list = True
        list_rv = ""  # RV for the next LIST ("" = consistent read)
        c = self.counters
        while True:
            try:
                if need_list:
                    if not await self._list_once(list_rv):
                        continue
                    need_list = False
                stop = await self._watch()
                c.watch_restarts[stop.reason] += 1
                if stop.relist is not None:
                    c.relists[stop.relist] += 1
                    need_list = True
                    list_rv = "" if stop.fresh else self.resource_version
                now = time.monotonic()
                if stop.reason == "expired" and now - self._last_quick_relist > _QUICK_RELIST_INTERVAL:
                    # 410 is the watch cache's normal horizon, not a server failure: relist soon, without
                    # growing the backoff, since a long pause is a window in which a TrainJob can finish
                    # and be deleted unseen. Repeated 410s fall back to the backoff (no relist storm).
                    self._last_quick_relist = now
                    await self._sleep(random.uniform(0.0, self._options.backoff_base))
                elif stop.backoff:
                    await self._sleep(max(self._backoff.next_delay(), stop.retry_after))
            except asyncio.CancelledError:
                self._watching = False
                raise
            except Exception:
                # A bug, not a server problem: never let it kill the informer; start over from a list.
                log.exception("informer %s: unexpected error; relisting", self.name)
                self._watching = False
                c.relists["internal"] += 1
                need_list, list_rv = True, ""
                await self._sleep(self._backoff.next_delay())

    async def _sleep(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)

    # --- LIST ----------------------------------------------------------------------------------------

    async def _list_once(self, rv: str) -> bool:
        """One LIST attempt (pages + Replace). False after a failure (already backed off)."""
        try:
            await self._list(rv)
        except ApiError as exc:
            retry_after = min(exc.retry_after or 0.0, _MAX_RETRY_AFTER)
            if exc.status == 404:
                # client-go: an absent resource (CRD not installed) counts as an empty list so readiness
                # does not hang; keep retrying in case it gets installed.
                self._replace({}, self.resource_version, set())
            self._log_api_error("list", exc)
            await self._sleep(max(self._backoff.next_delay(), retry_after))
            return False
        return True

    async def _list(self, rv: str) -> None:
        """Paginated LIST and Replace. Restarts from page 1 (consistent read) when a token expires."""
        attempts = 0
        while True:
            items: dict[str, T] = {}
            unusable: set[str] = set()
            base: dict[str, str] = {"limit": str(self._options.page_size)}
            query = dict(base)
            if rv:
                # NotOlderThan lets the watch cache serve it; the server rejects RV together with continue,
                # so later pages carry only the token (which pins the snapshot anyway).
                query["resourceVersion"] = rv
                query["resourceVersionMatch"] = "NotOlderThan"
            try:
                while True:
                    body = await self._get_page(query)
                    list_rv, cont = self._decode_page(body, items, unusable)
                    if not cont:
                        break
                    query = {**base, "continue": cont}
            except ApiError as exc:
                attempts += 1
                if attempts <= 3 and (exc.status == 410 or exc.is_too_large_resource_version):
                    # 410: continue token compacted away (or Exact RV too old); 504: our RV is ahead of
                    # the server's cache (e.g. after failover). Both: start over with a consistent read.
                    self.counters.relists["expired" if exc.status == 410 else "too_large_rv"] += 1
                    rv = ""
                    continue
                raise
            self._replace(items, list_rv, unusable)
            return

    async def _get_page(self, query: dict[str, str]) -> bytes:
        opts = self._options
        timeout = aiohttp.ClientTimeout(total=opts.list_timeout, sock_connect=opts.connect_timeout)
        try:
            async with self._client.stream(self._path, query=query, timeout=timeout) as resp:
                body = await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc) or "list read failed") from exc
        self.last_activity = time.monotonic()
        return body

    def _decode_page(self, body: bytes, items: dict[str, T], unusable: set[str]) -> tuple[str, str]:
        try:
            page = _decode_deep(self._page_decoder, body)
        except msgspec.DecodeError:
            return self._decode_page_tolerant(body, items, unusable)
        from_wire = self._from_wire
        wire_key = self._wire_key
        cached = self._store  # a relist reuses what it can of the current cache
        try:
            for wire in page.items or ():
                obj = from_wire(wire) if wire_key is None else from_wire(wire, cached.get(wire_key(wire)))
                if not obj.key:
                    raise ValueError("empty key")
                items[obj.key] = obj
        except Exception:
            # One item the projector cannot take: redo this page item by item, tolerantly.
            return self._decode_page_tolerant(body, items, unusable)
        meta: ListMeta = page.metadata
        return meta.resourceVersion, meta.continue_

    def _decode_page_tolerant(self, body: bytes, items: dict[str, T], unusable: set[str]) -> tuple[str, str]:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(200, "InvalidResponse", f"list page is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ApiError(200, "InvalidResponse", "list page is not a JSON object")
        meta = _meta(doc)
        raw_items = doc.get("items")
        if not isinstance(raw_items, list):
            if raw_items is not None:
                raise ApiError(200, "InvalidResponse", "list page has no items array")
            raw_items = []
        for raw in raw_items:
            obj = self._project_json(raw)
            if obj is not None:
                items[obj.key] = obj
                continue
            key = _raw_key(raw)
            self._skip_object("malformed", key, _raw_rv(raw))
            if key is not None:
                unusable.add(key)
        rv = meta.get("resourceVersion")
        cont = meta.get("continue")
        return (rv if isinstance(rv, str) else "", cont if isinstance(cont, str) else "")

    def _replace(self, items: dict[str, T], list_rv: str, unusable: set[str]) -> None:
        """Swap in a complete list and tell handlers what changed relative to the cache."""
        old_store = self._store
        initial = not self.synced
        # A handler that wants to know which notifications come from a relist diff (the Trainer state
        # tags the edges it finds there with the rv held before the gap) gets told around the diff.
        on_relist = None if initial else getattr(self._handler, "on_relist", None)
        if on_relist is not None:
            on_relist(int(self.resource_version) if self.resource_version.isdigit() else 0)
        try:
            self._apply_list(old_store, items, list_rv, unusable, initial)
        finally:
            if on_relist is not None:
                on_relist(None)

    def _apply_list(
        self, old_store: dict[str, T], items: dict[str, T], list_rv: str, unusable: set[str], initial: bool
    ) -> None:
        for key in unusable:
            # The object exists but this copy is unusable: keep our last good state rather than reporting
            # a deletion that did not happen.
            if key not in items and key in old_store:
                items[key] = old_store[key]
        self._store = items
        if list_rv:
            self.resource_version = list_rv
        for key, obj in items.items():
            old = old_store.get(key)
            if old is None:
                self._notify_added(obj, initial)
            elif old is obj:
                continue
            elif not self._same_uid(old, obj):  # deleted and recreated while we were not watching
                self._notify_deleted(old)
                self._notify_added(obj, False)
            elif old.resource_version != obj.resource_version:
                self._notify_updated(old, obj)
        for key, old in old_store.items():
            if key not in items:
                self._notify_deleted(old)
        self.synced = True
        now = time.monotonic()
        self.last_event = now
        self.last_activity = now

    # --- WATCH -------------------------------------------------------------------------------------

    async def _watch(self) -> _WatchStop:
        """One watch request, consumed until it ends; returns why it ended and what to do next."""
        opts = self._options
        lo, hi = opts.watch_timeout_range
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(random.randint(lo, max(lo, hi))),
        }
        if self.resource_version:
            query["resourceVersion"] = self.resource_version
        # sock_read is the inactivity bound (reset by every byte); no total: watches are long-lived.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=opts.connect_timeout, sock_read=opts.inactivity_timeout
        )
        started = time.monotonic()
        self._received = 0
        try:
            async with self._client.stream(self._path, query=query, timeout=timeout) as resp:
                self._watching = True
                # A new stream counts as activity, except after a watch that went silent: a stalled
                # server still answers with headers, and counting them would let a dead watch look
                # fresh after every reconnect. Then only bytes (an event, a bookmark) clear staleness.
                if not self._last_watch_silent:
                    self.last_activity = time.monotonic()
                await self._consume(resp)
            stop = _CLOSED
        except _WatchStop as exc:
            stop = exc
        except ApiError as exc:
            stop = self._classify_api_error(exc)
        except TimeoutError:  # aiohttp's sock_read timeout: no byte within inactivity_timeout
            stop = _INACTIVE
        except (aiohttp.ClientError, OSError):  # reset, payload error mid-chunk, server gone
            stop = _RESET
        finally:
            self._watching = False
        self._last_watch_silent = stop is _INACTIVE
        if (
            stop.relist is None
            and not stop.backoff
            and self._received == 0
            and time.monotonic() - started < opts.short_watch
        ):
            # client-go "very short watch": something is wrong; back off rather than hot-loop.
            stop = _WatchStop("short", backoff=True)
        return stop

    def _classify_api_error(self, exc: ApiError) -> _WatchStop:
        self._log_api_error("watch", exc)
        if exc.status == 0:  # refused, unreachable, no response headers in time
            return _WatchStop("refused", backoff=True)
        if exc.status == 429:  # APF / max-inflight: wait as told, then resume (no relist)
            return _WatchStop("throttled", backoff=True, retry_after=exc.retry_after)
        if exc.status == 410:
            return _WatchStop("expired", relist="expired", fresh=True)
        return _WatchStop(
            "error",
            relist="watch_failed",
            fresh=exc.is_too_large_resource_version,
            retry_after=exc.retry_after,
        )

    async def _consume(self, resp: aiohttp.ClientResponse) -> None:
        """Split the chunked body into lines ourselves: one await per chunk, not per event.

        ``readany()`` does not suspend while data is buffered, so under a firehose the informer yields
        to the loop itself: every ``_YIELD_LINES`` lines or ``_YIELD_SECONDS``, checked per line, so a
        scrape, a probe or a lease renewal never waits more than about a millisecond behind it.
        """
        content = resp.content
        max_bytes = self._options.max_object_bytes
        process = self._process_line
        clock = time.monotonic
        pending = bytearray()
        slice_end = clock() + _YIELD_SECONDS
        budget = _YIELD_LINES
        while True:
            chunk = await content.readany()
            if not chunk:
                return  # clean end of stream
            now = clock()
            self.last_activity = now
            self._received += len(chunk)
            start = 0
            if pending:
                nl = chunk.find(b"\n")
                if nl < 0:
                    pending += chunk
                    if len(pending) > max_bytes:
                        self._oversized()
                    continue
                pending += memoryview(chunk)[:nl]
                if len(pending) > max_bytes:
                    self._oversized()
                process(pending)
                budget -= 1
                pending = bytearray()
                start = nl + 1
            view = memoryview(chunk)
            find = chunk.find
            while (nl := find(b"\n", start)) >= 0:
                if nl > start:
                    if nl - start > max_bytes:
                        self._oversized()
                    if budget <= 0 or clock() >= slice_end:
                        await asyncio.sleep(0)
                        slice_end = clock() + _YIELD_SECONDS
                        budget = _YIELD_LINES
                    process(view[start:nl])
                    budget -= 1
                start = nl + 1
            if start < len(chunk):
                pending += view[start:]
                if len(pending) > max_bytes:
                    self._oversized()

    def _oversized(self) -> None:
        self.counters.skipped["too_large"] += 1
        if self._on_limit is not None:
            self._on_limit("object_too_large")
        lines = self._log.rate_limited("oversized")
        if lines is not None:
            log.warning(
                "informer %s: watch line above %d bytes skipped; relisting (%d more since last report)",
                self.name,
                self._options.max_object_bytes,
                lines,
            )
        raise _WatchStop("oversized_line", relist="oversized_line")

    def _process_line(self, line: bytes | bytearray | memoryview) -> None:
        """Fast path: typed decode of ADDED/MODIFIED/DELETED. Everything else goes the tolerant way."""
        try:
            event = _decode_deep(self._event_decoder, line)
        except msgspec.DecodeError:  # includes ValidationError (wrong shape, BOOKMARK, ERROR Status)
            self._process_line_tolerant(line)
            return
        etype = event.type
        if etype in _OBJECT_EVENTS:
            try:
                wire = event.object
                wire_key = self._wire_key
                if wire_key is None:
                    obj = self._from_wire(wire)
                else:
                    obj = self._from_wire(wire, self._store.get(wire_key(wire)))
            except Exception:
                self._process_line_tolerant(line)
                return
            if obj.key:
                self._apply(etype, obj)
                return
        self._process_line_tolerant(line)

    def _process_line_tolerant(self, line: bytes | bytearray | memoryview) -> None:
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
            rv = _raw_rv(raw)
            if rv:
                self.resource_version = rv
            self.last_event = time.monotonic()
            return
        if etype == "ERROR":
            c.error += 1
            self._watch_error(raw)
        if etype not in _OBJECT_EVENTS:
            self._skip_object("malformed", None, "")
            return
        obj = self._project_json(raw)
        if obj is not None:
            self._apply(cast(str, etype), obj)
            return
        # Unusable object: keep our last good state, but do not replay it (advance the RV).
        if etype == _ADDED:
            c.added += 1
        elif etype == _MODIFIED:
            c.modified += 1
        else:
            c.deleted += 1
        self.last_event = time.monotonic()
        key, rv = _raw_key(raw), _raw_rv(raw)
        if rv:
            self.resource_version = rv
        if etype == _DELETED and key is not None:
            old = self._store.pop(key, None)
            if old is not None:
                self._notify_deleted(old)  # the cached last state stands in for the unusable one
                return
        self._skip_object("malformed", key, rv)

    def _watch_error(self, status: Any) -> None:
        code = status.get("code") if isinstance(status, dict) else None
        reason = status.get("reason") if isinstance(status, dict) else None
        message = status.get("message") if isinstance(status, dict) else None
        if code == 410 or reason in ("Expired", "Gone"):
            log.info("informer %s: watch expired (%s); relisting", self.name, message)
            raise _WatchStop("expired", relist="expired", fresh=True)
        too_large = (
            code == 504 and isinstance(message, str) and "too large resource version" in message.lower()
        )
        log.warning("informer %s: watch ERROR event %s %s: %s; relisting", self.name, code, reason, message)
        raise _WatchStop("error", relist="watch_error", fresh=too_large)

    def _project_json(self, raw: Any) -> T | None:
        try:
            obj = self._projector.from_json(raw)
        except Exception:  # the contract says None, but a projector bug must not break the informer
            return None
        if obj is None or not obj.key:
            return None
        return obj

    def _apply(self, etype: str, obj: T) -> None:
        """Apply one object event to the cache and notify; the server's event type is not authoritative."""
        c = self.counters
        store = self._store
        key = obj.key
        rv = obj.resource_version
        if rv:
            self.resource_version = rv  # for DELETED this is the deletion RV
        self.last_event = self.last_activity
        handler = self._handler
        if etype == _DELETED:
            c.deleted += 1
            old = store.pop(key, None)
            if old is not None:  # client-go ignores deletes of unknown keys
                self._notify_deleted(obj if self._same_uid(old, obj) else old)
            return
        if etype == _MODIFIED:
            c.modified += 1
        else:
            c.added += 1
        old = store.get(key)
        store[key] = obj
        try:
            if old is None:
                handler.on_added(obj, False)
            elif not self._same_uid(old, obj):  # missed delete + create: report both
                self._notify_deleted(old)
                handler.on_added(obj, False)
            elif old.resource_version != rv:
                handler.on_updated(old, obj)
        except Exception:
            self._handler_failed("event", obj)

    # --- notifications -----------------------------------------------------------------------------

    def _notify_added(self, obj: T, initial: bool) -> None:
        try:
            self._handler.on_added(obj, initial)
        except Exception:
            self._handler_failed("on_added", obj)

    def _notify_updated(self, old: T, new: T) -> None:
        try:
            self._handler.on_updated(old, new)
        except Exception:
            self._handler_failed("on_updated", new)

    def _notify_deleted(self, last: T) -> None:
        try:
            self._handler.on_deleted(last)
        except Exception:
            self._handler_failed("on_deleted", last)

    def _handler_failed(self, what: str, obj: T) -> None:
        self.counters.skipped["handler_error"] += 1
        if self._log.keyed("handler:" + obj.key, obj.resource_version):
            log.exception(
                "informer %s: handler %s failed for %s (rv %s)",
                self.name,
                what,
                _short(obj.key),
                _short(obj.resource_version),
            )

    def _skip_object(self, reason: str, key: str | None, rv: str) -> None:
        self.counters.skipped[reason] += 1
        if key is not None:
            if self._log.keyed(key, rv):
                log.warning(
                    "informer %s: skipped %s object %s (rv %s)",
                    self.name,
                    reason,
                    _short(key),
                    _short(rv or "?"),
                )
            return
        suppressed = self._log.rate_limited(reason)
        if suppressed is not None:
            log.warning(
                "informer %s: skipped a %s watch line or object without a usable name (%d more not logged)",
                self.name,
                reason,
                suppressed,
            )

    def _log_api_error(self, what: str, exc: ApiError) -> None:
        suppressed = self._log.rate_limited(f"{what}:{exc.status}")
        if suppressed is not None:
            log.warning(
                "informer %s: %s failed: %s (%d similar not logged)", self.name, what, exc, suppressed
            )
