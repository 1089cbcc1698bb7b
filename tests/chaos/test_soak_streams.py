"""The soak's two streams (tests/chaos/soak/terms.py, visibility.py): the pods watch's edges (a pod's failure)
have resourceVersions of their own stream, handed over by the Lease's ``"pods/"`` watermark
(app/handover/streams.py), so what is at risk, what a replica could see and what a pod failure seen without
its TrainJob means (app/trainer/pod_failures.py, ``unjoined``) are kept per stream."""

from __future__ import annotations

from tests.chaos.soak.ledger import CREATED, POD_FAILURES
from tests.chaos.soak.terms import POD_STREAM, Term
from tests.chaos.soak.visibility import Span, Visibility

JOB = [(CREATED, ("team-a", "rt"))]
POD = [(POD_FAILURES, ("team-a", "rt", "OOMKilled"))]


def test_each_streams_watermark_prunes_only_its_own_at_risk_edges() -> None:
    t = Term("replica-1", 0, 0.0, 0.0, floor=100)
    t.count(110, JOB, ("created", "job-1", 0))
    t.count(105, POD, ("pod_failed", "pod-1", 0), POD_STREAM)
    t.published({"": 120, POD_STREAM: 100})
    assert t.at_risk == [] and t.pod_at_risk == [(105, POD)]
    assert t.final_watermark_of(POD_STREAM) == 105
    t.published(200)  # a bare number is the TrainJob stream's
    assert t.pod_at_risk == [(105, POD)]


def test_a_term_counts_the_pods_stream_from_its_own_floor() -> None:
    t = Term("replica-1", 0, 0.0, 0.0, floor=100, floors={"": 100, POD_STREAM: 80})
    assert (t.floor_of(""), t.floor_of(POD_STREAM)) == (100, 80)
    old = Term("replica-1", 0, 0.0, 0.0, floor=100, floors={"": 100})  # no pods stream published yet
    assert old.floor_of(POD_STREAM) == 0
    assert Term("replica-1", 0, 0.0, 0.0, floor=None).floor_of(POD_STREAM) is None


def test_a_pod_failure_hidden_by_the_pods_watch_is_not_hidden_by_the_trainjob_watch() -> None:
    vis = Visibility()
    jobs = vis.span("replica-1", lambda: 500)
    pods = vis.span("replica-1", lambda: 500, POD_STREAM)
    jobs.record({"k": "initial", "rv": 10})
    pods.record({"k": "initial", "rv": 10})
    pods.record({"k": "relist", "before": 40, "listed": 90})  # failed at 50, deleted at 60: in the gap
    assert vis.hidden_from_all(50, 60, POD_STREAM)
    assert not vis.hidden_from_all(50, 60, "")


def test_a_stopped_replica_still_saw_what_happened_before_it_stopped() -> None:
    span = Span("replica-1", initial_rv=10, stop_rv=300)
    assert not span.hides(200, 400) and span.hides(301, 400)


def test_pod_failures_seen_without_their_trainjob_are_off_the_truth_and_allowed_only_where_some_saw_it() -> (
    None
):
    vis = Visibility()
    vis.pod_edges = {
        "everywhere": [50, POD, None, None, None],
        "somewhere": [60, POD, None, None, None],
        "joined": [70, POD, None, None, None],
        "before": [5, POD, None, None, None],
    }
    for uid, who in (("everywhere", ()), ("somewhere", ("replica-2",)), ("joined", ("replica-1",))):
        for identity in ("replica-1", "replica-2"):
            joined = identity in who or uid == "joined"
            vis.saw_pod(identity, {"pod": uid, "joined": joined})
    vis.saw_pod("replica-1", {"pod": "before", "joined": False})
    off, allowance, counts = vis.unjoined(after_rv=10)
    key = POD[0][1]
    assert off == {POD_FAILURES: {key: 2}} and allowance == {POD_FAILURES: {key: 1}}
    assert counts == {"unjoined_everywhere": 1, "unjoined_somewhere": 1}
