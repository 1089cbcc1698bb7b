"""ServedLedger: which counted events a scrape has shown, and the watermark that hands over exactly those.

A count only exists for PromQL once a scrape has stored it: an event counted after the last scrape that
reached a leader dies with that leader's series. So the leader does not publish "the highest rv counted"
but the **served watermark**, per watch stream: the highest rv ``r`` such that every event with rv <= r
that this term counted was *served*, which means:

* *rendered*: a served render (``TrainerMetricState.render_text`` / ``render_openmetrics`` /
  ``render_protobuf`` / ``render_parts``, one per scrape) at some time ``s`` showed it: the body contained
  it and none of its series was still held at zero (app/metrics/series_cache.py, born at zero); then
* *seen*: ``hold`` seconds have passed since ``s``. Every scraper whose interval is at most ``hold``
  scraped a body rendered in ``[s, s + hold]``, and that body shows the event too (counts only grow
  within a term). With ``hold`` 0 the render itself counts (one scraper).

The next leader counts every remembered event above it (app/handover/journal.py): what a scrape did not
show yet is counted again where a scrape will show it, and nothing is shown twice.

"Every event with rv <= r" means every event that *may have happened* at or below ``r``, because the next
leader compares its own copy of the event, seen on its own watch at the rv the edge happened at. An edge a
relist found (``since`` set, app/trainer/events.py) carries the rv of the job as listed, which can be far
above the edge: it happened somewhere after ``since``. So until it is seen it holds the watermark at
``since``, not just below its ``rv``; otherwise a crash would leave its only count unseen while the next
leader skipped its own copy, at an rv between the two, as counted (a lost increment).

The ledger sits between the CountJournal and the TrainerMetricState (a ``TrainerSink``), so it sees exactly
what is counted, in order. Costs: O(log n) per counted event; a served render costs O(events counted or
released since the previous one). An event whose series is held waits in a list of that series until the
render that releases it, so an event in a series shown long ago is never delayed by a newer series.

Bounded: at most ``max_tracked`` events wait to be seen. A leader nobody scrapes would otherwise grow
without end; beyond it they are all forgotten *as not seen*: the watermark of each stream stays below
them (the next leader replays them from its journal, which is bounded the same) until they are seen as a
whole: the first served render after the forgetting in which none of their series is held any more shows
every one of them (counts only grow within a term), and once ``hold`` has passed since it, every scraper
has seen them. Without that, a take-over that replays a full journal, or a burst while scrapes lag, would
freeze the watermark for the rest of the term, and the next leader would count again what the scrapes had
shown.

Everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Protocol

from app.trainer.events import CountableEvent, GaugeKey

__all__ = ["ServedLedger", "ServedTarget"]

log = logging.getLogger(__name__)

SeriesRef = tuple[str, tuple[str, ...]]
_Item = tuple[str, int]  # (stream, lowest rv it may have happened at) of one counted event


class ServedTarget(Protocol):
    """What the ledger needs of the metric state (TrainerMetricState implements it)."""

    def count(self, event: CountableEvent) -> SeriesRef | None:
        """Count ``event``; a series it incremented that is still shown as zeros, or None."""
        ...

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None: ...

    def on_runtimes_changed(self) -> None: ...

    def held_series_of(self, event: CountableEvent) -> SeriesRef | None: ...

    def add_served_listener(self, listener: Callable[[float, list[SeriesRef]], None]) -> None: ...


class ServedLedger:
    """A ``TrainerSink`` forwarding to ``target`` that tracks what the served renders have shown."""

    def __init__(
        self,
        target: ServedTarget,
        *,
        hold: float,
        stream_of: Callable[[CountableEvent], str],
        max_tracked: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not hold >= 0:
            raise ValueError("hold must be >= 0")
        self._target = target
        self._hold = hold
        self._stream_of = stream_of
        self._max_tracked = max(1, max_tracked)
        self._clock = clock
        target.add_served_listener(self._on_served)
        self.last_render: float | None = None  # clock() of the last served render (any term)
        self._waiters: list[asyncio.Future[None]] = []
        self._reset_term()

    def _reset_term(self) -> None:
        # Per stream: a min-heap of the rvs counted and not yet seen (lazy deletion: ``_seen`` counts
        # the rvs seen but still in the heap), and the cap left by forgotten events.
        self._heaps: dict[str, list[int]] = {}
        self._seen: dict[str, Counter[int]] = {}
        self._stuck: dict[str, int] = {}
        # Counted, shown by no served render yet: waiting for the next render, or for a series' release.
        self._unrendered: list[_Item] = []
        self._parked: dict[SeriesRef, list[tuple[_Item, CountableEvent]]] = {}
        # (render time, events it showed first), in time order: seen once hold has passed.
        self._rendered: deque[tuple[float, list[_Item]]] = deque()
        self._tracked = 0  # counted this term and not seen yet
        self._order: deque[_Item] = deque()  # only while over max_tracked: oldest first, to forget
        # While ``_stuck``: the forgotten events a held series keeps from the renders, and the time of
        # the first render that showed every forgotten event (None: not yet).
        self._stuck_held: list[CountableEvent] = []
        self._stuck_shown_at: float | None = None

    # --- TrainerSink -------------------------------------------------------------------------------

    def on_countable(self, event: CountableEvent) -> None:
        held = self._target.count(event)
        # Tracked at the lowest rv the edge may have happened at: an edge a relist found happened after
        # ``since`` (app/trainer/events.py), and another replica's watch saw it there, not at ``rv``.
        since = event.since
        item = (self._stream_of(event), since + 1 if since else event.rv)
        heapq.heappush(self._heaps.setdefault(item[0], []), item[1])
        self._tracked += 1
        if held is None:
            self._unrendered.append(item)
        else:
            self._parked.setdefault(held, []).append((item, event))
        if self._tracked > self._max_tracked:
            self._forget_all()

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None:
        self._target.on_jobs_gauge(key, value)

    def on_runtimes_changed(self) -> None:
        self._target.on_runtimes_changed()

    # --- terms and views ---------------------------------------------------------------------------

    def start_term(self) -> None:
        """A new leader term (its metric state counts from zero): forget the previous term's events."""
        self._reset_term()

    @property
    def hold(self) -> float:
        return self._hold

    @property
    def unseen(self) -> int:
        """Events this term counted that not every scraper has seen yet (tracked ones)."""
        self._advance(self._clock())
        return self._tracked

    def all_seen(self) -> bool:
        """Every event this term counted has been seen: the served watermarks equal the counted ones."""
        return self.unseen == 0 and not self._stuck

    def watermarks(self, counted: Mapping[str, int]) -> dict[str, int]:
        """The served watermarks: per stream of ``counted`` (the journal's, which already keeps at the
        floor while it holds uncertain events), lowered below the lowest rv at which an event counted this
        term and not seen yet may have happened (``since`` + 1 for an edge a relist found)."""
        self._advance(self._clock())
        out = dict(counted)
        for stream, rv in out.items():
            lowest = self._lowest_unseen(stream)
            if lowest is not None and lowest <= rv:
                out[stream] = lowest - 1
            stuck = self._stuck.get(stream)
            if stuck is not None and stuck <= out[stream]:
                out[stream] = stuck - 1
        return out

    def next_seen_at(self) -> float | None:
        """clock() time at which the oldest rendered event, or the forgotten ones, will count as seen
        (None: none waits)."""
        oldest = self._rendered[0][0] if self._rendered else None
        due = [t + self._hold for t in (oldest, self._stuck_shown_at) if t is not None]
        return min(due) if due else None

    async def wait_change(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for the next served render."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait_for(future, max(0.0, timeout))
        except TimeoutError:
            pass
        finally:
            if future in self._waiters:
                self._waiters.remove(future)

    # --- internals ---------------------------------------------------------------------------------

    def _on_served(self, now: float, released: list[SeriesRef]) -> None:
        """TrainerMetricState's served listener: a render at ``now`` built the body being served."""
        self.last_render = now
        if self._stuck and self._stuck_shown_at is None:
            held_series_of = self._target.held_series_of
            self._stuck_held = [event for event in self._stuck_held if held_series_of(event) is not None]
            if not self._stuck_held:
                self._stuck_shown_at = now  # this render shows every forgotten event
        for ref in released:
            for item, event in self._parked.pop(ref, ()):
                # Released from this series; another of its series may still be held.
                held = self._target.held_series_of(event)
                if held is None:
                    self._unrendered.append(item)
                else:
                    self._parked.setdefault(held, []).append((item, event))
        if self._unrendered:
            self._rendered.append((now, self._unrendered))
            self._unrendered = []
        self._advance(now)
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def _advance(self, now: float) -> None:
        limit = now - self._hold
        if self._stuck_shown_at is not None and self._stuck_shown_at <= limit:
            self._stuck.clear()  # every forgotten event is seen: they no longer hold the watermarks
            self._stuck_shown_at = None
        rendered = self._rendered
        while rendered and rendered[0][0] <= limit:
            for stream, rv in rendered.popleft()[1]:
                self._seen.setdefault(stream, Counter())[rv] += 1
                self._tracked -= 1

    def _lowest_unseen(self, stream: str) -> int | None:
        heap = self._heaps.get(stream)
        if not heap:
            return None
        seen = self._seen.get(stream)
        while heap and seen and seen[heap[0]]:
            rv = heapq.heappop(heap)
            seen[rv] -= 1
            if not seen[rv]:
                del seen[rv]
        return heap[0] if heap else None

    def _forget_all(self) -> None:
        """Over ``max_tracked``: forget every event waiting, as not seen. Each stream's watermark stays
        below the lowest of them until a render shows them all and the hold passes (the module docstring);
        events counted later are tracked again."""
        stuck = dict(self._stuck)
        held = self._stuck_held + [event for waiting in self._parked.values() for _, event in waiting]
        for stream in list(self._heaps):
            lowest = self._lowest_unseen(stream)
            if lowest is not None:
                stuck[stream] = min(stuck.get(stream, lowest), lowest)
        log.warning(
            "more than %d counted events wait for a scrape (is the leader scraped?): the hand-over "
            "watermarks stay at %s until a scrape has shown them all",
            self._max_tracked,
            {stream or "(all namespaces)": rv - 1 for stream, rv in stuck.items()},
        )
        self._reset_term()
        self._stuck = stuck
        self._stuck_held = held
