"""The pod series (app/metrics/pods.py): the join of pods to cached TrainJobs, the three gauges, the cap,
bad input, and leader-only export.

Pods carry JobSet's labels (kubernetes-sigs/jobset v0.12.0 ``pkg/controllers/jobset_controller.go``
labelAndAnnotateObject: ``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``, ``restart-attempt``),
and the JobSet is named after its TrainJob (kubeflow/trainer v2.3.0
``pkg/runtime/framework/plugins/jobset/jobset.go``), so a pod's TrainJob is its jobset-name in its namespace.
"""

from __future__ import annotations

import gzip
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.metrics import pod_join
from app.metrics import protobuf as pb
from app.metrics.exposition import MetricsExposition
from app.metrics.pods import PodJobHandler, PodSeries, PodSeriesHandler, PodSeriesTelemetry
from app.metrics.telemetry import Limit
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.pods import PodProjection, PodProjector
from tests.support.metrics_proto import decode_delimited
from tests.support.pod_shapes import JOBS, projected_trainjob
from tests.support.trainjob_cache import NullHandler, TrainJobCache

from .helpers import samples

PODS = PodProjector()
INFO = "kubeflow_trainer_trainjob_pod_info"
ALLOCATED = "kubeflow_trainer_trainjob_allocated_accelerators"
RESTARTS = "kubeflow_trainer_trainjob_restarts"
REF = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"  # rules.runtime_ref_label


def pod(
    name: str,
    *,
    job: str | None = "llama",
    ns: str = "team-a",
    node: str = "n1",
    phase: str = "Running",
    gpus: Any = 8,
    attempt: str | None = "0",
    replicated: str = "node",
    created: str = "2025-06-01T10:00:05Z",
    rv: str = "10",
    extra_limits: dict[str, Any] | None = None,
) -> PodProjection:
    labels = {"jobset.sigs.k8s.io/replicatedjob-name": replicated}
    if job is not None:
        labels["jobset.sigs.k8s.io/jobset-name"] = job
    if attempt is not None:
        labels["jobset.sigs.k8s.io/restart-attempt"] = attempt
    limits = {"nvidia.com/gpu": str(gpus), **(extra_limits or {})}
    p = PODS.from_json(
        {
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": f"uid-{name}",
                "resourceVersion": rv,
                "creationTimestamp": created,
                "labels": labels,
            },
            "spec": {"nodeName": node, "containers": [{"name": "node", "resources": {"limits": limits}}]},
            "status": {"phase": phase},
        }
    )
    assert p is not None
    return p


