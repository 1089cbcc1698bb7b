"""Pod failures across a leader change: their own watch stream (``pods/``), its floor, and the settling of a
failure a relist found across it (app/handover/streams.py, journal.py, settle.py).

Each replica is the counting pipeline app/replica/service.py builds (``HandOver``) with the pods watch's
edge detector (app/trainer/pod_failures.py) sending into its journal, driven by hand: pod notifications,
served renders (a scrape, stored by the one scraper), Lease writes, kills. What the scraper stored is
turned into the increments PromQL sees (tests/support/promql_visible.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from app.handover.handover import HandOver, HandOverConfig
from app.handover.streams import floor_of, pod_stream, stream_namespace, stream_of
from app.handover.watermarks import WATERMARK_ANNOTATION, parse_watermarks
from app.kube.client import ApiError, KubeClient
from app.kube.lease import LeaseRecord
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer import rules
from app.trainer.events import PodFailed
from app.trainer.pod_failures import PodFailures
from app.trainer.pods import PodProjection, PodProjector
from app.trainer.state import TrainerState
from tests.handover.test_relisted import Clock, job
from tests.metrics.helpers import created
from tests.support.promql_visible import visible_increase
from tests.support.trainjob_cache import TrainJobCache
from tests.support.waiting import eventually
from tests.trainer.manifests import runtime

HOLD = 2.0
POD_FAILURES_TOTAL = "kubeflow_trainer_trainjob_pod_failures_total"
PODS = PodProjector()


def pod_manifest(name: str, rv: int, *, phase: str = "Running", ns: str = "team-a") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "creationTimestamp": "2025-06-01T10:00:05Z",
            "labels": {rules.JOBSET_NAME_LABEL: "x"},
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, **({"reason": "Evicted"} if phase == "Failed" else {})},
    }


def pod(name: str, rv: int, *, phase: str = "Running", ns: str = "team-a") -> PodProjection:
    p = PODS.from_json(pod_manifest(name, rv, phase=phase, ns=ns))
    assert p is not None
    return p


class PodsAt:
    """The settler's one API call for a pods stream: the pods as they were at a revision."""

    def __init__(self) -> None:
        self.history: list[tuple[int, dict[str, Any]]] = []
        self.asked: list[dict[str, str]] = []

    def write(self, obj: dict[str, Any]) -> None:
        self.history.append((int(obj["metadata"]["resourceVersion"]), obj))

    async def request_json(self, method: str, path: str, *, query: dict[str, str], timeout: float) -> Any:
        assert path == "/api/v1/pods", path
        self.asked.append(query)
        at = int(query["resourceVersion"])
        latest = {o["metadata"]["uid"]: o for rv, o in self.history if rv <= at}
        return {"items": list(latest.values()), "metadata": {}}


class Replica:
    def __init__(
        self, name: str, clock: Clock, api: PodsAt | None = None, *, per_namespace: bool = False
    ) -> None:
        self.name = name
        client = cast(KubeClient, api) if api is not None else None
        self.handover = HandOver(
            HandOverConfig(
                name, journal_size=100, per_namespace=per_namespace, list_page_size=50, retry_period=1.0
            ),
            metric_state=lambda runtimes: TrainerMetricState(runtimes, zero_hold=HOLD, clock=clock),
            trainer_state=lambda sink, gauges: TrainerState(sink, gauge_sink=gauges, clock=clock),
            client=lambda: client,
            clock=clock,
        )
        h = self.handover
        self.metrics, self.journal, self.ledger, self.state = h.metric_state, h.journal, h.ledger, h.state
        self.state.runtime_handler.on_added(runtime(), True)
        # The TrainJob informer's cache, then its handler (the TrainerState) told.
        self.jobs = TrainJobCache(self.state.job_handler)
        self.failures = PodFailures(self.jobs.get)
        self.failures.connect(self.journal, self.state.runtime_ref_label)
        self.jobs.on_added(job("x", 10), True)
        self.terms = 0
        self.stored: dict[tuple[int, tuple[tuple[str, str], ...]], list[float]] = defaultdict(list)

    def lead(self, previous: LeaseRecord | None) -> None:
        if previous is not None:
            self.handover.observe(previous)
        self.handover.start_term(previous)
        self.terms += 1

    def renew(self) -> LeaseRecord:
        return LeaseRecord(self.name, 15, None, None, 0, self.handover.annotations(), "1")

    def scrape(self) -> None:
        for family in text_string_to_metric_families(self.metrics.render_text().decode()):
            for sample in family.samples:
                if sample.name == POD_FAILURES_TOTAL:
                    self.stored[(self.terms, tuple(sorted(sample.labels.items())))].append(sample.value)


