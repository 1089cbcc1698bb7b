"""Journal coverage: whether a replica could replay what a dead leader counted above its published watermark.

A new leader replays the journal above the floor it takes over from (docs/leadership.md). Edges before a
replica's first list were never edges to it, and a full journal drops its oldest: a replica whose
remembered history starts above the floor cannot replay what lies between (the hour soak's "suspects":
docs/reliability.md), so it lets a replica that can take over first (app/handover/coverage.py).
"""

from __future__ import annotations

from app.handover.coverage import uncovered_streams
from app.handover.journal import CountJournal
from app.trainer.events import CountableEvent
from tests.metrics.helpers import created
from tests.support.sinks import RecordingSink


def _by_namespace(event: CountableEvent) -> str:
    return event.namespace


def test_a_journal_remembering_from_below_the_floor_covers_it() -> None:
    assert uncovered_streams({"": 100}, {"": 100}) == {}
    assert uncovered_streams({"": 90}, {"": 100}) == {}


def test_a_journal_starting_above_the_floor_leaves_the_gap_uncovered() -> None:
    assert uncovered_streams({"": 120}, {"": 100}) == {"": (120, 100)}


def test_each_stream_is_judged_against_its_own_floor_or_the_all_namespaces_one() -> None:
    remembered = {"team-a": 50, "team-b": 80, "team-c": 70}
    floor = {"team-a": 60, "team-b": 70, "": 75}
    assert uncovered_streams(remembered, floor) == {"team-b": (80, 70)}


def test_no_known_floor_or_a_zero_floor_leaves_nothing_to_cover() -> None:
    # None: the floor is unknown and nothing is replayed; 0 (an int): nobody counted anything before.
    assert uncovered_streams({"": 500}, None) == {}
    assert uncovered_streams({"": 500}, 0) == {}
    # A stream the floor does not name (and no "" entry): nothing was counted there to replay.
    assert uncovered_streams({"team-a": 500}, {"team-b": 10}) == {}
    # Nor a pods stream no leader published (no pod failure counted: its floor is 0).
    assert uncovered_streams({"": 150, "pods/": 157}, {"": 170}) == {}
    # A published 0 is a leader whose counts no scrape showed yet: what lies above it is to be replayed.
    assert uncovered_streams({"": 120}, {"": 0}) == {"": (120, 0)}
    assert uncovered_streams({"": 50, "pods/": 120}, {"": 60, "pods/": 0}) == {"pods/": (120, 0)}


def test_journal_remembers_from_its_first_list_only() -> None:
    journal = CountJournal(RecordingSink(), journal_size=10, stream_of=_by_namespace)
    assert journal.remembered_from == {}
    journal.remember_from("team-a", 40)
    journal.remember_from("team-a", 90)  # a relist later: its gap is the uncertain events' business
    journal.remember_from("team-b", 70)
    assert journal.remembered_from == {"team-a": 40, "team-b": 70}


def test_a_full_journal_raises_the_stream_of_what_it_drops() -> None:
    journal = CountJournal(RecordingSink(), journal_size=3, stream_of=_by_namespace)
    journal.remember_from("team-a", 10)
    journal.remember_from("team-b", 10)
    for rv, ns in ((11, "team-a"), (12, "team-b"), (13, "team-a")):
        journal.on_countable(created(rv, ns=ns))
    assert journal.remembered_from == {"team-a": 10, "team-b": 10}
    journal.on_countable(created(14, ns="team-b"))  # drops rv 11 (team-a)
    journal.on_countable(created(15, ns="team-b"))  # drops rv 12 (team-b)
    assert journal.remembered_from == {"team-a": 11, "team-b": 12}
    assert journal.overflowed == 2
    # Replaying above a floor of 11 needs rv 12 of team-b, which is gone: that stream is not covered.
    assert uncovered_streams(journal.remembered_from, {"team-a": 11, "team-b": 11}) == {"team-b": (12, 11)}


def test_a_stream_not_listed_yet_covers_no_floor_above_zero() -> None:
    # The pods watch lists after the TrainJobs, maybe after this replica leads (app/replica/service.py).
    assert uncovered_streams({"": 50}, {"": 100, "pods/": 90}, {"pods/"}) == {"pods/": (None, 90)}
    # No leader counted a pod failure (no pods floor: 0), or the floor is unknown: nothing to replay.
    assert uncovered_streams({"": 50}, {"": 100}, {"pods/"}) == {}
    assert uncovered_streams({"": 50}, None, {"pods/"}) == {}
    # A published pods watermark of 0: its leader's unshown failures are to be replayed.
    assert uncovered_streams({"": 50}, {"": 100, "pods/": 0}, {"pods/"}) == {"pods/": (None, 0)}


def test_an_expected_stream_is_unlisted_until_its_first_list() -> None:
    journal = CountJournal(RecordingSink(), journal_size=10, stream_of=_by_namespace)
    journal.expect("pods/")
    assert journal.unlisted == {"pods/"} and journal.remembered_from == {}
    journal.remember_from("pods/", 70)
    assert journal.unlisted == set() and journal.remembered_from == {"pods/": 70}
    journal.expect("pods/")  # listed already: stays listed
    assert journal.unlisted == set()
