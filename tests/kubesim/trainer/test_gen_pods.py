"""The pods the simulated controllers run for each TrainJob (sim/kubesim/trainer/gen_pods.py, pod_plan.py):
created through the store when a child Job starts, with JobSet v0.12.0's labels (jobset_controller.go
labelAndAnnotateObject), the Job controller's owner and names, a node once the Job is ready, the runtime's
resources with the TrainJob's resourcesPerNode merged in (kubeflow/trainer v2.3.0
pkg/runtime/core/trainingruntime.go); phases following the child Jobs; a restart's pods labelled with the
next restart attempt; failed pods with the reasons the truth recognises; none for a suspended job; gone
with the TrainJob."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.apiserver.core import PODS
from kubesim.apiserver.http.selectors import parse_label_selector
from kubesim.apiserver.storage.store import Store
from kubesim.trainer import jobset
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.gen_population import JobRecord
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.truth_pods import pod_failure_reason, pod_failures

JOBSET = "jobset.sigs.k8s.io/jobset-name"
RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART = "jobset.sigs.k8s.io/restart-attempt"


@pytest.fixture
def store() -> Store:
    return trainer_store()


@pytest.fixture
def gen(store: Store) -> WorkloadGenerator:
    g = WorkloadGenerator(store, seed=7, namespaces=2, pods=True, deadline_ratio=0.0)
    g.load_runtimes()
    return g


def job_pods(store: Store, rec: JobRecord, replicated_job: str | None = None) -> list[dict[str, Any]]:
    found = [
        p
        for p in store.list(PODS, rec.namespace)[0]
        if p["metadata"]["labels"][JOBSET] == rec.name
        and (replicated_job is None or p["metadata"]["labels"][RJOB] == replicated_job)
    ]
    return sorted(found, key=lambda p: p["metadata"]["name"])


def running(gen: WorkloadGenerator, **fields: Any) -> JobRecord:
    rec = gen.create_job(False, finalizer=False, deadline=None, **fields)
    assert rec is not None
    gen.progress(rec)
    assert rec.phase == "running"
    return rec


def test_running_trainjob_has_its_jobsets_pods_with_labels_owner_node_and_resources(
    gen: WorkloadGenerator, store: Store
) -> None:
    resources = {"limits": {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "1"}}
    rec = running(gen, runtime="torch-distributed", num_nodes=3, resources=resources)
    pods = job_pods(store, rec, "node")
    assert len(pods) == 3
    for index, pod in enumerate(pods):
        meta = pod["metadata"]
        assert meta["name"].startswith(f"{rec.name}-node-0-{index}-")
        assert meta["labels"][RESTART] == "0"
        assert meta["labels"]["batch.kubernetes.io/job-name"] == f"{rec.name}-node-0"
        (owner,) = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("Job", f"{rec.name}-node-0", True)
        assert pod["spec"]["nodeName"].startswith("sim-node-")
        assert pod["status"]["phase"] == "Running"
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
        limits = container["resources"]["limits"]
        assert (limits["nvidia.com/gpu"], limits["nvidia.com/mig-1g.10gb"]) == ("2", "1")
    # The same devices the truth's requested_accelerators counts, once every trainer pod runs.
    request = gen.truth.requests[rec.uid]
    assert dict(request.accelerators) == {"nvidia.com/gpu": 6, "nvidia.com/mig-1g.10gb": 3}


def test_pods_follow_child_jobs_pending_unbound_then_running_then_succeeded(
    gen: WorkloadGenerator, store: Store
) -> None:
    rec = gen.create_job(False, runtime="torch-distributed", num_nodes=2, finalizer=False, deadline=None)
    assert rec is not None and rec.job is not None and rec.job.jobset is not None
    seen: set[tuple[str, bool]] = set()
    for _ in range(24):
        if rec.phase == "running":
            break
        gen.advance(rec)
        for pod in job_pods(store, rec):
            seen.add((pod["status"]["phase"], bool(pod["spec"].get("nodeName"))))
    assert ("Pending", False) in seen and ("Running", True) in seen
    assert {(p["status"]["phase"]) for p in job_pods(store, rec)} == {"Running"}
    gen.finish(rec, "Complete")
    done = job_pods(store, rec)
    assert done and {p["status"]["phase"] for p in done} == {"Succeeded"}
    for pod in done:
        (state,) = [c["state"]["terminated"] for c in pod["status"]["containerStatuses"]][:1]
        assert (state["exitCode"], state["reason"]) == (0, "Completed")


def test_restart_recreates_pods_with_the_next_restart_attempt(gen: WorkloadGenerator, store: Store) -> None:
    rec = running(gen, runtime="sim-torch-restartable", num_nodes=2)
    first = {p["metadata"]["name"] for p in job_pods(store, rec)}
    gen.finish(rec, "Failed", reason=jobset.BACKOFF_LIMIT_EXCEEDED)  # the failure policy restarts it
    assert rec.job is not None and rec.job.jobset is not None and rec.job.jobset.restarts == 1
    gen.progress(rec)
    pods = job_pods(store, rec)
    assert pods and {p["metadata"]["labels"][RESTART] for p in pods} == {"1"}
    assert not first & {p["metadata"]["name"] for p in pods}  # the first attempt's pods are deleted


def test_failed_pods_carry_reasons_the_truth_recognises_and_count_once(
    gen: WorkloadGenerator, store: Store
) -> None:
    recs = [running(gen, runtime="torch-distributed", num_nodes=4) for _ in range(6)]
    for rec in recs:
        gen.finish(rec, "Failed")
    failed = [p for rec in recs for p in job_pods(store, rec) if p["status"]["phase"] == "Failed"]
    assert len(failed) == 24
    reasons = {pod_failure_reason(p) for p in failed}
    assert reasons <= {"OOMKilled", "Error", "Evicted", "DeadlineExceeded"} and len(reasons) >= 2
    evicted = [p for p in failed if p["status"].get("reason") == "Evicted"]
    assert all(p["status"]["message"].startswith("The node was low on resource") for p in evicted)
    stored = pod_failures(store.list(PODS, None)[0], store.list(TRAINJOBS, None)[0])
    assert gen.truth.pod_failures == stored
    gen.refresh(recs[0])  # a later write of the finished job: no pod counted again
    assert gen.truth.pod_failures == stored


def test_a_pod_failure_policy_exit_code_fails_the_pod_with_that_code(
    gen: WorkloadGenerator, store: Store
) -> None:
    rec = running(gen, runtime="sim-torch-restartable", num_nodes=2)
    gen.finish(rec, "Failed", reason=jobset.POD_FAILURE_POLICY)  # FailJobSet: no restart
    failed = [p for p in job_pods(store, rec) if p["status"]["phase"] == "Failed"]
    assert failed
    for pod in failed:
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (42, "Error")


def test_deleting_the_trainjob_deletes_its_pods(gen: WorkloadGenerator, store: Store) -> None:
    rec = running(gen, runtime="torch-distributed", num_nodes=2)
    other = running(gen, runtime="torch-distributed", num_nodes=1)
    assert job_pods(store, rec)
    gen.delete(rec)
    assert job_pods(store, rec) == [] and job_pods(store, other)


def test_trainjob_held_by_a_finalizer_keeps_its_pods_until_it_is_gone(
    gen: WorkloadGenerator, store: Store
) -> None:
    rec = gen.create_job(False, runtime="torch-distributed", num_nodes=1, finalizer=True, deadline=None)
    assert rec is not None
    gen.progress(rec)
    gen.finish(rec, "Complete")
    gen.delete(rec)
    assert job_pods(store, rec)  # background deletion waits for the owner
    gen.remove_finalizer(rec)
    assert job_pods(store, rec) == []


def test_suspended_trainjob_has_no_pods_until_admitted_and_none_once_preempted(
    gen: WorkloadGenerator, store: Store
) -> None:
    rec = gen.create_job(True, runtime="torch-distributed", num_nodes=2, finalizer=False, deadline=None)
    assert rec is not None and rec.queued
    for _ in range(4):
        gen.queued(rec)  # JobSet passes: Jobs created suspended
        if rec.job is not None and not rec.job.suspend:
            break
    assert rec.job is not None
    if rec.job.suspend:
        gen.admit(rec)
    gen.progress(rec)
    assert job_pods(store, rec)
    gen.preempt(rec)
    gen.advance(rec)  # the JobSet's pass suspends its Jobs: the Job controller deletes their pods
    assert job_pods(store, rec) == []


def test_queued_trainjob_never_admitted_has_no_pods(gen: WorkloadGenerator, store: Store) -> None:
    rec = gen.create_job(True, runtime="torch-distributed", finalizer=False, deadline=None, multikueue=False)
    assert rec is not None
    gen.settle_suspended(rec)
    assert job_pods(store, rec) == []


def test_generator_without_pods_creates_none(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=3, namespaces=2)
    gen.load_runtimes()
    gen.populate(40)
    assert store.list(PODS, None)[0] == []


def test_initializer_jobs_run_pods_that_succeed_before_the_trainer_runs(
    gen: WorkloadGenerator, store: Store
) -> None:
    rec = running(gen, runtime="torchtune-llama3.2-1b")
    for step in ("dataset-initializer", "model-initializer"):
        (pod,) = job_pods(store, rec, step)
        assert pod["status"]["phase"] == "Succeeded" and pod["spec"]["nodeName"]
    assert {p["status"]["phase"] for p in job_pods(store, rec, "node")} == {"Running"}


def test_pods_are_stored_objects_a_label_selected_list_returns_with_resource_versions(
    gen: WorkloadGenerator, store: Store
) -> None:
    """The exporter lists and watches pods by ``jobset.sigs.k8s.io/jobset-name`` (app/trainer/rules/pods.py):
    the generator's pods are ordinary stored objects, so the selector finds them, each write a new
    resourceVersion in the watch history."""
    rec = running(gen, runtime="torch-distributed", num_nodes=2)
    other = running(gen, runtime="torch-distributed", num_nodes=1)
    before = store.resource_version
    gen.finish(rec, "Complete")
    selects = parse_label_selector(f"{JOBSET}={rec.name}")
    assert selects is not None
    page = store.list_page(PODS, rec.namespace, predicate=lambda e: selects(e.obj["metadata"]["labels"]))
    listed = {e.obj["metadata"]["name"]: e.obj for e in page.items}
    assert set(listed) == {p["metadata"]["name"] for p in job_pods(store, rec)}
    assert not set(listed) & {p["metadata"]["name"] for p in job_pods(store, other)}
    assert all(int(p["metadata"]["resourceVersion"]) > before for p in listed.values())
    events = [e for e in store._history if e.resource == PODS and e.rv > before]
    assert {e.entry.obj["metadata"]["name"] for e in events} >= set(listed)
