"""The truth of pod failures (sim/kubesim/trainer/truth_pods.py, ``Truth.pod_written``): failed pods of
TrainJobs by (namespace, runtime_ref, reason), once per pod uid, read from stored objects.

The reasons are where the kubelet and the runtime write them (kubernetes ``pkg/kubelet/eviction/helpers.go``
``Reason = "Evicted"``; ``pkg/kubelet/active_deadline.go`` ``reason = "DeadlineExceeded"``; containerd's CRI
``OOMKilled`` / ``Error`` in ``state.terminated.reason``)."""

from __future__ import annotations

from typing import Any

from kubesim.trainer.truth import Truth
from kubesim.trainer.truth_pods import JOBSET_NAME_LABEL, pod_failure_reason, pod_failures

REF = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"


def trainjob(
    name: str = "llama", *, ns: str = "team-a", created: str = "2025-06-01T10:00:00Z"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }


def pod(
    name: str,
    *,
    job: str | None = "llama",
    ns: str = "team-a",
    phase: str = "Failed",
    reason: str | None = None,
    container: tuple[int, str] | None = None,
    created: str = "2025-06-01T10:00:05Z",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if reason is not None:
        status["reason"] = reason
    if container is not None:
        code, why = container
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": code, "reason": why}}}]
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": {JOBSET_NAME_LABEL: job} if job else {},
        },
        "status": status,
    }


def test_the_reason_is_the_pods_then_its_failed_containers_then_other() -> None:
    assert pod_failure_reason(pod("a", reason="Evicted", container=(137, "Error"))) == "Evicted"
    assert pod_failure_reason(pod("a", reason="DeadlineExceeded")) == "DeadlineExceeded"
    assert pod_failure_reason(pod("a", container=(137, "OOMKilled"))) == "OOMKilled"
    assert pod_failure_reason(pod("a", container=(0, "Completed"))) == "other"
    assert pod_failure_reason(pod("a", reason="not a reason", container=(1, "Error"))) == "Error"
    assert pod_failure_reason(pod("a")) == "other"


def test_failed_pods_of_stored_trainjobs_are_counted_once_by_namespace_runtime_and_reason() -> None:
    pods = [
        pod("a", reason="Evicted"),
        pod("a", reason="Evicted"),  # the same uid listed twice
        pod("b", container=(137, "OOMKilled")),
        pod("c", phase="Running"),
        pod("d", job="not-a-trainjob"),
        pod("e", job=None),
        pod("f", ns="team-b"),  # the TrainJob's name in another namespace
        pod("g", created="2025-06-01T09:00:00Z"),  # older than the TrainJob: a previous job's
    ]
    assert pod_failures(pods, [trainjob()]) == {
        ("team-a", REF, "Evicted"): 1,
        ("team-a", REF, "OOMKilled"): 1,
    }


def test_the_truth_counts_a_pod_first_written_failed_once_and_only_for_a_live_trainjob() -> None:
    truth = Truth(clock=lambda: 1.75e9)
    truth.pod_written(pod("early", reason="Evicted"))  # its TrainJob not written yet
    truth.job_written(trainjob())
    truth.pod_written(pod("a", phase="Running"))
    truth.pod_written(pod("a", reason="Evicted"))
    truth.pod_written(pod("a", reason="Evicted"))  # a later write of the failed pod
    before = truth.snapshot()
    truth.pod_written(pod("b", container=(1, "Error")))
    truth.job_deleted("uid-llama")
    truth.pod_written(pod("c", reason="Evicted"))  # its TrainJob is gone
    after = truth.snapshot()
    assert dict(before.pod_failures) == {("team-a", REF, "Evicted"): 1}
    assert after.pod_failures_since(before) == {("team-a", REF, "Error"): 1}