def scrape_until_seen(clock: Clock, *replicas: Replica) -> None:
    for _ in range(3):
        for r in replicas:
            r.scrape()
        clock.now += HOLD


def pod_failures_seen(*replicas: Replica) -> float:
    """The pod failures PromQL's increase() sees over every term of every replica."""
    return sum(visible_increase(values) for r in replicas for values in r.stored.values())


def fail(replicas: tuple[Replica, ...], name: str, running_rv: int, failed_rv: int) -> None:
    """Pod ``name`` is created running and fails, seen on every replica's watch."""
    for r in replicas:
        r.failures.on_added(pod(name, running_rv), initial=False)
        r.failures.on_updated(pod(name, running_rv), pod(name, failed_rv, phase="Failed"))


def test_a_failure_counted_by_a_leader_that_stepped_down_is_not_counted_again_by_its_successor() -> None:
    """Graceful: a counts p's failure, its scrapes show it, it releases the Lease with the pods stream's
    watermark; b, which saw the same failure, skips it. q fails after a paused (a graceful stop's wait):
    a did not count it, b does. Each failure is seen once by PromQL."""
    clock = Clock()
    a, b = Replica("a", clock), Replica("b", clock)
    a.lead(None)
    fail((a, b), "p", 20, 21)
    scrape_until_seen(clock, a)
    a.handover.journal.pause_counting()
    fail((a, b), "q", 30, 31)
    scrape_until_seen(clock, a)
    lease = a.renew()
    a.handover.stop_term()
    assert parse_watermarks(lease.annotations) == {"": 0, "pods/": 21}
    b.lead(lease)
    scrape_until_seen(clock, a, b)
    assert pod_failures_seen(a) == 1
    assert pod_failures_seen(b) == 1, "b counts q (a did not) and not p (a did)"
    assert pod_failures_seen(a, b) == 2


def test_a_killed_leaders_unshown_failure_is_counted_by_its_successor() -> None:
    """a counts p's failure and is killed right after a renewal, before a scrape showed it: the watermark it
    published stays below it, so b counts its own copy, and PromQL sees the failure once."""
    clock = Clock()
    a, b = Replica("a", clock), Replica("b", clock)
    a.lead(None)
    fail((a, b), "p", 20, 21)
    lease = a.renew()
    b.lead(lease)
    scrape_until_seen(clock, b)
    assert pod_failures_seen(a, b) == 1


def test_the_pods_stream_never_takes_the_trainjob_streams_floor() -> None:
    """A Lease written by a leader that counted no pod failure (an older version, or its pods watch off)
    names the TrainJob stream only. Its floor (rv 50, above p's failure at 21) says nothing of the pods:
    nobody counted p's failure, so the new leader counts what it remembers of it."""
    clock = Clock()
    b = Replica("b", clock)
    fail((b,), "p", 20, 21)
    b.journal.on_countable(created(50))  # a TrainJob event the old leader counted
    old = LeaseRecord("old", 15, None, None, 0, {WATERMARK_ANNOTATION: "50"}, "1")
    b.lead(old)
    scrape_until_seen(clock, b)
    assert pod_failures_seen(b) == 1
    assert (
        b.journal.skipped == 0 and b.journal.replayed == 1
    )  # the creation at 50 was at the floor: not replayed


def test_stream_names_and_floors() -> None:
    single, per_ns = stream_of(False), stream_of(True)
    failed = PodFailed(1, "j", "p", "team-a", "ref", "Error")
    assert (single(failed), per_ns(failed)) == ("pods/", "pods/team-a")
    assert (single(created(1, ns="team-a")), per_ns(created(1, ns="team-a"))) == ("", "team-a")
    assert (pod_stream(None), pod_stream("team-a")) == ("pods/", "pods/team-a")
    assert (stream_namespace("pods/"), stream_namespace("pods/team-a"), stream_namespace("team-a")) == (
        None,
        "team-a",
        "team-a",
    )
    assert stream_namespace("") is None
    # A TrainJob stream falls back to the all-namespaces stream; a pods stream to the pods streams only.
    assert floor_of({"": 50}, "team-a") == 50
    assert floor_of({"": 50}, "pods/") == 0
    assert floor_of({"": 50, "pods/": 30}, "pods/team-a") == 30
    assert floor_of({"pods/team-a": 30, "pods/team-b": 20}, "pods/") == 20
    assert floor_of({"pods/team-a": 30}, "pods/team-a") == 30
    assert floor_of({"team-a": 5}, "team-b") is None


