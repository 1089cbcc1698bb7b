"""An edge a relist found and the hand-over watermark: what PromQL sees across a crash stays exact.

A relist tags the edges its diff finds with ``rv``, the job's state as listed, and ``since``, the rv the
informer held before the gap (app/trainer/events.py): the edge itself happened somewhere in
``(since, rv]``. Another replica whose watch stayed up saw it at its real rv, possibly far below ``rv``.
So a leader that counted such an edge and has not shown it to every scraper must not publish a watermark
at or above ``since + 1``: the next leader would skip its own, earlier copy of the edge as counted, while
the only count of it dies unseen with the old leader's series (docs/leadership.md, "The hand-over
watermark"). The same holds for an edge a new leader holds as uncertain: until it is settled, the
watermark it publishes must not claim anything above its floor.

Each replica here is the counting pipeline app/replica/service.py builds (``HandOver``: TrainerState ->
CountJournal -> ServedLedger -> TrainerMetricState, with its Lease policy), driven by hand: informer
notifications, served renders (a scrape: the one scraper, whose interval is the hold), Lease writes and
kills. What the scraper stored is turned into the increments PromQL sees (tests/support/promql_visible.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from app.handover.handover import HandOver, HandOverConfig
from app.handover.journal import CountJournal
from app.handover.watermarks import WATERMARK_ANNOTATION
from app.kube.client import KubeClient
from app.kube.lease import LeaseRecord
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from tests.metrics.helpers import created
from tests.support.promql_visible import visible_increase
from tests.support.sinks import RecordingSink
from tests.support.waiting import eventually
from tests.trainer.manifests import runtime

HOLD = 2.0  # the zero hold: the scraper scrapes every HOLD seconds
CREATED_TOTAL = "kubeflow_trainer_trainjob_created_total"
FINISHED_TOTAL = "kubeflow_trainer_trainjob_finished_total"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manifest(name: str, rv: int, *, ns: str = "team-a", failed: bool = False) -> dict[str, Any]:
    """A TrainJob of the torch-distributed runtime as the API serves it: running, or failed."""
    conditions = []
    if failed:
        conditions.append(
            {
                "type": "Failed",
                "status": "True",
                "reason": "FailedJobs",
                "lastTransitionTime": "2025-06-01T10:30:00Z",
            }
        )
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "creationTimestamp": "2025-06-01T10:00:00Z",
        },
        "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"}},
        "status": {
            "conditions": conditions,
            "jobsStatus": [{"name": "node", "active": 0 if failed else 1, "ready": 0 if failed else 1}],
        },
    }


def job(
    name: str, rv: int, *, ns: str = "team-a", failed: bool = False, runtime: str | None = None
) -> TrainJobProjection:
    obj = manifest(name, rv, ns=ns, failed=failed)
    if runtime is not None:
        obj["spec"]["runtimeRef"]["name"] = runtime
    p = TRAINJOB_PROJECTOR.from_json(obj)
    assert p is not None
    return p


class ListAt:
    """The one API call the settler makes: the TrainJobs as they were at a revision (a LIST with
    resourceVersionMatch=Exact), from a history the test writes."""

    def __init__(self) -> None:
        self.history: list[tuple[int, dict[str, Any]]] = []  # (rv, object as written), in rv order
        self.asked: list[str] = []

    def write(self, obj: dict[str, Any]) -> None:
        self.history.append((int(obj["metadata"]["resourceVersion"]), obj))

    async def request_json(self, method: str, path: str, *, query: dict[str, str], timeout: float) -> Any:
        at = int(query["resourceVersion"])
        self.asked.append(query["resourceVersion"])
        latest: dict[str, dict[str, Any]] = {}
        for rv, obj in self.history:
            if rv <= at:
                latest[obj["metadata"]["uid"]] = obj
        return {"items": list(latest.values()), "metadata": {}}


class Replica:
    """One replica's counting pipeline, as app/replica/service.py wires it, and what the scraper stored
    of its Trainer counters, per term and series."""

    def __init__(self, name: str, clock: Clock, api: ListAt | None = None) -> None:
        self.name = name
        client = cast(KubeClient, api) if api is not None else None
        self.handover = HandOver(
            HandOverConfig(name, journal_size=100, per_namespace=False, list_page_size=50, retry_period=1.0),
            metric_state=lambda runtimes: TrainerMetricState(runtimes, zero_hold=HOLD, clock=clock),
            trainer_state=lambda sink, gauges: TrainerState(
                sink, gauge_sink=gauges, clock=clock, wall_clock=lambda: 1.75e9
            ),
            client=lambda: client,
            clock=clock,
        )
        h = self.handover
        self.metrics, self.ledger, self.journal, self.settler, self.state = (
            h.metric_state,
            h.ledger,
            h.journal,
            h.settler,
            h.state,
        )
        self.state.runtime_handler.on_added(runtime(), True)
        self.lease = h.watermarks
        self.terms = 0
        # (term, sample name, labels) -> the values the scraper stored, in time order
        self.stored: dict[tuple[int, str, tuple[tuple[str, str], ...]], list[float]] = defaultdict(list)

    # informer notifications (both TrainJob watch paths: a live watch, and a relist's diff)
    def listed(self, *jobs: TrainJobProjection) -> None:
        for j in jobs:
            self.state.job_handler.on_added(j, True)

    def added(self, new: TrainJobProjection) -> None:
        self.state.job_handler.on_added(new, False)

    def updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self.state.job_handler.on_updated(old, new)

    def relisted(self, since: int, *changes: tuple[TrainJobProjection | None, TrainJobProjection]) -> None:
        """A relist after a watch gap that began at ``since``: its diff, (cached, listed) per job."""
        self.state.job_handler.on_relist(since)
        for old, new in changes:
            if old is None:
                self.added(new)
            else:
                self.updated(old, new)
        self.state.job_handler.on_relist(None)

    # leadership, as Service._start_exporting / the elector's renewals
    def lead(self, previous: LeaseRecord | None) -> None:
        if previous is not None:
            self.lease.observe(previous)
        self.handover.start_term(previous)
        self.terms += 1

    def renew(self) -> LeaseRecord:
        """The Lease as this leader writes it with a renewal: the served watermarks."""
        annotations = self.lease.annotations(self.handover.served_watermarks())
        return LeaseRecord(self.name, 15, None, None, 0, annotations, "1")

    def scrape(self) -> None:
        """A served render, stored by the scraper."""
        body = self.metrics.render_text().decode()
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name in (CREATED_TOTAL, FINISHED_TOTAL):
                    key = (self.terms, sample.name, tuple(sorted(sample.labels.items())))
                    self.stored[key].append(sample.value)


def scrape_until_seen(clock: Clock, *replicas: Replica) -> None:
    """Scrapes every hold until a count made now is shown and seen (its series born at zero: a hold at 0,
    a render of the value, a hold more)."""
    for _ in range(3):
        for r in replicas:
            r.scrape()
        clock.now += HOLD


def visible(*replicas: Replica) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The increments PromQL sees, summed over every term of every replica, per sample name and labels."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    for r in replicas:
        for (_term, name, labels), values in r.stored.items():
            out[(name, labels)] += visible_increase(values)
    return {k: v for k, v in out.items() if v}


def failed_finishes(*replicas: Replica) -> float:
    return sum(v for (name, labels), v in visible(*replicas).items() if name == FINISHED_TOTAL)


def started_fleet(api: ListAt | None = None) -> tuple[Clock, Replica, Replica, TrainJobProjection]:
    """Replicas a (leading from the Lease's creation) and b (following) with job x running (rv 10) and job y
    that failed at rv 20, on both watches; a's scrapes have shown y's failure to the scraper."""
    clock = Clock()
    a, b = Replica("a", clock, api), Replica("b", clock, api)
    x = job("x", 10)
    for r in (a, b):
        r.listed(x)
    a.lead(None)  # it created the Lease: nobody counted anything before
    y0, y1 = job("y", 15), job("y", 20, failed=True)
    if api is not None:
        api.write(manifest("x", 10))
        api.write(manifest("y", 15))
        api.write(manifest("y", 20, failed=True))
    for r in (a, b):
        r.listed(y0)
        r.updated(y0, y1)
    scrape_until_seen(clock, a)
    assert a.ledger.watermarks(a.journal.watermarks) == {"": 20}
    return clock, a, b, x


# --- the served watermark and a relisted edge -------------------------------------------------------------


def test_a_killed_leaders_unshown_relisted_edge_is_counted_by_a_follower_that_saw_it_on_its_watch() -> None:
    """The soak's lost finish. a's TrainJob watch breaks after rv 20; x fails at rv 30 and is written again
    at rv 40. b's watch sees the failure at 30; a's relist finds it on x as listed at 40 (since 20) and
    counts it. a is killed after a renewal and before any scrape showed that count. The watermark a
    published must not reach 30: b would skip its own copy of the failure, and PromQL would never see it."""
    clock, a, b, x = started_fleet()
    x30, x40 = job("x", 30, failed=True), job("x", 40, failed=True)
    b.updated(x, x30)
    b.updated(x30, x40)  # a status write after the failure: no edge
    a.relisted(20, (x, x40))
    lease = a.renew()  # killed right after: no scrape shows the failure of x
    b.lead(lease)
    scrape_until_seen(clock, b)
    assert failed_finishes(a, b) == 2, (
        f"PromQL sees {failed_finishes(a, b):g} of the 2 failures: a published "
        f"{lease.annotations[WATERMARK_ANNOTATION]}, b saw x fail at rv 30 and skipped it"
    )


def test_a_graceful_leader_hands_over_a_relisted_edge_exactly() -> None:
    """The same relisted failure with a graceful stop: a stops counting, its scrapes show the failure, and
    the watermark it releases covers it; b skips its own copy. Nothing lost, nothing counted twice."""
    clock, a, b, x = started_fleet()
    x30, x40 = job("x", 30, failed=True), job("x", 40, failed=True)
    b.updated(x, x30)
    b.updated(x30, x40)
    a.relisted(20, (x, x40))
    a.journal.pause_counting()
    scrape_until_seen(clock, a)
    assert a.ledger.all_seen()
    lease = a.renew()
    assert lease.annotations[WATERMARK_ANNOTATION] == "40"
    b.lead(lease)
    scrape_until_seen(clock, b)
    assert failed_finishes(a, b) == 2
    assert b.journal.replayed == 0  # y (20) and x (30) skipped: a's scrapes showed both


async def test_an_unshown_relisted_edge_is_not_settled_as_counted_before() -> None:
    """As above, but b's watch broke too and its relist found the same failure (rv 40, since 20). A floor
    between 20 and 40 makes it uncertain, and the TrainJobs as they were at that floor say x had failed:
    "counted by the previous leader". a counted it, but no scrape showed that count, so it must be
    counted again. The watermark a published while its count was unseen must not pass 20."""
    api = ListAt()
    clock, a, b, x = started_fleet(api)
    x40 = job("x", 40, failed=True)
    api.write(manifest("x", 30, failed=True))
    api.write(manifest("x", 40, failed=True))
    a.relisted(20, (x, x40))
    b.relisted(20, (x, x40))
    lease = a.renew()  # killed before a scrape showed it
    b.lead(lease)
    await eventually(lambda: b.journal.uncertain == 0, timeout=10, what="b's held edges settled")
    scrape_until_seen(clock, b)
    await b.settler.stop()
    assert failed_finishes(a, b) == 2, (
        f"PromQL sees {failed_finishes(a, b):g} of the 2 failures: a published "
        f"{lease.annotations[WATERMARK_ANNOTATION]}, b settled x's failure at {api.asked} as counted before"
    )


# --- the journal's watermark and a held edge --------------------------------------------------------------


def test_a_held_edge_keeps_the_published_watermark_at_the_floor_until_it_is_settled() -> None:
    """b takes over from floor 100 and holds an edge its relist found across it (x created, since 90, listed
    at 130): x was created somewhere in (90, 130]. It counts z at 140 live, which every scraper sees (its
    served watermark is then the journal's), and is killed before its LIST at the floor answers. c saw x
    created at 110 on its watch. The previous leader counted up to 100 only, b not x: b must not publish
    more than 100, or c skips x."""
    b_sink, c_sink = RecordingSink(), RecordingSink()
    b = CountJournal(b_sink, journal_size=100)
    c = CountJournal(c_sink, journal_size=100)
    b.on_countable(msgspec.structs.replace(created(130, uid="x"), since=90))
    c.on_countable(created(110, uid="x"))
    b.start_leading(100)
    assert b.uncertain == 1
    for journal in (b, c):
        journal.on_countable(created(140, uid="z"))
    assert [e.uid for e in b_sink.events] == ["z"]
    published = b.watermarks
    assert published == {"": 100}, f"b publishes {published} while x, maybe just above its floor 100, is held"
    c.start_leading(published)
    assert [e.uid for e in c_sink.events] == ["x", "z"]  # x once; z twice, b's count above its watermark


# --- an edge not emitted yet --------------------------------------------------------------------------


def test_a_creation_waiting_for_its_runtime_keeps_a_killed_leaders_watermark_below_it() -> None:
    """w is created at rv 20 with a runtime no replica knows yet: TrainerState holds its created edge for up
    to 5 s (app/trainer/pending.py) and emits it, with rv 20, when the wait ends. Meanwhile z, created at 30,
    is counted and seen, and a is killed. Had a published 30, b would skip its own copy of w's creation when
    its wait ended, and nobody would count it."""
    clock = Clock()
    a, b = Replica("a", clock), Replica("b", clock)
    a.lead(None)
    for r in (a, b):
        r.added(job("y", 10))
    scrape_until_seen(clock, a)
    for r in (a, b):
        r.added(job("w", 20, runtime="late"))
        r.added(job("z", 30))
    a.scrape()  # shows z (its series is shown already)
    clock.now += HOLD  # seen by every scraper; w still waits
    assert a.state.pending_count == 1
    lease = a.renew()  # killed right after
    b.lead(lease)
    clock.now += 5
    b.state.flush_pending()
    scrape_until_seen(clock, b)
    created_by_ref = {
        dict(labels)["runtime_ref"]: v for (name, labels), v in visible(a, b).items() if name == CREATED_TOTAL
    }
    late = "trainer.kubeflow.org/ClusterTrainingRuntime//late"
    assert created_by_ref.get(late) == 1, (
        f"PromQL sees {created_by_ref.get(late, 0):g} creations of w: a published "
        f"{lease.annotations[WATERMARK_ANNOTATION]} while w waited at rv 20"
    )
