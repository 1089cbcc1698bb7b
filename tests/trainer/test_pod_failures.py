"""A pod of a TrainJob failed (app/trainer/pod_failures.py, rules.pod_failure_reason): the reason rule, the
edge once per pod uid, relists, the join to cached TrainJobs, the cap on reasons, and bad input.

Where the reasons come from (kubernetes v1.33): the kubelet's eviction manager writes ``status.reason``
"Evicted" (``pkg/kubelet/eviction/helpers.go`` ``Reason = "Evicted"``); a pod past its
``activeDeadlineSeconds`` is failed by the kubelet with "DeadlineExceeded" (``pkg/kubelet/active_deadline.go``
``reason = "DeadlineExceeded"``); a container's ``state.terminated.reason`` is the runtime's through CRI:
"OOMKilled" for the OOM killer's victims, "Error" for any other non-zero exit (containerd
``internal/cri/server/container_status.go``). Pods carry JobSet's ``jobset.sigs.k8s.io/jobset-name`` label,
the JobSet named after its TrainJob (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset``).
"""

from __future__ import annotations

from typing import Any

import pytest

from app.trainer import rules
from app.trainer.events import CountableEvent, GaugeKey, PodFailed
from app.trainer.pod_failures import MAX_TOMBS, PodFailures
from app.trainer.pods import PodProjection, PodProjector
from tests.support.pod_shapes import projected_trainjob
from tests.support.trainjob_cache import TrainJobCache

PODS = PodProjector()


class Sink:
    def __init__(self) -> None:
        self.events: list[PodFailed] = []

    def on_countable(self, event: CountableEvent) -> None:
        assert isinstance(event, PodFailed)
        self.events.append(event)

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None:
        pass

    def on_runtimes_changed(self) -> None:
        pass


def pod(
    name: str = "llama-node-0-0",
    *,
    job: Any = "llama",
    ns: str = "team-a",
    phase: str = "Running",
    rv: str = "10",
    reason: Any = None,
    exit_code: Any = None,
    container_reason: Any = None,
    created: str = "2025-06-01T10:00:05Z",
    uid: str = "",
) -> PodProjection:
    labels: dict[str, Any] = {} if job is None else {rules.JOBSET_NAME_LABEL: job}
    status: dict[str, Any] = {"phase": phase}
    if reason is not None:
        status["reason"] = reason
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "node", "state": {"terminated": {"exitCode": exit_code, "reason": container_reason}}}
        ]
    obj = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
            "creationTimestamp": created,
            "labels": labels,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "node"}]},
        "status": status,
    }
    p = PODS.from_json(obj)
    assert p is not None
    return p


def tracker(jobs: TrainJobCache | None = None, **kwargs: Any) -> tuple[PodFailures, Sink]:
    """PodFailures reading ``jobs`` (the TrainJob informer's cache), holding a TrainJob unless given."""
    if jobs is None:
        jobs = TrainJobCache()
        jobs.on_added(projected_trainjob(), True)
    sink = Sink()
    failures = PodFailures(jobs.get, wall_clock=lambda: 1.0e9, **kwargs)
    failures.connect(sink, lambda ref: f"label:{ref}")
    return failures, sink


# --- the reason rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status_reason", "container_reason", "label"),
    [
        ("Evicted", "", "Evicted"),  # the eviction manager
        ("DeadlineExceeded", "", "DeadlineExceeded"),  # activeDeadlineSeconds
        ("", "OOMKilled", "OOMKilled"),  # the runtime, through CRI
        ("", "Error", "Error"),
        ("Evicted", "Error", "Evicted"),  # the kubelet killed it: why, not how it exited
        ("UnexpectedAdmissionError", "", "UnexpectedAdmissionError"),  # a reason a kubelet adds shows by name
        ("OutOfnvidia.com/gpu", "Error", "Error"),  # not a well-formed reason: the container's
        ("", "", "other"),
        ("evicted", "", "other"),  # lower-case: never a CamelCase reason (nor "other" / "none")
        ("X" * 65, "", "other"),  # longer than a reason label
    ],
)
def test_a_failed_pods_reason_is_its_status_reason_else_its_failed_containers(
    status_reason: str, container_reason: str, label: str
) -> None:
    assert rules.pod_failure_reason(status_reason, container_reason) == label