async def test_a_relisted_failure_across_the_floor_is_settled_from_the_pods_at_the_floor() -> None:
    """b's pods watch broke after rv 20 and its relist (since 20) found p and q failed as listed at rv 40.
    a, whose watch stayed up, saw p fail at 25 and counted and showed it, then stepped down with the pods
    floor at 25 (q failed at 35, after a stopped). For b both edges lie across the floor: the pods as they
    were at 25 (p Failed, q Running) say a counted p and not q."""
    clock = Clock()
    api = PodsAt()
    a, b = Replica("a", clock), Replica("b", clock, api)
    for name, running_rv in (("p", 20), ("q", 21)):
        api.write(pod_manifest(name, running_rv))
        for r in (a, b):
            r.failures.on_added(pod(name, running_rv), initial=False)
    a.lead(None)
    api.write(pod_manifest("p", 25, phase="Failed"))
    a.failures.on_updated(pod("p", 20), pod("p", 25, phase="Failed"))
    scrape_until_seen(clock, a)
    lease = a.renew()
    a.handover.stop_term()
    assert parse_watermarks(lease.annotations) == {"": 0, "pods/": 25}
    api.write(pod_manifest("q", 35, phase="Failed"))
    b.failures.on_relist(20)
    b.failures.on_updated(pod("p", 20), pod("p", 40, phase="Failed"))
    b.failures.on_updated(pod("q", 21), pod("q", 40, phase="Failed"))
    b.failures.on_relist(None)
    b.lead(lease)
    await eventually(lambda: b.journal.uncertain == 0, timeout=10, what="b's held pod failures settled")
    await b.handover.settler.stop()
    scrape_until_seen(clock, a, b)
    assert [(q["resourceVersion"], q["labelSelector"]) for q in api.asked] == [("25", rules.POD_SELECTOR)]
    assert pod_failures_seen(b) == 1, "b counts q only: p was Failed at the floor"
    assert pod_failures_seen(a, b) == 2


async def test_relisted_failures_are_all_counted_when_the_pods_at_the_floor_cannot_be_read() -> None:
    """No client (or a compacted revision): counting twice is the lesser harm than losing a failure."""
    clock = Clock()
    b = Replica("b", clock)
    b.failures.on_added(pod("p", 20), initial=False)
    b.failures.on_relist(20)
    b.failures.on_updated(pod("p", 20), pod("p", 40, phase="Failed"))
    b.failures.on_relist(None)
    b.lead(LeaseRecord("a", 15, None, None, 0, {WATERMARK_ANNOTATION: '{"":10,"pods/":25}'}, "1"))
    await eventually(lambda: b.journal.uncertain == 0, timeout=10, what="b's held pod failure settled")
    await b.handover.settler.stop()
    scrape_until_seen(clock, b)
    assert pod_failures_seen(b) == 1


async def test_a_successor_whose_first_pods_list_shows_failures_above_the_floor_settles_them() -> None:
    """The 30-minute soak's lost pod failures: a counts p's failure (at 25) above the pods watermark it last
    published (18) and is demoted before a scrape showed it. c's pods watch first listed after that: p is
    already Failed in its first list (rv 25); so is r, counted and shown by a at 18 and updated since (22);
    q failed at 15, below the floor. c holds p's and r's listed failures as uncertain, reads the pods as
    they were at 18 (r Failed, p not) and counts p only: PromQL sees each failure once."""
    clock = Clock()
    api = PodsAt()
    a, c = Replica("a", clock), Replica("c", clock, api)
    for name, running_rv in (("p", 11), ("q", 12), ("r", 13)):
        api.write(pod_manifest(name, running_rv))
        a.failures.on_added(pod(name, running_rv), initial=False)
    a.lead(None)
    for name, running_rv, failed_rv in (("q", 12, 15), ("r", 13, 18)):
        api.write(pod_manifest(name, failed_rv, phase="Failed"))
        a.failures.on_updated(pod(name, running_rv), pod(name, failed_rv, phase="Failed"))
    scrape_until_seen(clock, a)
    lease = a.renew()
    assert parse_watermarks(lease.annotations) == {"": 0, "pods/": 18}
    api.write(pod_manifest("r", 22, phase="Failed"))
    a.failures.on_updated(pod("r", 18, phase="Failed"), pod("r", 22, phase="Failed"))
    api.write(pod_manifest("p", 25, phase="Failed"))
    a.failures.on_updated(pod("p", 11), pod("p", 25, phase="Failed"))  # counted, never shown: a is demoted
    for name, rv in (("p", 25), ("q", 15), ("r", 22)):
        c.failures.on_added(pod(name, rv, phase="Failed"), initial=True)
    c.lead(lease)
    assert c.journal.uncertain == 2  # p and r; q is at or below the floor
    await eventually(lambda: c.journal.uncertain == 0, timeout=10, what="c's listed failures settled")
    await c.handover.settler.stop()
    scrape_until_seen(clock, c)  # a is gone: no scrape of it shows p
    assert [q["resourceVersion"] for q in api.asked] == ["18"]
    assert pod_failures_seen(c) == 1, "c counts p, not Failed at the floor; r was, q failed below it"
    assert pod_failures_seen(a, c) == 3


