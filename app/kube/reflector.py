"""The list/watch loop behind ``Informer[T]``: client-go's Reflector, in asyncio.

The I/O half (app/kube/ingest.py applies what arrives). docs/design/k8s-protocol.md §2 and §6:
- LIST pages (``limit``/``continue``), restarted from page 1 with a consistent read when a continue
  token expires (410) or our RV is ahead of the server's cache (504).
- WATCH from the list's ``metadata.resourceVersion`` (never from a max over items), with bookmarks and a
  random server-side ``timeoutSeconds``; a client-side inactivity bound (aiohttp ``sock_read``) catches
  half-open connections that would otherwise hang forever.
- A clean end of stream, a reset or an inactive connection resumes from the last RV without relisting;
  410 Expired and other errors relist; refused connections and 429 back off and resume; a watch that
  ends at once with nothing received backs off too (no hot loop).
- Stale: nothing received for longer than the inactivity timeout, watching or not.
- Streaming list (``streaming_list``, k8s-protocol.md §2): the LIST replaced by a watch with
  ``sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true`` from "" or the
  RV held; its ADDEDs are a LIST's items and its ``k8s.io/initial-events-end`` bookmark completes the
  list (app/kube/ingest.py), after which the same stream is the watch. In auto mode (None) a server that
  refuses it (400/405/415/422) or never sends that bookmark within ``initial_events_timeout`` makes the
  informer log once and use the paginated LIST from then on.
- Nothing a server sends can raise out of ``run()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Generic, Protocol, TypeVar

import aiohttp

from app.kube.backoff import Backoff
from app.kube.cache import KubeObject
from app.kube.client import ApiError
from app.kube.informer_telemetry import InformerCounters
from app.kube.ingest import MAX_RETRY_AFTER, Ingest, WatchStop
from app.kube.lines import LineSplitter
from app.kube.logthrottle import RateLimit
from app.kube.priority import LoopPriority

log = logging.getLogger(__name__)

T = TypeVar("T", bound=KubeObject)


class ByteStream(Protocol):
    """A response body; a streaming list uses ``read(n)`` (up to n bytes, b"" at the end) if it has one."""

    async def readany(self) -> bytes: ...


class StreamResponse(Protocol):
    @property
    def content(self) -> ByteStream: ...

    async def read(self) -> bytes: ...


class StreamClient(Protocol):
    """What the reflector needs of ``KubeClient``: a GET whose 2xx body is read incrementally."""

    def stream(
        self, path: str, *, query: Mapping[str, str], timeout: aiohttp.ClientTimeout
    ) -> AbstractAsyncContextManager[StreamResponse]: ...


_QUICK_RELIST_INTERVAL = 10.0  # at most one un-backed-off relist after 410 Expired per this many seconds
# Under a firehose the watch loop yields to the event loop after this many lines or this long, whichever
# comes first (a line costs ~10-30 us: a slice stays near 1 ms).
_YIELD_LINES = 64
_YIELD_SECONDS = 0.001


READ_BYTES = 256 * 1024  # at most this much of a watch body per read (see _consume)


# A streaming list the server does not support: it rejects the parameters (older servers, the WatchList
# gate off: 422 Forbidden/NotSupported per [VAL]; proxies: 400, 405, 415).
_REFUSALS = frozenset((400, 405, 415, 422))

# Ways a watch ends that need nothing but a new watch from the last RV.
_CLOSED = WatchStop("closed")
_INACTIVE = WatchStop("inactivity")
_RESET = WatchStop("reset")
# A streaming list whose initial-events-end bookmark did not come in time (never counted as a restart).
_NO_END_BOOKMARK = WatchStop("inactivity", backoff=True)


def _no_deadline(bound: asyncio.Timeout) -> None:
    with contextlib.suppress(RuntimeError):  # already expiring: the sync fails as it would have
        bound.reschedule(None)


def api_error_stop(exc: ApiError) -> WatchStop:
    """What a failed watch request means for the next step."""
    if exc.status == 0:  # refused, unreachable, no response headers in time
        return WatchStop("refused", backoff=True)
    if exc.status == 429:  # APF / max-inflight: wait as told, then resume (no relist)
        return WatchStop("throttled", backoff=True, retry_after=exc.retry_after)
    if exc.status == 410:
        return WatchStop("expired", relist="expired", fresh=True)
    return WatchStop(
        "error", relist="watch_failed", fresh=exc.is_too_large_resource_version, retry_after=exc.retry_after
    )


class Reflector(Generic[T]):
    """Lists and watches one collection until cancelled, feeding what arrives to ``ingest`` (which
    holds the resourceVersion, sync state and activity times). Adds ``watching`` and ``stale``."""

    def __init__(
        self,
        client: StreamClient,
        path: str,
        ingest: Ingest[T],
        counters: InformerCounters,
        *,
        name: str,
        page_size: int,
        watch_timeout_range: tuple[int, int],
        inactivity_timeout: float,
        max_object_bytes: int,
        list_timeout: float,
        connect_timeout: float,
        short_watch: float,
        backoff: Backoff,
        clock: Callable[[], float],
        on_limit: Callable[[str], None] | None = None,
        streaming_list: bool | None = False,
        initial_events_timeout: float = 300.0,
        priority: LoopPriority | None = None,
        label_selector: str | None = None,
    ) -> None:
        """``label_selector``: sent with every LIST and watch (``labelSelector``): only the matching
        objects are listed, watched and cached."""
        self._client = client
        self._selector: dict[str, str] = {"labelSelector": label_selector} if label_selector else {}
        # Where ingestion yields: to urgent work (a scrape) when one is under way (priority.py).
        self._priority = priority if priority is not None else LoopPriority()
        self._path = path
        self._ingest = ingest
        self.counters = counters
        self.name = name
        self._page_size = page_size
        self._watch_timeout_range = watch_timeout_range
        self.inactivity_timeout = inactivity_timeout
        self._max_object_bytes = max_object_bytes
        self._list_timeout = list_timeout
        self._connect_timeout = connect_timeout
        self._short_watch = short_watch
        self._backoff = backoff
        self._clock = clock
        self._on_limit = on_limit  # told when a safety limit drops something (self-telemetry)
        self._watching = False
        self._received = 0  # bytes received on the current watch ("very short watch" detection)
        self._last_watch_silent = False  # the previous watch ended by the inactivity timeout
        self._last_quick_relist = -math.inf
        self._rate = RateLimit(clock=clock)
        # None = auto (try, fall back for good), True = always, False = paginated LIST only.
        self._streaming_list = streaming_list
        self._initial_events_timeout = initial_events_timeout
        self._list_once_next = False  # the next sync only uses the paginated LIST (see _sync_failed)
        self._watch_api_error: ApiError | None = None  # the last watch request's HTTP error, if any

    @property
    def streaming(self) -> bool:
        """Syncs use the streaming list (not disabled, nor fallen back to the paginated LIST)."""
        return self._streaming_list is not False

    @property
    def watching(self) -> bool:
        return self._watching

    @property
    def stale(self) -> bool:
        """Nothing received for longer than the inactivity timeout (watching or not)."""
        return self._clock() - self._ingest.last_activity > self.inactivity_timeout

    # --- main loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never raises otherwise."""
        need_list = True
        list_rv = ""  # RV for the next LIST ("" = consistent read)
        c = self.counters
        while True:
            try:
                if need_list and (not self.streaming or self._list_once_next):
                    self._list_once_next = False
                    if not await self._list_once(list_rv):
                        continue
                    need_list = False
                if need_list:
                    stop = await self._watch(sync_from=list_rv)
                    if self._ingest.collecting:  # ended before the initial-events-end bookmark
                        self._ingest.abort_initial()
                        c.sync_failures["streaming"] += 1
                        if stop.fresh:
                            list_rv = ""
                        await self._sync_failed(stop)
                        continue
                    need_list = False
                else:
                    stop = await self._watch()
                c.watch_restarts[stop.reason] += 1
                if stop.relist is not None:
                    c.relists[stop.relist] += 1
                    need_list = True
                    list_rv = "" if stop.fresh else self._ingest.resource_version
                now = self._clock()
                if stop.reason == "expired" and now - self._last_quick_relist > _QUICK_RELIST_INTERVAL:
                    # 410 is the watch cache's normal horizon, not a server failure: relist soon, without
                    # growing the backoff, since a long pause is a window in which an object can change
                    # and be deleted unseen. Repeated 410s fall back to the backoff (no relist storm).
                    self._last_quick_relist = now
                    await self._sleep(random.uniform(0.0, self._backoff.base))
                elif stop.backoff:
                    await self._sleep(max(self._backoff.next_delay(), stop.retry_after))
            except asyncio.CancelledError:
                self._watching = False
                self._ingest.abort_initial()
                raise
            except Exception:
                # A bug, not a server problem: never let it kill the informer; start over from a list.
                log.exception("informer %s: unexpected error; relisting", self.name)
                self._watching = False
                self._ingest.abort_initial()
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
            self.counters.sync_failures["list"] += 1
            retry_after = min(exc.retry_after or 0.0, MAX_RETRY_AFTER)
            if exc.status == 404:
                # client-go: an absent resource (CRD not installed) counts as an empty list so readiness
                # does not hang; keep retrying in case it gets installed.
                self._ingest.replace({}, self._ingest.resource_version, set())
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
            base: dict[str, str] = {"limit": str(self._page_size), **self._selector}
            query = dict(base)
            if rv:
                # NotOlderThan lets the watch cache serve it; the server rejects RV together with continue,
                # so later pages carry only the token (which pins the snapshot anyway).
                query["resourceVersion"] = rv
                query["resourceVersionMatch"] = "NotOlderThan"
            try:
                while True:
                    body = await self._get_page(query)
                    too_large = self.counters.skipped["too_large"]
                    list_rv, cont = self._ingest.list_page(
                        body, items, unusable, max_object_bytes=self._max_object_bytes
                    )
                    self._count_limit_hits(self.counters.skipped["too_large"] - too_large)
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
            self._ingest.replace(items, list_rv, unusable)
            return

    async def _get_page(self, query: dict[str, str]) -> bytes:
        timeout = aiohttp.ClientTimeout(total=self._list_timeout, sock_connect=self._connect_timeout)
        try:
            async with self._client.stream(self._path, query=query, timeout=timeout) as resp:
                body = await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc) or "list read failed") from exc
        self._ingest.last_activity = self._clock()
        return body

    # --- streaming list ------------------------------------------------------------------------------

    async def _sync_failed(self, stop: WatchStop) -> None:
        """A streaming list ended before it was complete: what the next sync does, after what pause.

        Like a failed LIST: nothing is applied, the next sync starts over. In auto mode a refusal or a
        missing end bookmark switches to the paginated LIST for good (logged once); an object too large
        for a watch line (whose key a LIST can still tell, so the cache keeps its last state) makes the
        next sync alone a LIST.
        """
        exc = self._watch_api_error
        refused = exc is not None and exc.status in _REFUSALS
        if self._streaming_list is None and (refused or stop is _NO_END_BOOKMARK):
            self._streaming_list = False
            why = (
                f"refused ({exc})"
                if refused
                else (f"no initial-events-end bookmark within {self._initial_events_timeout:g} s")
            )
            log.warning("informer %s: streaming list unavailable: %s; using paginated LIST", self.name, why)
            return
        if stop.reason == "oversized_line":
            self._list_once_next = True
            return
        if exc is not None and exc.status == 404:
            # As for a LIST: an absent resource counts as an empty list (readiness must not hang).
            self._ingest.replace({}, self._ingest.resource_version, set())
        if stop is _NO_END_BOOKMARK:
            log.warning(
                "informer %s: no initial-events-end bookmark within %g s; retrying",
                self.name,
                self._initial_events_timeout,
            )
        await self._sleep(max(self._backoff.next_delay(), stop.retry_after))

    # --- WATCH -------------------------------------------------------------------------------------

    async def _watch(self, sync_from: str | None = None) -> WatchStop:
        """One watch request, consumed until it ends; returns why it ended and what to do next.

        ``sync_from``: a streaming list from that resourceVersion ("" = a consistent read) instead of a
        watch from the RV held; it is complete once ``self._ingest.collecting`` is False again.
        """
        lo, hi = self._watch_timeout_range
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(random.randint(lo, max(lo, hi))),
            **self._selector,
        }
        rv = self._ingest.resource_version if sync_from is None else sync_from
        if rv:
            query["resourceVersion"] = rv
        if sync_from is not None:
            query["sendInitialEvents"] = "true"
            query["resourceVersionMatch"] = "NotOlderThan"
        # The whole initial-events phase is bounded (a server that ignores sendInitialEvents never ends
        # it); from the end bookmark on, the stream is an ordinary watch without a deadline.
        bound = asyncio.timeout(self._initial_events_timeout if sync_from is not None else None)
        self._watch_api_error = None
        # sock_read is the inactivity bound (reset by every byte); no total: watches are long-lived.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._connect_timeout, sock_read=self.inactivity_timeout
        )
        started = self._clock()
        self._received = 0
        try:
            if sync_from is not None:  # collecting from now: a request that fails is a sync not done
                self._ingest.begin_initial(partial(_no_deadline, bound))
            async with bound, self._client.stream(self._path, query=query, timeout=timeout) as resp:
                self._watching = True
                # A new stream counts as activity, except after a watch that went silent: a stalled
                # server still answers with headers, and counting them would let a dead watch look
                # fresh after every reconnect. Then only bytes (an event, a bookmark) clear staleness.
                if not self._last_watch_silent:
                    self._ingest.last_activity = self._clock()
                await self._consume(resp.content)
            stop = _CLOSED
        except WatchStop as exc:
            stop = exc
        except ApiError as exc:
            self._watch_api_error = exc
            if sync_from is None or exc.status not in _REFUSALS or self._streaming_list is not None:
                self._log_api_error("watch", exc)
            stop = api_error_stop(exc)
        except TimeoutError:  # aiohttp's sock_read timeout: no byte within inactivity_timeout
            stop = _NO_END_BOOKMARK if bound.expired() else _INACTIVE
        except (aiohttp.ClientError, OSError):  # reset, payload error mid-chunk, server gone
            stop = _RESET
        finally:
            self._watching = False
        self._last_watch_silent = stop is _INACTIVE
        if (
            stop.relist is None
            and not stop.backoff
            and self._received == 0
            and self._clock() - started < self._short_watch
        ):
            # client-go "very short watch": something is wrong; back off rather than hot-loop.
            stop = WatchStop("short", backoff=True)
        return stop

    async def _consume(self, content: ByteStream) -> None:
        """Read the chunked body, one await per chunk, not per event; lines go to the ingest.

        A read does not suspend while data is buffered, so under a firehose the reflector yields
        to the loop itself: every ``_YIELD_LINES`` lines or ``_YIELD_SECONDS``, checked per line, so a
        scrape, a probe or a lease renewal never waits more than about a millisecond behind it; and at
        once when a request has arrived or is being answered (``LoopPriority.wanted``, also per line).
        """
        split = LineSplitter(self._max_object_bytes).feed
        ingest = self._ingest
        process = ingest.process_line
        clock = self._clock
        priority = self._priority
        slice_end = clock() + _YIELD_SECONDS
        budget = _YIELD_LINES
        # Bounded reads where the stream offers them (aiohttp's): readany() joins all that is buffered, and
        # kubernetes-asyncio's session buffers up to 4 MiB, so a reflector behind a firehose got 4 MB chunks
        # whose split was one 1-2 ms step that could not yield (bench P5: loop stalls > 5 ms fell from ~25
        # to ~10 per window with 256 KB reads), and a streaming list's initial events made the heap up to
        # ~200 B per cached object larger for good (measured at 50k-100k).
        bounded = getattr(content, "read", None)
        while True:
            chunk = await (bounded(READ_BYTES) if bounded is not None else content.readany())
            if not chunk:
                return  # clean end of stream
            ingest.last_activity = clock()
            self._received += len(chunk)
            lines, oversized = split(chunk)
            for line in lines:
                if priority.wanted or budget <= 0 or clock() >= slice_end:
                    await priority.yield_to_urgent()
                    slice_end = clock() + _YIELD_SECONDS
                    budget = _YIELD_LINES
                process(line)
                budget -= 1
            if oversized:
                self._oversized()
            # Nothing may pin the chunk while the next one is awaited: after a streaming list's initial
            # events it can be megabytes (aiohttp joins what it buffered), held until the next bookmark.
            chunk = line = b""
            lines = []

    def _count_limit_hits(self, objects_too_large: int) -> None:
        if self._on_limit is not None:
            for _ in range(objects_too_large):
                self._on_limit("object_too_large")

    def _oversized(self) -> None:
        self.counters.skipped["too_large"] += 1
        self._count_limit_hits(1)
        lines = self._rate.allow("oversized")
        if lines is not None:
            log.warning(
                "informer %s: watch line above %d bytes skipped; relisting (%d more since last report)",
                self.name,
                self._max_object_bytes,
                lines,
            )
        raise WatchStop("oversized_line", relist="oversized_line")

    # --- throttled logging -------------------------------------------------------------------------

    def _log_api_error(self, what: str, exc: ApiError) -> None:
        suppressed = self._rate.allow(f"{what}:{exc.status}")
        if suppressed is not None:
            log.warning(
                "informer %s: %s failed: %s (%d similar not logged)", self.name, what, exc, suppressed
            )
