"""The simulated Trainer controller writes a TrainJob's status as kubeflow/trainer v2.3.0 does.

Upstream: kubeflow/trainer v2.3.0 (658725bd) pkg/controller/trainjob_controller.go Reconcile,
setSuspendedCondition, reconcileDeadline, setTrainJobStatus, removeFailedCondition;
pkg/runtime/framework/plugins/jobset/jobset.go Build (JobSet suspend) and Status (the copy);
pkg/util/trainjob/trainjob.go IsManagedByExternalController; pkg/runtime/runtime.go
RuntimeRefToRuntimeRegistryKey. Kueue: kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/trainjob."""

from __future__ import annotations

from kubesim.trainer import controller, jobset, kueue
from kubesim.trainer.controller import TrainJob, reconcile, rfc3339
from kubesim.trainer.jobset import jobset_spec, set_phase
from kubesim.trainer.shapes_runtimes import cluster_runtimes

T0 = 1_780_000_000.0


def train_job(*, suspend: bool = False, deadline: int | None = None) -> TrainJob:
    doc = next(d for d in cluster_runtimes() if d["metadata"]["name"] == "torch-distributed")
    return TrainJob("job", T0, jobset_spec(doc["spec"]["template"]["spec"]), frozenset(), suspend, deadline)


def types(job: TrainJob) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c["reason"]) for c in job.conditions]


def test_a_job_never_suspended_has_no_suspended_condition() -> None:
    job = train_job()
    assert not reconcile(job, T0)  # the JobSet is built, has not reported: nothing to write
    assert job.jobset is not None and not job.jobset.suspended
    assert job.status() == {}


def test_suspended_then_resumed_conditions() -> None:
    job = train_job(suspend=True)
    assert reconcile(job, T0)
    assert types(job) == [("Suspended", "True", "Suspended")]
    assert job.conditions[0]["message"] == "TrainJob is suspended"
    assert job.jobset is not None and job.jobset.suspended  # Build: the JobSet takes the job's suspend
    job.suspend = False
    assert reconcile(job, T0 + 60)
    assert types(job) == [("Suspended", "False", "Resumed")]
    assert job.conditions[0]["lastTransitionTime"] == rfc3339(T0 + 60)
    assert not job.jobset.suspended
    job.suspend = True  # preempted: the True condition comes back with a new time
    reconcile(job, T0 + 120)
    assert types(job) == [("Suspended", "True", "Suspended")]
    assert job.conditions[0]["lastTransitionTime"] == rfc3339(T0 + 120)


def test_jobset_status_is_copied_and_its_end_as_complete() -> None:
    job = train_job()
    reconcile(job, T0)
    assert job.jobset is not None
    jobset.reconcile(job.jobset)
    reconcile(job, T0 + 5)
    assert job.jobs_status == [
        {"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
    ]
    set_phase(job.jobset, "node", jobset.SUCCEEDED)
    jobset.reconcile(job.jobset)
    reconcile(job, T0 + 50)
    assert types(job) == [("Complete", "True", "AllJobsCompleted")]
    assert job.conditions[0]["message"] == "jobset completed successfully"
    assert job.conditions[0]["lastTransitionTime"] == rfc3339(T0 + 50)
    reconcile(job, T0 + 90)  # copied again: the JobSet's time stays
    assert job.conditions[0]["lastTransitionTime"] == rfc3339(T0 + 50)


def test_deadline_counts_from_creation_and_fails_exactly_then() -> None:
    job = train_job(deadline=600)
    reconcile(job, T0)
    assert job.deadline() == T0 + 600
    assert not reconcile(job, T0 + 599)
    assert reconcile(job, T0 + 700)  # the controller requeued for the deadline: that is the time written
    assert types(job) == [("Failed", "True", "DeadlineExceeded")]
    assert job.conditions[0]["lastTransitionTime"] == rfc3339(T0 + 600)
    assert job.conditions[0]["message"] == "TrainJob exceeded its active deadline"
    assert job.jobset is None and job.jobset_deleted  # the JobSet is deleted
    assert job.deadline() is None  # finished: not timed any more
    assert not reconcile(job, T0 + 900)  # nothing more: Status leaves a finished job without JobSet alone


def test_deadline_counts_from_the_last_resume_and_not_while_suspended() -> None:
    job = train_job(suspend=True, deadline=600)
    reconcile(job, T0)
    assert job.deadline() is None  # suspended jobs are not timed
    job.suspend = False
    reconcile(job, T0 + 1000)
    assert job.deadline() == T0 + 1600
    job.suspend = True
    reconcile(job, T0 + 1500)
    assert job.deadline() is None
    job.suspend = False
    reconcile(job, T0 + 3000)
    assert job.deadline() == T0 + 3600
    reconcile(job, T0 + 9000)
    failed = controller.find(job.conditions, "Failed")
    assert failed is not None and failed["lastTransitionTime"] == rfc3339(T0 + 3600)


def test_registry_and_managed_by() -> None:
    assert controller.registry_key({"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}) == (
        "TrainingRuntime.trainer.kubeflow.org"
    )
    assert controller.runtime_registered(
        {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
    )
    assert not controller.runtime_registered(
        {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntimes"}
    )
    assert not controller.runtime_registered({"apiGroup": "kubeflow.org", "kind": "ClusterTrainingRuntime"})
    assert not controller.managed_externally({})
    assert not controller.managed_externally({"managedBy": "trainer.kubeflow.org/trainjob-controller"})
    assert controller.managed_externally({"managedBy": kueue.MULTIKUEUE})


def test_kueue_writes() -> None:
    spec: dict[str, object] = {}
    kueue.queued_spec(spec, when="2026-01-01T00:00:00Z", multikueue=True)
    assert spec["suspend"] is True and spec["managedBy"] == "kueue.x-k8s.io/multikueue"
    patches = kueue.admission_patches(["node"], "2026-01-01T00:01:00Z", 0)
    assert patches[-1] == {"spec": {"suspend": False}}  # unsuspended after the runtime patch
    assert patches[0]["spec"]["runtimePatches"][0]["manager"] == "kueue.x-k8s.io/manager"
    # MultiKueue copies the worker's status whole: what it lacks is removed here.
    copied = kueue.multikueue_status({"conditions": [{"type": "Suspended"}]})
    assert copied == {"conditions": [{"type": "Suspended"}], "jobsStatus": None, "trainerStatus": None}