class Setup:
    def __init__(self, **options: Any) -> None:
        self.limits: list[str] = []
        self.changes = 0
        # The TrainJobs as the informer holds them: its cache, then its handler told.
        self.jobs = TrainJobCache()
        self.series = PodSeries(
            self.jobs.get, on_change=self._changed, on_limit=self.limits.append, **options
        )
        self.pods = PodSeriesHandler(self.series)
        self.jobs.handler = PodJobHandler(NullHandler(), self.series)

    def _changed(self) -> None:
        self.changes += 1

    def put(self, pods: dict[str, PodProjection], pod: PodProjection) -> None:
        """``pod`` as the pods watch tells it: added, or an update of the one of its key in ``pods``."""
        old = pods.get(pod.key)
        pods[pod.key] = pod
        if old is None:
            self.pods.on_added(pod, False)
        else:
            self.pods.on_updated(old, pod)

    def text(self) -> str:
        state = TrainerMetricState(extra_families=self.series.families)
        return state.render_text().decode()

    def values(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {lab: v for n, lab, v in samples(self.text()) if n == name}


def lab(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def info(pod_name: str, *, job: str = "llama", node: str = "n1", ns: str = "team-a", rj: str = "node") -> Any:
    return lab(
        namespace=ns,
        trainjob=job,
        pod=pod_name,
        node=node,
        replicated_job=rj,
        runtime_ref=REF,
    )


# --- the join ------------------------------------------------------------------------------------------


def test_pods_of_a_cached_trainjob_give_info_allocated_and_restarts() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("llama-node-0-0", attempt="1"), True)
    s.pods.on_added(pod("llama-node-0-1", node="n2", gpus=4, attempt="2"), True)
    assert s.values(INFO) == {info("llama-node-0-0"): 1.0, info("llama-node-0-1", node="n2"): 1.0}
    assert s.values(ALLOCATED) == {
        lab(namespace="team-a", trainjob="llama", accelerator_class="nvidia.com/gpu"): 12.0
    }
    assert s.values(RESTARTS) == {lab(namespace="team-a", trainjob="llama"): 2.0}


def test_pods_before_their_trainjob_wait_and_join_when_it_comes() -> None:
    s = Setup()
    s.pods.on_added(pod("llama-node-0-0"), True)
    assert s.values(INFO) == {}
    assert s.series.pod_statuses()["no_trainjob"] == 1
    s.jobs.on_added(projected_trainjob(), True)
    assert s.values(INFO) == {info("llama-node-0-0"): 1.0}
    assert s.series.pod_statuses()["exported"] == 1


def test_a_deleted_trainjob_takes_its_pods_series_with_it() -> None:
    s = Setup()
    job = projected_trainjob()
    s.jobs.on_added(job, True)
    s.pods.on_added(pod("llama-node-0-0", attempt="3"), True)
    s.jobs.on_deleted(job)
    text = s.text()
    assert INFO + "{" not in text and ALLOCATED + "{" not in text and RESTARTS + "{" not in text


def test_never_a_wrong_jobs_series() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob("llama", ns="team-a"), True)
    s.pods.on_added(pod("other-ns-pod", ns="team-b"), True)  # same JobSet name, other namespace
    s.pods.on_added(pod("unknown-job-pod", job="mistral"), True)  # no such TrainJob
    s.pods.on_added(pod("no-label-pod", job=None), True)  # a server that ignored the selector
    # A pod of a previous TrainJob of the same name, created before the cached one, still terminating:
    s.pods.on_added(pod("previous-run-pod", created="2025-06-01T09:00:00Z"), True)
    assert s.values(INFO) == {}
    assert s.values(ALLOCATED) == {}
    statuses = s.series.pod_statuses()
    assert (statuses["no_trainjob"], statuses["no_jobset_label"], statuses["older_than_trainjob"]) == (
        2,
        1,
        1,
    )


def test_a_recreated_trainjob_does_not_inherit_the_previous_ones_pods() -> None:
    s = Setup()
    first = projected_trainjob(uid="u1")
    s.jobs.on_added(first, True)
    s.pods.on_added(pod("old", created="2025-06-01T10:00:05Z"), True)
    s.jobs.on_deleted(first)
    later = JOBS.from_json(
        {
            "metadata": {
                "name": "llama",
                "namespace": "team-a",
                "uid": "u2",
                "resourceVersion": "5",
                "creationTimestamp": "2025-06-01T11:00:00Z",
            },
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        }
    )
    s.jobs.on_added(later, False)
    assert s.values(INFO) == {}  # the old pod predates the new job
    s.pods.on_added(pod("new", created="2025-06-01T11:00:01Z"), False)
    assert set(s.values(INFO)) == {info("new")}


def test_finished_and_unbound_pods_hold_nothing_but_count_restarts() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("pending", node="", phase="Pending", attempt="0"), True)
    s.pods.on_added(pod("done", phase="Succeeded", attempt="4"), True)
    s.pods.on_added(pod("failed", phase="Failed", attempt="5"), True)
    assert s.values(INFO) == {}
    assert s.values(ALLOCATED) == {}  # absent when 0
    assert s.values(RESTARTS) == {lab(namespace="team-a", trainjob="llama"): 5.0}
    assert s.series.pod_statuses()["not_holding"] == 3


def test_updates_move_the_sums_and_the_max() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    a, b = pod("a", attempt="0"), pod("b", attempt="1")
    s.pods.on_added(a, True)
    s.pods.on_added(b, True)
    a2 = pod("a", phase="Succeeded", attempt="0", rv="11")
    s.pods.on_updated(a, a2)
    assert s.values(ALLOCATED) == {
        lab(namespace="team-a", trainjob="llama", accelerator_class="nvidia.com/gpu"): 8.0
    }
    assert set(s.values(INFO)) == {info("b")}
    s.pods.on_deleted(b)
    assert s.values(ALLOCATED) == {}
    assert s.values(RESTARTS) == {lab(namespace="team-a", trainjob="llama"): 0.0}  # a's attempt 0 remains
    s.pods.on_deleted(a2)
    assert s.values(RESTARTS) == {}


