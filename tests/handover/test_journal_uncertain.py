"""CountJournal: edges found by a relist across the take-over floor are held, then settled.

A relist tags an edge with ``since`` (the rv its informer held before the gap) and ``rv`` (the job's state in
the list). With the floor between the two, the new leader cannot tell from its own data whether the previous
leader counted it (app/handover/journal.py); app/handover/settle.py reads the TrainJobs as they were at the
floor."""

from __future__ import annotations

import asyncio

import msgspec

from app.handover.journal import CountJournal
from app.handover.settle import HeldEdgeSettler, counted_before
from tests.metrics.helpers import Telemetry, created, finished
from tests.support.sinks import RecordingSink


def make() -> tuple[CountJournal, RecordingSink, Telemetry, list[int]]:
    rec, tel, signals = RecordingSink(), Telemetry(), []
    journal = CountJournal(rec, journal_size=100, telemetry=tel, on_uncertain=lambda: signals.append(1))
    return journal, rec, tel, signals


def test_a_relisted_edge_across_the_floor_is_held_at_takeover_and_settled() -> None:
    journal, rec, tel, signals = make()
    old = msgspec.structs.replace(created(130, uid="old"), since=90)  # edge in (90, 130]: maybe <= floor 100
    new = msgspec.structs.replace(created(140, uid="new"), since=90)
    plain = created(120, uid="plain")  # seen on a watch at 120 > floor: counted
    for e in (old, new, plain):
        journal.on_countable(e)
    assert journal.start_leading(100) == 1
    assert rec.events == [plain]
    assert journal.uncertain == 2 and signals
    assert sorted((e.uid, stream, floor) for e, stream, floor in journal.take_uncertain()) == [
        ("new", "", 100),
        ("old", "", 100),
    ]
    # Until settled, the published watermark stays at the floor: an uncertain edge may have happened just
    # above it, where another replica's watch saw it (test_relisted.py).
    assert journal.watermarks == {"": 100}
    journal.on_countable(created(150, uid="later"))
    assert journal.watermarks == {"": 100}
    journal.settle(new, count=True)
    assert journal.watermarks == {"": 100}  # "old" is still held
    journal.settle(old, count=False)  # the job existed at the floor: the previous leader counted it
    assert [e.uid for e in rec.events] == ["plain", "later", "new"]
    assert journal.uncertain == 0 and journal.watermarks == {"": 150}
    assert tel.skipped == 1 and tel.replayed == 2


def test_a_live_relisted_edge_while_leading_is_held_too() -> None:
    journal, rec, _, signals = make()
    journal.start_leading(100)
    journal.on_countable(msgspec.structs.replace(finished(130, uid="a"), since=50))
    journal.on_countable(msgspec.structs.replace(finished(131, uid="b"), since=100))  # gap began at the floor
    journal.on_countable(msgspec.structs.replace(finished(90, uid="c"), since=50))  # at or below: skipped
    assert [e.uid for e in rec.events] == ["b"]
    assert journal.uncertain == 1 and len(signals) == 1


def test_uncertain_events_are_dropped_at_stop_and_weighed_again_next_term() -> None:
    journal, rec, _, _ = make()
    held = msgspec.structs.replace(created(130, uid="x"), since=90)
    journal.on_countable(held)
    journal.start_leading(100)
    journal.stop_leading()
    assert journal.uncertain == 0
    journal.settle(held, count=True)  # too late: ignored
    assert rec.events == []
    journal.start_leading(130)  # the next floor covers it: skipped now
    assert rec.events == [] and journal.uncertain == 0


def test_counted_before_reads_the_jobs_at_the_floor() -> None:
    at_floor = {"running": False, "done": True}
    assert counted_before(created(5, uid="running"), at_floor)
    assert not counted_before(created(5, uid="absent"), at_floor)
    assert counted_before(finished(5, uid="done"), at_floor)
    assert not counted_before(finished(5, uid="running"), at_floor)
    assert not counted_before(finished(5, uid="absent"), at_floor)


async def test_held_edges_are_all_counted_when_the_floor_cannot_be_read() -> None:
    rec = RecordingSink()
    # The settler needs the journal, so it is built next; the hook runs only once leading.
    journal = CountJournal(rec, journal_size=100, on_uncertain=lambda: settler.schedule())  # noqa: PLW0108
    settler = HeldEdgeSettler(journal, lambda: None, page_size=10)  # no client: the read fails
    held = msgspec.structs.replace(created(130, uid="x"), since=90)
    journal.on_countable(held)
    journal.start_leading(100)
    assert journal.uncertain == 1
    for _ in range(10):  # the settling task runs on the loop
        await asyncio.sleep(0)
    assert rec.events == [held] and journal.uncertain == 0
    await settler.stop()