class ExpiredWhilePausing:
    """The pods at the floor cannot be read (410: the revision was compacted away), and the leader's graceful
    stop pauses its counting while the read is out."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.asked = 0

    async def request_json(self, method: str, path: str, *, query: dict[str, str], timeout: float) -> Any:
        self.asked += 1
        self.replica.journal.pause_counting()
        raise ApiError(410, "Expired", "The resourceVersion for the provided list is too old.")


async def test_a_paused_leader_settles_nothing_and_reads_nothing_more() -> None:
    """A leader whose held failures could not be read at the floor, paused by a graceful stop meanwhile, can
    settle none of them (a paused journal counts nothing; they stay held for the next leader). The chaos soak
    saw the settler ask again at once, 762 LISTs and as many log lines in 2.5 s: it stops instead."""
    clock = Clock()
    c = Replica("c", clock)
    api = ExpiredWhilePausing(c)
    c.handover.settler._client = lambda: cast(KubeClient, api)
    c.failures.on_added(pod("p", 25, phase="Failed"), initial=True)
    c.lead(LeaseRecord("a", 15, None, None, 0, {WATERMARK_ANNOTATION: '{"":10,"pods/":18}'}, "1"))
    assert c.journal.uncertain == 1
    task = c.handover.settler._task
    assert task is not None
    await eventually(task.done, timeout=5, what="the settler stopped while paused")
    assert api.asked == 1 and c.journal.uncertain == 1
    scrape_until_seen(clock, c)
    assert pod_failures_seen(c) == 0


def test_a_first_lists_failures_are_never_counted_without_a_published_pods_watermark() -> None:
    """A fresh deployment, or a Lease whose leaders counted no pod failure (its pods stream unnamed): the
    failures of the first list may predate every leader, so none is counted, whatever the TrainJob floor;
    nor by a leader that knows no floor at all."""
    clock = Clock()
    b, d = Replica("b", clock), Replica("d", clock)
    for r in (b, d):
        r.failures.on_added(pod("p", 25, phase="Failed"), initial=True)
    b.lead(LeaseRecord("old", 15, None, None, 0, {WATERMARK_ANNOTATION: "10"}, "1"))
    d.lead(None)
    d.failures.on_added(pod("q", 26, phase="Failed"), initial=True)  # its pods watch synced after it led
    scrape_until_seen(clock, b, d)
    assert pod_failures_seen(b, d) == 0
    assert b.journal.uncertain == d.journal.uncertain == 0


async def test_a_leader_whose_pods_watch_syncs_after_it_took_over_settles_the_first_lists_failures() -> None:
    """The pods watch does not hold up leading: a leader whose first pods list comes after its take-over
    holds the failures of that list above its pods floor as uncertain, as a replay would."""
    clock = Clock()
    api = PodsAt()
    b = Replica("b", clock, api)
    api.write(pod_manifest("p", 21))
    api.write(pod_manifest("x", 30))
    b.lead(LeaseRecord("a", 15, None, None, 0, {WATERMARK_ANNOTATION: '{"":0,"pods/":30}'}, "1"))
    api.write(pod_manifest("p", 35, phase="Failed"))
    b.failures.on_added(pod("p", 35, phase="Failed"), initial=True)
    await eventually(lambda: b.journal.uncertain == 0, timeout=10, what="b's listed failure settled")
    await b.handover.settler.stop()
    scrape_until_seen(clock, b)
    assert pod_failures_seen(b) == 1
