"""CountJournal: leader gating, hand-over by watermark, bounded journal."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from app.handover.journal import CountJournal
from app.trainer.events import CountableEvent
from tests.metrics.helpers import Telemetry, created, finished
from tests.support.sinks import RecordingSink


def make(size: int = 100) -> tuple[CountJournal, RecordingSink, Telemetry]:
    rec, tel = RecordingSink(), Telemetry()
    return CountJournal(rec, journal_size=size, telemetry=tel), rec, tel


def events(first: int, last: int) -> list[CountableEvent]:
    return [created(rv) if rv % 2 else finished(rv) for rv in range(first, last + 1)]


def test_follower_forwards_gauges_and_runtimes_but_counts_nothing() -> None:
    journal, rec, _ = make()
    for e in events(1, 5):
        journal.on_countable(e)
    journal.on_jobs_gauge(("ns", "ref", "running"), 2)
    journal.on_runtimes_changed()
    assert rec.events == []
    assert rec.gauge_calls == [(("ns", "ref", "running"), 2)] and rec.runtime_changes == 1
    assert journal.remembered == 5 and not journal.leading and journal.watermark is None


def test_leader_counts_live_events_and_advances_watermark() -> None:
    journal, rec, tel = make()
    journal.start_leading(None)
    for e in events(1, 3):
        journal.on_countable(e)
    assert rec.rvs == [1, 2, 3] and journal.watermark == 3
    assert tel.leader == [True]


def test_start_leading_replays_after_watermark_and_skips_late_ones() -> None:
    journal, rec, tel = make()
    for e in events(1, 10):
        journal.on_countable(e)
    assert journal.start_leading(6) == 4
    assert rec.rvs == [7, 8, 9, 10] and journal.watermark == 10
    journal.on_countable(created(5))  # arrived late: the previous leader counted it
    journal.on_countable(created(11))
    assert rec.rvs == [7, 8, 9, 10, 11]
    assert tel.replayed == 4 and tel.skipped == 1
    assert journal.replayed == 4 and journal.skipped == 1


def test_start_leading_none_counts_only_from_now_and_zero_counts_everything() -> None:
    journal, rec, _ = make()
    for e in events(1, 3):
        journal.on_countable(e)
    assert journal.start_leading(None) == 0
    journal.on_countable(created(4))
    assert rec.rvs == [4] and journal.watermark == 4

    journal2, rec2, _ = make()
    for e in events(1, 3):
        journal2.on_countable(e)
    assert journal2.start_leading(0) == 3
    assert rec2.rvs == [1, 2, 3]


def test_stop_leading_stops_at_once_and_returns_watermark() -> None:
    journal, rec, tel = make()
    journal.start_leading(None)
    journal.on_countable(created(1))
    assert journal.stop_leading() == 1
    journal.on_countable(created(2))
    assert rec.rvs == [1] and not journal.leading
    assert tel.leader == [True, False]
    assert journal.stop_leading() == 1  # idempotent
    assert tel.leader == [True, False]


def test_same_replica_never_counts_its_own_events_twice() -> None:
    journal, rec, _ = make()
    journal.start_leading(0)
    for e in events(1, 5):
        journal.on_countable(e)
    journal.stop_leading()
    # The lease lost our last publication: the next term starts below what we counted.
    for e in events(6, 8):
        journal.on_countable(e)
    journal.start_leading(3)
    assert rec.rvs == [1, 2, 3, 4, 5, 6, 7, 8]


def test_journal_is_bounded_and_counts_overflow() -> None:
    journal, rec, tel = make(size=3)
    for e in events(1, 5):
        journal.on_countable(e)
    assert journal.remembered == 3 and journal.overflowed == 2 and tel.overflowed == 2
    journal.start_leading(0)
    assert rec.rvs == [3, 4, 5]  # 1 and 2 are lost: the documented limit


def test_zero_sized_journal_remembers_nothing() -> None:
    journal, rec, _ = make(size=0)
    journal.on_countable(created(1))
    assert journal.remembered == 0 and journal.overflowed == 0
    journal.start_leading(0)
    journal.on_countable(created(2))
    assert rec.rvs == [2]


def _run_two_replicas(
    stream: list[CountableEvent], switches: list[int], *, crash: bool, renew_every: int
) -> tuple[RecordingSink, RecordingSink]:
    """Feed the same stream to two replicas; leadership alternates at the given stream positions.

    Graceful: the old leader stops, its final watermark is handed over. Crash: the new leader gets the
    watermark the old one last published on a renewal (every ``renew_every`` events)."""
    (a, rec_a, _), (b, rec_b, _) = make(10_000), make(10_000)
    replicas = [a, b]
    leader = 0
    a.start_leading(0)
    published: int | None = 0
    switch_at = set(switches)
    for i, event in enumerate(stream):
        if i in switch_at:
            old, new = replicas[leader], replicas[1 - leader]
            final = old.stop_leading()
            new.start_leading(published if crash else final)
            leader = 1 - leader
            published = new.watermark
        if i % renew_every == 0:
            published = replicas[leader].watermark
        # Both replicas see every event; the order of delivery between them does not matter.
        for journal in random.sample(replicas, 2):
            journal.on_countable(event)
    return rec_a, rec_b


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.lists(st.integers(0, 300), max_size=6), st.randoms())
def test_graceful_handover_counts_each_event_exactly_once(
    n: int, switches: list[int], rnd: random.Random
) -> None:
    random.seed(rnd.random())
    stream = events(1, n)
    rec_a, rec_b = _run_two_replicas(stream, sorted(switches), crash=False, renew_every=1)
    assert sorted(rec_a.rvs + rec_b.rvs) == list(range(1, n + 1))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.lists(st.integers(0, 300), max_size=6), st.integers(1, 20))
def test_crash_handover_loses_nothing_and_doubles_at_most_one_renew_period(
    n: int, switches: list[int], renew_every: int
) -> None:
    stream = events(1, n)
    rec_a, rec_b = _run_two_replicas(stream, sorted(set(switches)), crash=True, renew_every=renew_every)
    counted = rec_a.rvs + rec_b.rvs
    assert set(counted) == set(range(1, n + 1))  # nothing lost
    doubles = len(counted) - len(set(counted))
    assert doubles <= renew_every * len(set(switches))  # one renew period per takeover at most
    assert all(counted.count(rv) <= 2 for rv in set(counted))
