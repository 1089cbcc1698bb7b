"""The shapes of a simulated child Job's pods (sim/kubesim/trainer/pods.py), as JobSet v0.12.0
jobset_controller.go constructJob/labelAndAnnotateObject and the Job controller (podGenerateNameWithIndex,
job-name/job-completion-index labels, controller ownerReference) write them."""

from kubesim.trainer import jobset, pods


def _pod(restart: int = 0, node: str | None = None) -> dict:
    return pods.pod_manifest(
        namespace="ns",
        jobset="tj",
        replicated_job="node",
        job_index=0,
        replicas=1,
        completion_index=3,
        restart=restart,
        job_uid="uid-1",
        containers=[{"name": "node"}],
        node=node,
        phase="Pending",
    )


def test_pod_name_is_child_job_name_index_and_five_character_suffix() -> None:
    name = _pod()["metadata"]["name"]
    assert name.startswith("tj-node-0-3-") and len(name.rsplit("-", 1)[1]) == 5


def test_pod_labels_carry_jobset_and_job_controller_keys() -> None:
    labels = _pod(restart=2)["metadata"]["labels"]
    assert labels == {
        "jobset.sigs.k8s.io/jobset-name": "tj",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/restart-attempt": "2",
        "batch.kubernetes.io/job-name": "tj-node-0",
        "batch.kubernetes.io/job-completion-index": "3",
    }


def test_pod_is_owned_by_its_child_job() -> None:
    (owner,) = _pod()["metadata"]["ownerReferences"]
    got = (owner["kind"], owner["name"], owner["uid"], owner["controller"])
    assert got == ("Job", "tj-node-0", "uid-1", True)


def test_restart_makes_a_new_pod_name_and_binding_sets_node_name() -> None:
    assert _pod(0)["metadata"]["name"] != _pod(1)["metadata"]["name"]
    assert "nodeName" not in _pod()["spec"]
    assert _pod(node="n1")["spec"]["nodeName"] == "n1"


def test_pods_per_job_are_capped() -> None:
    assert pods.pod_count(10_000) == pods.MAX_PODS_PER_JOB
    assert pods.pod_count(3) == 3


def test_pod_phase_follows_child_job_phase_and_suspended_jobs_have_no_pods() -> None:
    assert [pods.pod_phase(p) for p in (jobset.STARTING, jobset.READY, jobset.SUCCEEDED, jobset.FAILED)] == [
        "Pending",
        "Running",
        "Succeeded",
        "Failed",
    ]
    assert {pods.pod_phase(p) for p in (jobset.ABSENT, jobset.CREATED, jobset.SUSPENDED)} == {None}
