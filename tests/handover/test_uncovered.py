"""A successor whose journal begins above the floor it takes over from: the hour soak's four suspects.

A leader that cannot renew (demoted: its Lease updates fail) keeps counting until its renew deadline, above
the watermark it last published. A replica that started shortly before lists the TrainJobs after that
watermark: what the leader counted between the two reached it as objects of its first list, not as edges,
so its journal cannot replay them (app/handover/coverage.py defers such a replica's take-over, but only by
a head start: when no replica that covers the floor takes the Lease first, it takes it). Unless a scrape of
the old leader had shown them, nobody counts them: PromQL loses them. The new leader now rebuilds them
from the TrainJobs listed at the floor and at its journal's start (app/handover/gap.py; docs/leadership.md,
"A successor whose journal starts above the floor").

Each replica is the counting pipeline of app/replica/service.py, driven by hand
(tests/handover/test_relisted.py).
"""

from __future__ import annotations

from app.handover.gap import UNCOVERED_LIMIT, GapRebuilder
from app.handover.journal import CountJournal
from app.handover.watermarks import WATERMARK_ANNOTATION
from app.kube.lease import LeaseRecord
from tests.handover.test_relisted import (
    CREATED_TOTAL,
    FINISHED_TOTAL,
    Clock,
    ListAt,
    Replica,
    job,
    manifest,
    scrape_until_seen,
    visible,
)
from tests.support.sinks import RecordingSink
from tests.support.waiting import eventually


def total(name: str, *replicas: Replica) -> float:
    return sum(v for (sample, _labels), v in visible(*replicas).items() if sample == name)


def demoted_leader_and_late_successor(api: ListAt | None) -> tuple[Clock, Replica, Replica, LeaseRecord]:
    """a leads from the Lease's creation; y is created (15) and fails (20), and a's scrapes show both: its
    last successful renewal publishes 20. Then its renewals fail: it still counts p created (30) and x
    failed (35), and stops leading at its renew deadline before any scrape showed them. c started meanwhile:
    its first list is at 36 (x failed, p: objects, not edges); its watch then delivers r created (38), and its
    journal is taken to begin at 40 (the informer's rv once every informer synced). q is created at 50."""
    clock = Clock()
    writes = ListAt() if api is None else api
    a = Replica("a", clock, api)
    x = job("x", 10)
    writes.write(manifest("x", 10))
    a.listed(x)
    a.handover.listed([("", "10")], [])
    a.lead(None)
    y0, y1 = job("y", 15), job("y", 20, failed=True)
    writes.write(manifest("y", 15))
    writes.write(manifest("y", 20, failed=True))
    a.added(y0)
    a.updated(y0, y1)
    scrape_until_seen(clock, a)
    lease = a.renew()  # its last renewal that succeeds
    assert lease.annotations[WATERMARK_ANNOTATION] == "20"
    p, x35 = job("p", 30), job("x", 35, failed=True)
    writes.write(manifest("p", 30))
    writes.write(manifest("x", 35, failed=True))
    a.added(p)
    a.updated(x, x35)
    a.handover.stop_term()  # the renew deadline: a stops exporting with p and x's finish unseen
    c = Replica("c", clock, api)
    c.listed(y1, p, x35)
    r, q = job("r", 38), job("q", 50)
    writes.write(manifest("r", 38))
    c.added(r)
    c.handover.listed([("", "40")], [])
    writes.write(manifest("q", 50))
    c.added(q)
    return clock, a, c, lease


async def test_a_successor_whose_journal_starts_above_the_floor_counts_a_demoted_leaders_unshown_edges() -> (
    None
):
    """Fails without the rebuild: c replays only r and q from its journal, and p's creation and x's
    failure, counted by a above the watermark it published and shown by no scrape, are lost for PromQL."""
    api = ListAt()
    clock, a, c, lease = demoted_leader_and_late_successor(api)
    c.lead(lease)
    held = c.handover.served_watermarks()  # before the LISTs answer
    await eventually(
        lambda: c.journal.counted == 6,
        timeout=5,
        what="c counts r and q (created, started) from its journal, and p's creation and x's failure, "
        "which a counted above the watermark it published and no scrape showed",
    )
    await c.handover.stop()
    scrape_until_seen(clock, c)
    # y (a), p, r and q: created after a's first list, each visible once; y (a) and x (c) failed.
    assert total(CREATED_TOTAL, a, c) == 4
    assert total(FINISHED_TOTAL, a, c) == 2
    assert api.asked == ["20", "40"]  # the floor, then where c's journal begins
    assert c.handover.gap.rebuilt == 2  # r is in c's journal: replayed from there, not rebuilt
    # Until the gap was rebuilt, c published nothing above the floor: a crash then handed the gap on.
    assert held == {"": 20}
    assert c.handover.served_watermarks() == {"": 50}


async def test_a_successor_whose_journal_covers_the_floor_rebuilds_nothing() -> None:
    api = ListAt()
    _clock, _a, c, lease = demoted_leader_and_late_successor(api)
    c.handover.journal._remembered_from[""] = 20  # as if its first list had come at the floor
    c.lead(lease)
    assert not c.handover.gap.holding
    assert api.asked == []


async def test_a_gap_that_cannot_be_listed_is_counted_and_releases_the_watermark() -> None:
    """No LIST answers (the floor's revision compacted away, the API down): the take-over is counted in
    the self-telemetry, logged, and the watermark is no longer held at the floor (what no scrape of the old
    leader showed in the gap is lost: the bound of docs/leadership.md)."""
    clock, _a, c, lease = demoted_leader_and_late_successor(None)  # c has no client
    hits: list[str] = []
    c.handover.gap._on_limit = hits.append
    c.lead(lease)
    assert c.handover.served_watermarks() == {"": 20}
    await eventually(lambda: not c.handover.gap.holding, timeout=10, what="the hold released")
    await c.handover.stop()
    assert hits == [UNCOVERED_LIMIT]
    assert c.handover.gap.rebuilt == 0
    scrape_until_seen(clock, c)
    assert c.handover.served_watermarks() == {"": 50}


def test_a_pods_streams_gap_is_counted_as_uncovered_and_never_listed_as_trainjobs() -> None:
    """A pods stream (app/handover/streams.py) can be uncovered too: a failed pod dropped from the bounded
    journal raises its ``remembered_from``. Its failures are in no TrainJob, so the rebuilder must not list
    TrainJobs for it (its stream is no namespace): it logs, counts the limit, and holds no watermark."""
    limits: list[str] = []

    def no_client() -> None:
        raise AssertionError("a pods stream's gap is never listed")

    rebuilder = GapRebuilder(
        CountJournal(RecordingSink(), journal_size=10),
        no_client,
        lambda job, since: [],
        page_size=500,
        on_limit=limits.append,
    )
    rebuilder.schedule({"pods/": (40, 20)})  # no running loop needed: nothing is scheduled
    assert limits == [UNCOVERED_LIMIT]
    assert rebuilder.holding == {}