def test_the_projection_carries_the_reason_of_the_container_that_failed() -> None:
    failed = pod(phase="Failed", exit_code=137, container_reason="OOMKilled")
    assert (failed.status_reason, failed.container_reason) == ("", "OOMKilled")
    assert rules.pod_failure_reason(failed.status_reason, failed.container_reason) == "OOMKilled"
    clean = pod(phase="Failed", exit_code=0, container_reason="Completed")
    assert clean.container_reason == ""  # a container that exited 0 did not fail


# --- the edge ----------------------------------------------------------------------------------------------


def test_a_pod_seen_reaching_failed_is_counted_once_with_its_trainjob_as_exemplar() -> None:
    failures, sink = tracker()
    running = pod(rv="10")
    failures.on_added(running, initial=False)
    failed = pod(phase="Failed", rv="11", reason="Evicted")
    failures.on_updated(running, failed)
    later = pod(phase="Failed", rv="12", reason="Evicted")  # a status write after the failure
    failures.on_updated(failed, later)
    [event] = sink.events
    assert event == PodFailed(
        rv=11,
        uid="uid-team-a-llama",
        pod_uid="uid-llama-node-0-0",
        namespace="team-a",
        runtime_ref=f"label:{projected_trainjob().runtime_ref}",
        reason="Evicted",
        since=0,
        key="team-a/llama",
        at=1.0e9,
    )


def test_a_pod_already_failed_in_the_first_list_is_sent_once_as_listed_never_as_a_failure() -> None:
    """Failed before this replica watched: sent once, marked ``listed``, which the journal never counts as it
    comes (tests/handover/test_pod_failures_handover.py: only a take-over from a pods floor below it may,
    after settling it at the floor); later updates of the failed pod send nothing."""
    failures, sink = tracker()
    failed = pod(phase="Failed", reason="Evicted")
    failures.on_added(failed, initial=True)
    failures.on_updated(failed, pod(phase="Failed", rv="20", reason="Evicted"))
    assert [(e.pod_uid, e.rv, e.listed) for e in sink.events] == [(failed.uid, 10, True)]
    assert failures.counted == 0 and failures.unjoined == 0


def test_a_relist_counts_a_failure_the_watch_missed_with_the_rv_before_the_gap_and_nothing_twice() -> None:
    failures, sink = tracker()
    running = pod(rv="10")
    failures.on_added(running, initial=False)
    failures.on_relist(10)
    failed = pod(phase="Failed", rv="30", exit_code=1, container_reason="Error")
    failures.on_updated(running, failed)
    created_failed = pod("llama-node-0-1", phase="Failed", rv="31", reason="DeadlineExceeded")
    failures.on_added(created_failed, initial=False)
    failures.on_relist(None)
    # A second relist that lists the same failed pods again (the informer diffs: nothing changed) and one
    # that reports a failed pod deleted and added again (a spurious delete): nothing is counted twice.
    failures.on_relist(31)
    failures.on_deleted(failed)
    failures.on_added(failed, initial=False)
    failures.on_relist(None)
    failures.on_updated(failed, failed)
    assert [(e.rv, e.since, e.reason) for e in sink.events] == [
        (30, 10, "Error"),
        (31, 10, "DeadlineExceeded"),
    ]
    assert failures.counted == 2


def test_a_deleted_failed_pods_uid_is_remembered_among_the_last_deleted_only() -> None:
    failures, sink = tracker()
    for i in range(MAX_TOMBS + 1):
        p = pod(f"p-{i}", phase="Failed", rv=str(100 + i))
        failures.on_added(p, initial=True)
        failures.on_deleted(p)
    assert failures.failed_pods == 0
    sink.events.clear()  # the first list's, each sent once as listed
    failures.on_added(pod("p-1", phase="Failed", rv="9000"), initial=False)  # still a tomb
    assert sink.events == []
    failures.on_added(pod("p-0", phase="Failed", rv="9001"), initial=False)  # the oldest tomb went
    assert [(e.pod_uid, e.listed) for e in sink.events] == [("uid-p-0", False)]


