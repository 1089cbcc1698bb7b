"""CountJournal: leader-gated counting with a gap-free hand-over between replicas.

Every replica runs the informers and TrainerState, so every replica sees the same countable events
(JobCreated, JobFinished), each tagged with the resourceVersion (``rv``) of the TrainJob state that
produced it. Only the leader may count them, or ``sum()`` over replicas would double. The journal sits
between TrainerState and TrainerMetricState on every replica:

* gauge and runtime changes go straight through, always: the metric state stays warm on followers, so
  a new leader exports correct gauges at once;
* countable events are remembered in a bounded journal (the last ``journal_size`` of them) whether
  leading or not; while leading they are also counted at once and ``watermark`` (highest rv counted)
  advances;
* ``start_leading(previous_watermark)`` counts the remembered events with ``rv > previous_watermark``
  (but those a scrape of this replica showed, see Terms), then counts live events with
  ``rv > previous_watermark``;
  a live event with ``rv <= previous_watermark`` was already counted by the previous leader (it reached
  this replica late) and is skipped;
* ``pause_counting()`` stops counting but keeps leading (a graceful stop, while the last counts are
  being scraped: app/replica/service.py); ``stop_leading()`` stops counting at once and returns the watermark.

The elector is expected to publish watermarks with every Lease renewal (and the final ones when it
releases the Lease), and to pass the published value to the next leader (app/handover/watermarks.py).
The service publishes the *served* watermarks (app/handover/served.py: ``watermarks`` lowered below what
no scrape has shown yet), so "counted" below means "counted and shown to every scraper" for whoever
takes over; ``watermarks`` here is the counted one.

Terms. The metric state counts each leader term from zero (app/metrics/trainer_metrics.py), so what an
earlier term of this replica counted is not in its series any more. An entry remembers whether a scrape
of this replica showed its count (``seen``, marked by ``stop_leading(seen=...)``); a later term replays
an entry above its floor unless it was seen, or counted in this very term.

Guarantee:

* graceful hand-over (the old leader stops, publishes its final watermark, the new one starts from it):
  nothing lost, nothing counted twice: the old leader counted exactly the events with rv up to its
  watermark, the new one counts exactly those above it;
* crash or lost Lease (the last published watermark is older than what the old leader counted):
  nothing lost; the events counted by the old leader above its last publication are counted again by
  the new leader (with served watermarks: those of about the last hold + scrape interval + renew
  period; only those a scrape had shown count twice in PromQL, docs/leadership.md);
* a replica that leads again never shows twice what a scrape showed of its own counts (journal entries
  are marked ``seen``); what it counted but no scrape showed is counted again if above the floor.

Memory. The journal forgets what no take-over of this replica can replay (``forget_through``): the
events at or below the highest watermark seen in the Lease (app/handover/handover.py calls it with every
Lease record read, the leader's own renewals included). Every floor this replica can take over from is at
least that (``LeaseWatermarks.takeover_floor`` never returns less), and an event at or below the floor is
skipped whatever else is true of it (``_verdict``), so forgetting it changes nothing but memory. What stays
is the hand-over lag: the events above the last published watermark, normally those of the last renew
period + hold + scrape interval (a few hundred), all ``journal_size`` of them only while no watermark is
published (no leader, or one nobody scrapes). The uid of each remembered event is interned
(``sys.intern``): the events of one TrainJob share one string instead of a fresh one each. Worst case,
``journal_size`` entries of about 300 bytes each (entry, event, shared strings): ~30 MB at 100,000.

Limits:

* the journal holds ``journal_size`` events; a takeover after a longer leaderless gap (or a leader
  that fell further behind) loses the overflowed ones (counted in ``overflowed``);
* a replica only remembers events it observed: one that started after an event happened sees that
  TrainJob in its initial list, which is never counted (docs/design/product.md §6, invariant 1),
  so such events are lost;
* the watermark is the highest rv counted, and the skip rule assumes that an event with a lower rv
  than one already counted was counted too. Events of one watch stream arrive in rv order, so this
  holds except for a relist racing the hand-over (its diff can surface an older-rv edge late) and a
  creation waiting for its runtime (app/trainer/pending.py): ``watermarks`` stays below the edges the
  source has not handed over yet (``waiting``).
* an edge that a replica's watch missed and its relist found carries the rv of the job's state in the
  list (``rv``), which can be later than the edge, and the rv the informer held before the gap
  (``since``). When the floor lies between the two, the journal cannot tell whether the previous leader
  counted it: it holds the event as *uncertain* (``take_uncertain``) and app/handover/settle.py settles
  it from the TrainJobs as they were at the floor (``settle``); meanwhile the published watermark stays
  at the floor (``watermarks``).
* ``start_leading(None)`` means nothing is known about what was counted (no previous leader recorded
  a watermark): nothing remembered is replayed, only events from now on are counted; this prefers
  missing a few events over double counting an unknown number. Pass ``0`` instead when it is known
  that nobody counted anything (for example the Lease was just created): everything remembered is
  counted.

Watermarks are per watch stream (``stream_of(event)``): resourceVersions are ordered within one watch,
not across several. The service watches TrainJobs either in all namespaces (one stream, "") or in each
configured namespace (one stream each, named by the namespace), and the pods likewise (``pods/``,
``pods/<namespace>``: a pod's failure), and publishes one watermark per stream; a stream the floor does
not name takes the floor app/handover/streams.py ``floor_of`` gives it.

Everything runs on the event loop thread.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from app.handover.streams import floor_of
from app.trainer.events import CountableEvent, GaugeKey, PodFailed, TrainerSink

__all__ = ["CountJournal", "JournalTelemetry"]


class JournalTelemetry(Protocol):
    """Self-telemetry hooks (implemented by app.metrics.telemetry.SelfTelemetry)."""

    def set_leader(self, leading: bool) -> None: ...

    def handover_replayed(self, count: int) -> None: ...

    def handover_skipped(self, count: int) -> None: ...

    def journal_overflowed(self, count: int) -> None: ...


class _Entry(msgspec.Struct, gc=False):
    """One remembered event. Untracked by the cyclic GC, like the events (app/trainer/events.py): the
    journal holds up to ``journal_size`` of them for as long as the process runs."""

    event: CountableEvent
    term: int  # the term of THIS replica that last counted it; 0: never counted here
    counted: bool  # counted by THIS replica in some term
    seen: bool = False  # a scrape of this replica showed its count (see stop_leading)


class CountJournal:
    """A :class:`TrainerSink` that forwards to ``target`` and gates countable events on leadership.

    ``target`` is normally the TrainerMetricState. ``journal_size`` 0 disables remembering (a
    takeover then counts only live events above the previous watermark).
    """

    def __init__(
        self,
        target: TrainerSink,
        *,
        journal_size: int,
        telemetry: JournalTelemetry | None = None,
        stream_of: Callable[[CountableEvent], str] | None = None,
        on_uncertain: Callable[[], None] | None = None,
        waiting: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        if journal_size < 0:
            raise ValueError("journal_size must be >= 0")
        self._target = target
        self._telemetry = telemetry
        # Watermarks are kept per watch stream: rvs are ordered within one stream only, and with
        # several namespaced TrainJob watches one stream can lag another. "" is the single stream of a
        # watch over all namespaces.
        self._stream_of = stream_of or _single_stream
        self._journal: deque[_Entry] = deque(maxlen=journal_size)
        self._journal_size = journal_size
        self._kept = 0  # entries left by the last full sweep of ``forget_through``
        self._leading = False
        self._paused = False  # leading, but counting nothing (a graceful stop in progress)
        self._term = 0  # this replica's leader terms so far
        # Previous leader's watermarks: events at or below were counted. None: nothing known.
        self._floors: dict[str, int] | None = None
        self._watermarks: dict[str, int] = {}
        # Uncertain events (see ``take_uncertain``), by id of the event, while leading.
        self._uncertain: dict[int, _Entry] = {}
        self._on_uncertain = on_uncertain
        # Per stream, the lowest rv of an edge the source has seen and not handed over yet (a creation
        # waiting for its runtime: TrainerState.waiting_rvs); it comes later, with a lower rv than events
        # counted meanwhile.
        self._waiting = waiting
        # Per stream, the rv after which every countable event is remembered: the first list's (set by
        # ``remember_from``), raised by every event the bounded journal drops (app/handover/coverage.py).
        self._remembered_from: dict[str, int] = {}
        # Streams this replica watches whose first list has not come yet (``expect``): it remembers nothing
        # of them, so it covers no floor of theirs.
        self._unlisted: set[str] = set()
        # Totals since the process started, also exported through telemetry.
        self.replayed = 0
        self.skipped = 0
        self.overflowed = 0
        self.counted = 0
        self.forgotten = 0  # dropped by ``forget_through``: no take-over could replay them

    # --- read-only views ---------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def watermark(self) -> int | None:
        """Highest rv counted by the leaders so far over all streams (None: nothing known)."""
        return max(self._watermarks.values()) if self._watermarks else None

    @property
    def watermarks(self) -> dict[str, int]:
        """Highest rv counted per stream, as this replica knows it. Publish it with every Lease renewal.

        While leading: max(previous watermark, rv of every event counted this term), per stream; held at
        the floor while an uncertain event of the stream is not settled yet, so that a takeover meanwhile
        reconsiders it. Not merely below its rv: the edge happened somewhere after its ``since``; if the
        previous leader did not count it, above the floor, possibly just above, where another replica's
        watch saw it, and that replica would skip it under any higher watermark. Held below an edge the
        source has not handed over yet (``waiting``), too: it is counted when it comes, if leading, with
        an rv below events counted already, and the next leader would skip its own copy of it."""
        out = dict(self._watermarks)
        if self._waiting is not None:
            floors = self._floors or {}
            for stream, rv in self._waiting().items():
                if stream in out and rv <= out[stream]:
                    # Never below this term's floor: an edge at or below it is the previous leader's, skipped
                    # when it comes (a lagging watch of this replica can still be behind the floor).
                    floor = floor_of(floors, stream) if floors else None
                    out[stream] = rv - 1 if floor is None else max(rv - 1, min(floor, out[stream]))
        if self._uncertain:
            floors = self._floors or {}
            for entry in self._uncertain.values():
                stream = self._stream_of(entry.event)
                floor = floor_of(floors, stream)
                if floor is not None and stream in out and floor < out[stream]:
                    out[stream] = floor
        return out

    @property
    def remembered(self) -> int:
        return len(self._journal)

    @property
    def remembered_from(self) -> dict[str, int]:
        """Per stream, the rv after which every countable event is remembered (see ``remember_from``)."""
        return dict(self._remembered_from)

    def remember_from(self, stream: str, rv: int) -> None:
        """The stream's first list was at ``rv``: edges before it were never seen as edges here. Only the
        first call per stream counts (a relist's gap is the uncertain events' business, not coverage)."""
        self._remembered_from.setdefault(stream, rv)
        self._unlisted.discard(stream)

    def expect(self, stream: str) -> None:
        """This replica watches ``stream`` (a watch that starts later than the ones leading waits for: the
        pods'): until its first list (``remember_from``) it is ``unlisted``."""
        if stream not in self._remembered_from:
            self._unlisted.add(stream)

    @property
    def unlisted(self) -> frozenset[str]:
        """The expected streams whose first list has not come yet."""
        return frozenset(self._unlisted)

    @property
    def journal_size(self) -> int:
        return self._journal_size

    def remembered_edges(self) -> set[tuple[type, str]]:
        """(event type, uid) of every remembered event: the edges a take-over replays or skips from the
        journal itself, which app/handover/gap.py must not rebuild again."""
        return {(type(entry.event), entry.event.uid) for entry in self._journal}

    # --- TrainerSink -------------------------------------------------------------------------------

    def on_countable(self, event: CountableEvent) -> None:
        if self._journal_size:
            event = _shared_uid(event)
        counting = self._leading and not self._paused
        verdict = self._verdict(event) if counting else _SKIP
        term = self._term if verdict is _COUNT else 0
        entry = _Entry(event, term, term > 0)
        if self._journal_size:
            if len(self._journal) == self._journal_size:
                # deque(maxlen) drops the oldest silently; count it so operators can size the journal.
                self.overflowed += 1
                dropped = self._journal[0].event
                stream = self._stream_of(dropped)
                if dropped.rv > self._remembered_from.get(stream, -1):
                    self._remembered_from[stream] = dropped.rv
                if self._telemetry is not None:
                    self._telemetry.journal_overflowed(1)
            self._journal.append(entry)
        if verdict is _COUNT:
            self._count(event)
        elif verdict is _UNCERTAIN:
            self._hold(entry)
        elif counting:
            self._skipped(1)

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None:
        self._target.on_jobs_gauge(key, value)

    def on_runtimes_changed(self) -> None:
        self._target.on_runtimes_changed()

    def forget_through(self, limits: Mapping[str, int]) -> int:
        """Drop the remembered events of each stream ``limits`` names whose rv is at or below its limit;
        return how many. A stream it does not name keeps everything.

        ``limits`` must be at most every floor this replica may take over from later (HandOver passes
        the highest watermarks seen in the Lease, below which ``LeaseWatermarks.takeover_floor`` never
        goes): such an event is then skipped by every take-over (``_verdict``: at or below the floor,
        whatever its ``since``, its ``seen`` or its term), so forgetting it changes no count. Events are
        remembered in arrival order, roughly rv order per stream: the oldest go first, in O(dropped);
        a full sweep (when the journal has doubled since the last one) takes the ones left behind an
        older event of another stream, or behind an edge that arrived late with a lower rv."""
        journal = self._journal
        if not journal or not limits:
            return 0
        stream_of = self._stream_of
        dropped = 0
        while journal:
            event = journal[0].event
            limit = limits.get(stream_of(event))
            if limit is None or event.rv > limit:
                break
            journal.popleft()
            dropped += 1
        if len(journal) > 2 * self._kept + _SWEEP_SLACK:
            kept: deque[_Entry] = deque(maxlen=self._journal_size)
            for entry in journal:
                limit = limits.get(stream_of(entry.event))
                if limit is None or entry.event.rv > limit:
                    kept.append(entry)
            dropped += len(journal) - len(kept)
            self._journal = kept
            self._kept = len(kept)
        self.forgotten += dropped
        return dropped

    # --- leadership --------------------------------------------------------------------------------

    def start_leading(self, previous_watermark: int | Mapping[str, int] | None) -> int:
        """Start counting; replay remembered events above ``previous_watermark``. Returns how many.

        ``previous_watermark`` is per stream (a mapping; a stream it does not name falls back to the
        entry for "", if any) or one int for every stream. See the module docstring for what None
        and 0 mean. Every call starts a new term: the caller has reset the metric state, so what an
        earlier term counted and no scrape showed (not ``seen``) is counted again if above the floor."""
        self._leading = True
        self._paused = False
        self._term += 1
        self._uncertain.clear()
        if previous_watermark is None:
            self._floors = None
            # Keep what this replica itself counted in earlier terms (if anything): it is the best
            # knowledge there is, and it only moves up from here.
        else:
            floors = (
                {"": previous_watermark} if isinstance(previous_watermark, int) else dict(previous_watermark)
            )
            self._floors = floors
            self._watermarks = dict(floors)
        if self._telemetry is not None:
            self._telemetry.set_leader(True)
        replayed = 0
        if self._floors is not None:
            for entry in self._journal:
                if entry.seen or entry.term == self._term:
                    continue
                verdict = self._verdict(entry.event)
                if verdict is _UNCERTAIN:
                    self._hold(entry)
                elif verdict is _COUNT:
                    self._mark_counted(entry)
                    self._count(entry.event)
                    replayed += 1
        self.replayed += replayed
        if replayed and self._telemetry is not None:
            self._telemetry.handover_replayed(replayed)
        return replayed

    def pause_counting(self) -> None:
        """Count nothing from now on, still leading: events are remembered as a follower's are, and the
        next leader counts them (a graceful stop waits meanwhile for a scrape of the last counts)."""
        if self._leading:
            self._paused = True

    @property
    def paused(self) -> bool:
        return self._paused

    def stop_leading(self, seen: Mapping[str, int] | None = None) -> int | None:
        """Stop counting at once; return the final (highest) watermark; ``watermarks`` has them all.

        ``seen``: per stream, up to which rv a scrape showed this term's counts (the served watermarks);
        the entries this term counted at or below are marked ``seen``, so a later term of this replica
        does not show them again. None: every entry this term counted was seen."""
        if self._leading:
            self._mark_seen(seen)
        if self._leading and self._telemetry is not None:
            self._telemetry.set_leader(False)
        self._leading = False
        self._paused = False
        self._floors = None
        # Unsettled uncertain events stay uncounted in the journal; a later term weighs them again.
        self._uncertain.clear()
        return self.watermark

    # --- uncertain events ----------------------------------------------------------------------------

    def take_uncertain(self) -> list[tuple[CountableEvent, str, int]]:
        """Events the leader cannot place by itself, each with its stream and that stream's floor.

        A relist found them (``since`` set, see app/trainer/events.py) and the floor lies between the
        rv before the gap and the rv they were listed at: the previous leader counted the edge if it
        happened at or below the floor. The caller (app/handover/settle.py) reads the TrainJobs as they
        were at the floor and calls ``settle`` for each. Until then they are not counted, and
        ``watermarks`` stays below them."""
        floors = self._floors or {}
        out = []
        for entry in self._uncertain.values():
            stream = self._stream_of(entry.event)
            floor = floor_of(floors, stream)
            if floor is not None:
                out.append((entry.event, stream, floor))
        return out

    def settle(self, event: CountableEvent, count: bool) -> None:
        """The previous leader did not count ``event`` (``count``) or did. Ignored once not leading, and
        while paused (it stays held: the watermark stays below it and the next leader weighs it)."""
        if self._paused:
            return
        entry = self._uncertain.pop(id(event), None)
        if entry is None or not self._leading:
            return
        if count and entry.term != self._term:
            self._mark_counted(entry)
            self._count(event)
            self.replayed += 1
            if self._telemetry is not None:
                self._telemetry.handover_replayed(1)
        elif not count:
            self._skipped(1)

    @property
    def uncertain(self) -> int:
        return len(self._uncertain)

    # --- internals ---------------------------------------------------------------------------------

    def _verdict(self, event: CountableEvent) -> object:
        """_COUNT, _SKIP (at or below the floor: counted by the previous leader) or _UNCERTAIN."""
        listed = type(event) is PodFailed and event.listed
        floors = self._floors
        if floors is None:
            return _SKIP if listed else _COUNT
        stream = self._stream_of(event)
        if listed and stream not in floors:
            # No leader published a watermark of this pods stream: none counted its failures, and a failure
            # of the first list may predate every leader (never counted, as the jobs of a first list).
            return _SKIP
        floor = floor_of(floors, stream)
        if floor is None:
            return _COUNT
        if event.rv <= floor:
            return _SKIP
        if listed or (event.since and event.since < floor):
            return _UNCERTAIN
        return _COUNT

    def _mark_counted(self, entry: _Entry) -> None:
        entry.term = self._term
        entry.counted = True
        entry.seen = False

    def _mark_seen(self, seen: Mapping[str, int] | None) -> None:
        term = self._term
        for entry in self._journal:
            if entry.term != term or entry.seen:
                continue
            if seen is None:
                entry.seen = True
                continue
            stream = self._stream_of(entry.event)
            limit = floor_of(seen, stream)
            if limit is not None and entry.event.rv <= limit:
                entry.seen = True

    def _hold(self, entry: _Entry) -> None:
        event = entry.event
        if type(event) is PodFailed and event.listed and self._floors is not None:
            # It failed somewhere above the floor: counted, it holds the served watermark there (since).
            floor = floor_of(self._floors, self._stream_of(event)) or 0
            entry.event = msgspec.structs.replace(event, since=max(event.since, floor))
        self._uncertain[id(entry.event)] = entry
        if self._on_uncertain is not None:
            self._on_uncertain()

    def _skipped(self, n: int) -> None:
        self.skipped += n
        if self._telemetry is not None:
            self._telemetry.handover_skipped(n)

    def _count(self, event: CountableEvent) -> None:
        self._target.on_countable(event)
        self.counted += 1
        stream = self._stream_of(event)
        if event.rv > self._watermarks.get(stream, -1):
            self._watermarks[stream] = event.rv


def _single_stream(event: CountableEvent) -> str:
    return ""


def _shared_uid(event: CountableEvent) -> CountableEvent:
    """``event`` with its uid interned: the informer builds a fresh 85-byte string for every event
    (app/trainer/projection_types.py keeps the uid as 16 bytes), and the up to four events of one TrainJob
    in the journal then share one. An interned string is freed with its last holder."""
    uid = sys.intern(event.uid)
    return event if uid is event.uid else msgspec.structs.replace(event, uid=uid)


_SWEEP_SLACK = 1024  # entries a journal may grow by between full sweeps (besides doubling)


_COUNT, _SKIP, _UNCERTAIN = object(), object(), object()