def test_a_pod_rescheduled_to_another_node_changes_its_info_series() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    a = pod("a")
    s.pods.on_added(a, True)
    s.pods.on_updated(a, pod("a", node="n9", rv="12"))
    assert set(s.values(INFO)) == {info("a", node="n9")}


def test_a_relabelled_pod_moves_between_jobs() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob("llama"), True)
    s.jobs.on_added(projected_trainjob("mistral"), True)
    a = pod("a", job="llama", attempt="2")
    s.pods.on_added(a, True)
    s.pods.on_updated(a, pod("a", job="mistral", attempt="2", rv="13"))
    assert set(s.values(INFO)) == {info("a", job="mistral")}
    assert s.values(RESTARTS) == {lab(namespace="team-a", trainjob="mistral"): 2.0}
    assert s.values(ALLOCATED) == {
        lab(namespace="team-a", trainjob="mistral", accelerator_class="nvidia.com/gpu"): 8.0
    }


def test_runtime_ref_follows_the_projected_trainjob() -> None:
    s = Setup()
    old = projected_trainjob(ref="torch-distributed")
    s.jobs.on_added(old, True)
    s.pods.on_added(pod("a"), True)
    s.jobs.on_updated(old, projected_trainjob(ref="deepspeed-distributed"))
    assert {dict(k)["runtime_ref"] for k in s.values(INFO)} == {
        "trainer.kubeflow.org/ClusterTrainingRuntime//deepspeed-distributed"
    }


# --- bounds and bad input -----------------------------------------------------------------------------------


def test_the_cap_on_info_series_is_counted_and_freed_slots_are_taken() -> None:
    s = Setup(max_pods=2)
    s.jobs.on_added(projected_trainjob(), True)
    pods = [pod(f"p{i}") for i in range(4)]
    for p in pods:
        s.pods.on_added(p, True)
    assert len(s.values(INFO)) == 2
    assert s.limits == [Limit.POD_SERIES.value] * 2
    assert s.series.pod_statuses()["over_cap"] == 2
    # the sums still count every pod: only the per-pod series are capped
    assert s.values(ALLOCATED) == {
        lab(namespace="team-a", trainjob="llama", accelerator_class="nvidia.com/gpu"): 32.0
    }
    s.pods.on_deleted(pods[0])
    assert set(s.values(INFO)) == {info("p1"), info("p2")}  # the oldest waiting pod took the slot
    assert s.series.pod_statuses()["over_cap"] == 1


def test_accelerator_classes_beyond_the_cap_are_other() -> None:
    s = Setup(max_accelerator_classes=1)
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("a", extra_limits={"amd.com/gpu": "2"}), True)
    assert s.values(ALLOCATED) == {
        lab(namespace="team-a", trainjob="llama", accelerator_class="amd.com/gpu"): 2.0,
        lab(namespace="team-a", trainjob="llama", accelerator_class="other"): 8.0,
    }
    assert Limit.ACCELERATOR_CLASSES.value in s.limits


def test_implausible_device_counts_count_nothing_and_are_counted() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    a = pod("a", gpus="1e300")
    s.pods.on_added(a, True)
    s.pods.on_updated(a, pod("a", gpus="1e300", rv="11", attempt="1"))
    assert s.values(ALLOCATED) == {}
    assert set(s.values(INFO)) == {info("a")}
    assert s.limits == [Limit.REQUESTED_QUANTITY.value]  # once per pod, not per event


def test_names_that_cannot_be_label_values_get_no_info_series() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("a", node="Bad Node!"), True)
    s.pods.on_added(pod("b", replicated="x" * 200), True)
    assert s.values(INFO) == {}
    assert s.values(ALLOCATED) != {}  # they still hold their devices
    assert s.series.pod_statuses()["invalid_labels"] == 2