@pytest.mark.parametrize(
    "stray",
    [
        pod(job=None, phase="Failed"),  # no jobset-name label (a server that ignored the selector)
        pod(job="other-jobset", phase="Failed"),  # a JobSet that is not a TrainJob's
        pod(ns="team-b", phase="Failed"),  # the TrainJob's name, another namespace
        pod(phase="Failed", created="2025-06-01T09:00:00Z"),  # older than the TrainJob: a previous job's
        pod(job=7, phase="Failed"),  # a malformed label
    ],
)
def test_a_failed_pod_of_no_cached_trainjob_is_not_counted_and_never_for_another_job(
    stray: PodProjection,
) -> None:
    failures, sink = tracker()
    failures.on_added(stray, initial=False)
    assert sink.events == []
    assert failures.unjoined == 1


def test_a_failure_before_its_trainjob_is_cached_is_not_counted_when_the_job_comes() -> None:
    """The documented choice: a pod failing while its TrainJob is not cached is not counted, not even once
    the TrainJob arrives (the pods stream's watermark never waits for the TrainJob watch)."""
    jobs = TrainJobCache()
    failures, sink = tracker(jobs)
    failed = pod(phase="Failed", reason="Evicted")
    failures.on_added(failed, initial=False)
    jobs.on_added(projected_trainjob(), False)
    failures.on_updated(failed, pod(phase="Failed", rv="11", reason="Evicted"))
    assert sink.events == []
    assert failures.unjoined == 1


def test_a_deleted_trainjob_takes_its_join_and_a_new_one_of_that_name_gets_its_own_pods() -> None:
    jobs = TrainJobCache()
    jobs.on_added(projected_trainjob(), True)
    failures, sink = tracker(jobs)
    jobs.on_deleted(projected_trainjob())
    failures.on_added(pod("a", phase="Failed"), initial=False)
    assert sink.events == []
    jobs.on_added(projected_trainjob(uid="new-uid", created="2025-06-02T10:00:00Z"), False)
    failures.on_added(
        pod("b", phase="Failed", created="2025-06-01T10:00:05Z"), initial=False
    )  # the old job's
    failures.on_added(pod("c", phase="Failed", created="2025-06-02T10:00:05Z"), initial=False)
    assert [(e.pod_uid, e.uid) for e in sink.events] == [("uid-c", "new-uid")]


def test_distinct_reasons_beyond_the_fixed_ones_are_capped_then_other_with_a_limit_hit() -> None:
    hits: list[str] = []
    failures, sink = tracker(max_reasons=2, on_limit=hits.append)
    reasons = ["NodeLost", "Terminated", "UnexpectedAdmissionError", "OOMKilled", "NodeLost"]
    for i, reason in enumerate(reasons):
        failures.on_added(pod(f"p-{i}", phase="Failed", reason=reason), initial=False)
    assert [e.reason for e in sink.events] == ["NodeLost", "Terminated", "other", "OOMKilled", "NodeLost"]
    assert hits == ["failure_reasons"]


def test_malformed_statuses_never_raise_and_count_as_other() -> None:
    failures, sink = tracker()
    for i, obj in enumerate(
        [
            {"status": {"phase": "Failed", "reason": 5, "containerStatuses": "x"}},
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [{"state": {"terminated": {"exitCode": "1"}}}],
                }
            },
            {"status": {"phase": "Failed", "containerStatuses": [None, {"state": None}]}},
        ]
    ):
        raw = {
            "metadata": {
                "name": f"bad-{i}",
                "namespace": "team-a",
                "uid": f"bad-{i}",
                "resourceVersion": "x",
                "creationTimestamp": "2025-06-01T10:00:05Z",
                "labels": {rules.JOBSET_NAME_LABEL: "llama"},
            },
            **obj,
        }
        projected = PODS.from_json(raw)
        assert projected is not None
        failures.on_added(projected, initial=False)
    assert [(e.reason, e.rv) for e in sink.events] == [("other", 0)] * 3
