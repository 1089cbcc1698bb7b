"""Per-stream hand-over watermarks: with one TrainJob watch per namespace, one stream can lag another."""

from __future__ import annotations

from app.handover.journal import CountJournal
from app.handover.watermarks import format_watermarks, parse_watermarks
from app.trainer.events import CountableEvent, JobFinished
from tests.metrics.helpers import created
from tests.support.sinks import RecordingSink


def _by_namespace(event: CountableEvent) -> str:
    return event.namespace


def _pair() -> tuple[CountJournal, RecordingSink, CountJournal, RecordingSink]:
    old_rec, new_rec = RecordingSink(), RecordingSink()
    old = CountJournal(old_rec, journal_size=100, stream_of=_by_namespace)
    new = CountJournal(new_rec, journal_size=100, stream_of=_by_namespace)
    return old, old_rec, new, new_rec


def test_lagging_stream_event_is_not_lost_at_graceful_handover() -> None:
    old, old_rec, new, new_rec = _pair()
    old.start_leading(0)
    # The old leader's team-b watch is ahead of its team-a watch: a team-a event with a lower rv
    # than the last team-b one has not reached the old leader when it hands over.
    for journal in (old, new):
        journal.on_countable(created(10, ns="team-a"))
        journal.on_countable(created(30, ns="team-b"))
    late = created(20, ns="team-a")
    new.on_countable(late)  # the follower's team-a watch got it in time

    old.stop_leading()
    assert old.watermarks["team-a"] == 10
    assert old.watermarks["team-b"] == 30
    new.start_leading(old.watermarks)

    counted = old_rec.rvs + new_rec.rvs
    assert sorted(counted) == [10, 20, 30], "each event counted exactly once over both terms"
    # A single global watermark (30) would have skipped rv 20 as already counted.
    assert new_rec.rvs == [20]


def test_late_event_at_or_below_its_own_stream_floor_is_skipped() -> None:
    _, _, new, new_rec = _pair()
    new.start_leading({"team-a": 10, "team-b": 30})
    new.on_countable(created(25, ns="team-b"))  # the old leader counted team-b up to 30
    new.on_countable(created(25, ns="team-a"))  # above team-a's floor: not counted before
    assert new_rec.rvs == [25]
    assert new_rec.events[0].namespace == "team-a"


def test_unknown_stream_falls_back_to_the_all_namespaces_floor() -> None:
    _, _, new, new_rec = _pair()
    new.start_leading({"": 50})
    new.on_countable(created(40, ns="team-c"))
    new.on_countable(created(60, ns="team-c"))
    assert new_rec.rvs == [60]


def test_finished_events_carry_their_stream() -> None:
    _, _, new, new_rec = _pair()
    new.start_leading({"team-a": 10})
    new.on_countable(JobFinished(5, "u", "succeeded", "none", "ref", 1.0, namespace="team-a"))
    new.on_countable(JobFinished(15, "v", "succeeded", "none", "ref", 1.0, namespace="team-a"))
    assert new_rec.rvs == [15]


def test_watermark_annotation_round_trip() -> None:
    assert format_watermarks({"": 1234}) == "1234"
    assert parse_watermarks({"trainer-metrics.kubeflow.org/watermark": "1234"}) == {"": 1234}
    both = {"team-a": 7, "team-b": 9}
    text = format_watermarks(both)
    assert parse_watermarks({"trainer-metrics.kubeflow.org/watermark": text}) == both


def test_malformed_watermark_annotation_is_ignored() -> None:
    for raw in ("garbage", "12.5", "true", '{"a": "1"}', "[1]", ""):
        assert parse_watermarks({"trainer-metrics.kubeflow.org/watermark": raw}) is None
    assert parse_watermarks({}) is None


def test_an_edge_waiting_below_the_floor_never_lowers_the_watermark_under_it() -> None:
    """A source holds an edge back (a creation waiting for its runtime, a pod's failure waiting for its
    TrainJob): the watermark of its stream stays below it, but never below this term's floor, which a
    lagging watch of this replica may not have reached yet. An edge at or below the floor is the previous
    leader's and is skipped when it comes; a published watermark must never go down."""
    waiting: dict[str, int] = {}
    journal = CountJournal(
        RecordingSink(), journal_size=100, stream_of=_by_namespace, waiting=lambda: dict(waiting)
    )
    journal.start_leading({"team-a": 100})
    journal.on_countable(created(150, ns="team-a"))
    waiting["team-a"] = 50  # seen late by this replica, below the floor
    assert journal.watermarks["team-a"] == 100
    waiting["team-a"] = 120  # above the floor: held below it
    assert journal.watermarks["team-a"] == 119
    waiting.clear()
    assert journal.watermarks["team-a"] == 150