def test_a_trainjob_whose_name_cannot_be_a_label_is_never_joined() -> None:
    s = Setup()
    bad = projected_trainjob("Not_A_Label")
    s.jobs.on_added(bad, True)
    s.pods.on_added(pod("a", job="Not_A_Label"), True)
    assert s.values(INFO) == {}
    s.jobs.on_deleted(bad)  # nothing to undo, nothing raised


def test_a_malformed_restart_attempt_is_no_restart() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("a", attempt="-3"), True)
    s.pods.on_added(pod("b", attempt="99999999999"), True)
    assert s.values(RESTARTS) == {}


def test_many_pods_many_jobs_series_stay_consistent() -> None:
    s = Setup(max_pods=500)
    jobs = [projected_trainjob(f"job-{j}") for j in range(50)]
    for j in jobs:
        s.jobs.on_added(j, True)
    for j in range(50):
        for i in range(20):
            s.pods.on_added(pod(f"job-{j}-p{i}", job=f"job-{j}", gpus=1, attempt=str(i % 3)), True)
    assert len(s.values(INFO)) == 500
    allocated = s.values(ALLOCATED)
    assert len(allocated) == 50 and set(allocated.values()) == {20.0}
    assert set(s.values(RESTARTS).values()) == {2.0}
    for j in jobs[:25]:
        s.jobs.on_deleted(j)
    assert len(s.values(ALLOCATED)) == 25
    assert len(s.values(INFO)) == 500  # the waiting pods of the remaining jobs took the freed slots


def test_the_kept_pod_statuses_follow_every_change() -> None:
    """``pod_statuses`` is kept between changes (every scrape reads it): after each pod and TrainJob event
    it equals what a series built from scratch with the same pods and TrainJobs counts."""
    s = Setup(max_pods=2)
    job = projected_trainjob()
    pods: dict[str, PodProjection] = {}
    jobs: list[Any] = []

    def check() -> None:
        fresh = Setup(max_pods=2)
        for j in jobs:
            fresh.jobs.on_added(j, True)
        for p in pods.values():
            fresh.pods.on_added(p, True)
        assert s.series.pod_statuses() == fresh.series.pod_statuses()

    def add(p: PodProjection) -> None:
        s.put(pods, p)
        check()

    add(pod("llama-node-0-0"))  # no TrainJob yet
    s.jobs.on_added(job, False)
    jobs.append(job)
    check()  # joined: exported
    add(pod("llama-node-0-1", rv="11"))
    add(pod("llama-node-0-2", rv="12"))  # over the cap
    add(pod("llama-node-0-0", phase="Succeeded", rv="13"))  # finished: not holding, a slot freed
    add(pod("bad_node", node="Not A Node", rv="14"))  # invalid labels
    add(pod("stray", job=None, rv="15"))  # no jobset label
    s.pods.on_deleted(pods.pop("team-a/llama-node-0-1"))
    check()
    s.jobs.on_deleted(job)
    jobs.clear()
    check()  # every pod of it back to no_trainjob


# --- export ----------------------------------------------------------------------------------------


def test_pod_series_are_exported_by_the_leader_only() -> None:
    s = Setup()
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("a"), True)
    state = TrainerMetricState(extra_families=s.series.families)
    exposition = MetricsExposition(CollectorRegistry())
    assert INFO.encode() not in exposition.build_metrics_response(None, None).body
    exposition.set_trainer_source(state)
    body = exposition.build_metrics_response(None, None).body
    assert (INFO + "{").encode() in body and (ALLOCATED + "{").encode() in body


def test_pod_series_kept_compressed_serve_every_format_and_gzip() -> None:
    """The pod families keep their blocks compressed only: a plain scrape inflates them, a gzip scrape sends
    the pieces as they are (its CRC-32 and length, which gzip checks, cover their text), a protobuf scrape
    counts their text in its length prefixes."""
    s = Setup()
    for j in range(3):
        s.jobs.on_added(projected_trainjob(f"job-{j}"), True)
        for i in range(150):
            s.pods.on_added(pod(f"job-{j}-node-0-{i}", job=f"job-{j}", node=f"n{i % 9}"), True)
    state = TrainerMetricState(extra_families=s.series.families)
    exposition = MetricsExposition(CollectorRegistry())
    exposition.set_trainer_source(state)
    for accept in (None, "application/openmetrics-text; version=1.0.0", pb.CONTENT_TYPE_PROTOBUF):
        plain = exposition.build_metrics_response(accept, None).body
        zipped = exposition.build_metrics_response(accept, "gzip")
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(zipped.body) == plain
    assert len(s.values(INFO)) == 450
    families = {f.name: len(f.metric) for f in decode_delimited(state.render_protobuf())}
    assert families[INFO] == 450  # every length prefix right


