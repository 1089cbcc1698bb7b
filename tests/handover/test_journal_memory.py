"""The journal's memory follows the hand-over lag, not its size: it forgets what no take-over of this
replica can replay (``CountJournal.forget_through``, fed by HandOver with the highest watermarks seen in the
Lease), never an event a take-over would count or weigh, and the events of one TrainJob share one uid."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.handover.journal import CountJournal
from app.handover.watermarks import WATERMARK_ANNOTATION, LeaseWatermarks, format_watermarks
from app.kube.lease import LeaseRecord
from app.trainer.events import CountableEvent, JobCreated, JobFinished
from tests.metrics.helpers import created, finished
from tests.support.sinks import RecordingSink


def namespace_stream(event: CountableEvent) -> str:
    return event.namespace


def record(holder: str, watermarks: dict[str, int]) -> LeaseRecord:
    return LeaseRecord(
        holder_identity=holder,
        lease_duration_seconds=15,
        acquire_time=None,
        renew_time=None,
        lease_transitions=0,
        annotations={WATERMARK_ANNOTATION: format_watermarks(watermarks)},
        resource_version="1",
    )


def test_forgets_only_events_at_or_below_the_limit_of_their_own_stream() -> None:
    journal = CountJournal(RecordingSink(), journal_size=100, stream_of=namespace_stream)
    for rv in range(1, 11):
        journal.on_countable(created(rv, ns="a" if rv % 2 else "b"))
    for limits in ({"a": 5}, {"a": 5, "b": 6}):
        before = {(e.event.namespace, e.event.rv) for e in journal._journal}
        dropped = journal.forget_through(limits)
        after = {(e.event.namespace, e.event.rv) for e in journal._journal}
        # Only events of a named stream at or below its limit go; "b" keeps everything while unnamed.
        assert all(rv <= limits.get(ns, -1) for ns, rv in before - after)
        assert len(before - after) == dropped > 0
    assert after == {("a", 7), ("a", 9), ("b", 8), ("b", 10)}
    assert journal.forgotten == 6


def test_a_full_sweep_takes_what_waits_behind_an_older_event_of_another_stream() -> None:
    journal = CountJournal(RecordingSink(), journal_size=100_000, stream_of=namespace_stream)
    journal.on_countable(created(1, ns="quiet"))  # the oldest entry, of a stream with no watermark yet
    for rv in range(2, 3000):
        journal.on_countable(created(rv, ns="busy"))
    journal.forget_through({"busy": 2999})
    assert journal.remembered == 1  # the sweep looked past the head


def test_memory_follows_the_lease_watermark_whatever_the_journal_size() -> None:
    """A follower observing a leader that publishes every 100 events, 50 behind what it counted: the journal
    holds about the lag, never its 100,000."""
    journal = CountJournal(RecordingSink(), journal_size=100_000)
    lease = LeaseWatermarks("follower")
    most = 0
    for rv in range(1, 20_001):
        journal.on_countable(created(rv) if rv % 3 else finished(rv))
        if rv % 100 == 0:
            lease.observe(record("leader", {"": rv - 50}))
            journal.forget_through(lease.seen)
        most = max(most, journal.remembered)
    assert most <= 150
    assert journal.overflowed == 0


def test_events_of_one_trainjob_share_one_uid_string() -> None:
    journal = CountJournal(RecordingSink(), journal_size=10)
    uid = "0f5b2c1e-3d4a-4b5c-8d9e-0a1b2c3d4e5f"
    # As the informer builds them: equal strings, distinct objects.
    journal.on_countable(JobCreated(1, "".join(uid), "ns", "ref", 1, "none", 0))
    journal.on_countable(JobFinished(2, "".join(uid), "succeeded", "none", "ref", 1.0))
    first, second = (entry.event for entry in journal._journal)
    assert first.uid == second.uid == uid and first.uid is second.uid


# --- compaction never drops what a take-over would count --------------------------------------------------

STREAMS = ("a", "b")
ACTIONS = ("observe", "lead", "stop")


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, int, int]]:
    """Events as (stream, rv, since, kind), rvs increasing per stream with a few arriving late (a creation
    that waited for its runtime) and a few found by a relist (``since`` set)."""
    out = []
    rv = {"a": 0, "b": 0}
    for _ in range(draw(st.integers(1, 60))):
        stream = draw(st.sampled_from(STREAMS))
        rv[stream] += draw(st.integers(1, 3))
        late = draw(st.integers(0, 9)) == 0
        event_rv = max(1, rv[stream] - draw(st.integers(1, 5))) if late else rv[stream]
        since = max(0, event_rv - draw(st.integers(1, 6))) if draw(st.integers(0, 7)) == 0 else 0
        out.append((stream, event_rv, since, draw(st.integers(0, 1))))
    return out


def event(stream: str, rv: int, since: int, kind: int) -> CountableEvent:
    if kind:
        return JobCreated(rv, f"uid-{stream}-{rv}", stream, "ref", 1, "none", 0, since=since)
    return JobFinished(rv, f"uid-{stream}-{rv}", "succeeded", "none", "ref", 1.0, stream, since=since)


@settings(max_examples=300, deadline=None)
@given(
    history=histories(),
    steps=st.lists(
        st.tuples(
            st.sampled_from(("observe", "lead", "stop")), st.integers(0, 200), st.sampled_from(STREAMS)
        ),
        max_size=12,
    ),
    final=st.dictionaries(st.sampled_from(STREAMS), st.integers(0, 200), min_size=1),
)
def test_a_compacted_journal_replays_exactly_what_a_full_one_replays(
    history: list[tuple[str, int, int, int]],
    steps: list[tuple[str, int, str]],
    final: dict[str, int],
) -> None:
    """Two replicas see the same events and the same Lease; one forgets through what it has seen in the
    Lease after every read, the other keeps everything. Whatever terms they lead in between (taking over
    from ``takeover_floor``, as the service does), the final take-over counts the same events in both and
    holds the same ones as uncertain."""
    full_sink, compact_sink = RecordingSink(), RecordingSink()
    full = CountJournal(full_sink, journal_size=10_000, stream_of=namespace_stream)
    compact = CountJournal(compact_sink, journal_size=10_000, stream_of=namespace_stream)
    full_lease, compact_lease = LeaseWatermarks("me"), LeaseWatermarks("me")
    events = [event(*item) for item in history]
    per_step = max(1, len(events) // (len(steps) + 1))
    for n, (action, rv, stream) in enumerate([*steps, ("observe", 0, "a")]):
        for e in events[n * per_step : (n + 1) * per_step]:
            full.on_countable(e)
            compact.on_countable(e)
        if action == "observe":  # another replica leads and publishes
            rec = record("other", {stream: rv})
            full_lease.observe(rec)
            compact_lease.observe(rec)
            compact.forget_through(compact_lease.seen)
        elif action == "lead":
            rec = record("other", {stream: rv})
            full.start_leading(full_lease.takeover_floor(rec))
            compact.start_leading(compact_lease.takeover_floor(rec))
            # It publishes what it counted; its renewal comes back as a Lease read.
            if full.watermarks:
                own = record("me", full.watermarks)
                full_lease.observe(own)
                compact_lease.observe(own)
            compact.forget_through(compact_lease.seen)
        else:
            seen = {stream: rv}
            full.stop_leading(seen)
            compact.stop_leading(seen)
    for e in events[(len(steps) + 1) * per_step :]:
        full.on_countable(e)
        compact.on_countable(e)
    full.stop_leading({})
    compact.stop_leading({})
    before = len(full_sink.events), len(compact_sink.events)
    assert full_sink.events == compact_sink.events
    rec = record("other", final)
    full.start_leading(full_lease.takeover_floor(rec))
    compact.start_leading(compact_lease.takeover_floor(rec))
    assert full_sink.events[before[0] :] == compact_sink.events[before[1] :]
    assert sorted(map(repr, full.take_uncertain())) == sorted(map(repr, compact.take_uncertain()))