def test_self_telemetry_reports_pods_and_the_watch_status() -> None:
    s = Setup(max_pods=1)
    s.jobs.on_added(projected_trainjob(), True)
    s.pods.on_added(pod("a"), True)
    s.pods.on_added(pod("b"), True)
    registry = CollectorRegistry()
    registry.register(PodSeriesTelemetry(s.series, lambda: {"": "forbidden"}))
    text = generate_latest(registry)
    # Every replica serves it: a follower's /metrics must never name a Trainer series (how tests and
    # operators tell the exporting replica).
    assert b"kubeflow_trainer_" not in text
    values = {(n, lab): v for n, lab, v in samples(text)}
    assert values[("trainer_metrics_pod_series_pods", (("status", "exported"),))] == 1
    assert values[("trainer_metrics_pod_series_pods", (("status", "over_cap"),))] == 1
    assert values[("trainer_metrics_pod_series_max_pods", ())] == 1
    assert values[("trainer_metrics_pod_watch_status", (("namespace", ""), ("status", "forbidden")))] == 1


@pytest.mark.parametrize("small_job", [pod_join.SMALL_JOB, 2])
def test_random_pod_and_trainjob_events_leave_the_series_a_fresh_join_would_build(
    small_job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The join keeps no per-pod contribution: it computes what a pod added again from the pod and its job
    as last told. After any sequence of pod and TrainJob events (relabels, restarts, phases, a TrainJob
    deleted, recreated, its runtime changed) the families equal those of a series fed the same objects
    once; with a job's pods in a tuple (up to SMALL_JOB) and in a dict (beyond it, here past 2)."""
    monkeypatch.setattr(pod_join, "SMALL_JOB", small_job)
    rng = random.Random(7)
    s = Setup()
    pods: dict[str, PodProjection] = {}
    jobs: dict[str, Any] = {}
    rv = 100

    def check() -> None:
        fresh = Setup()
        for j in jobs.values():
            fresh.jobs.on_added(j, True)
        for p in pods.values():
            fresh.pods.on_added(p, True)
        for name in (INFO, ALLOCATED, RESTARTS):
            assert s.values(name) == fresh.values(name), name
        assert s.series.pod_statuses() == fresh.series.pod_statuses()

    for _ in range(400):
        rv += 1
        roll = rng.random()
        job_name = rng.choice(("llama", "mistral", "gemma"))
        if roll < 0.15:
            job = projected_trainjob(
                job_name,
                ref=rng.choice(("torch-distributed", "deepspeed")),
                uid=f"uid-{job_name}-{rng.randrange(2)}",
                created=rng.choice(("2025-06-01T10:00:00Z", "2025-06-01T10:00:10Z")),
            )
            old = jobs.get(job_name)
            jobs[job_name] = job
            if old is None:
                s.jobs.on_added(job, False)
            elif old.uid != job.uid:  # another TrainJob of the same name: the informer says so
                s.jobs.on_deleted(old)
                s.jobs.on_added(job, False)
            else:
                s.jobs.on_updated(old, job)
        elif roll < 0.22 and job_name in jobs:
            s.jobs.on_deleted(jobs.pop(job_name))
        elif roll < 0.35 and pods:
            s.pods.on_deleted(pods.pop(rng.choice(sorted(pods))))
        else:
            p = pod(
                f"p{rng.randrange(12)}",
                job=rng.choice((job_name, job_name, None)),
                node=rng.choice(("n1", "n2", "")),
                phase=rng.choice(("Running", "Running", "Pending", "Succeeded", "Failed")),
                gpus=rng.choice((0, 1, 8, "1e300")),
                attempt=rng.choice(("0", "1", "2", None)),
                rv=str(rv),
            )
            s.put(pods, p)
        check()
