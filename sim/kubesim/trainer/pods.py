"""The pods a simulated JobSet's child Job would have: their names, labels, owner and phase (pure shapes).

Names and labels follow what writes them in a real cluster:

- JobSet v0.12.0 ``pkg/controllers/jobset_controller.go`` constructJob names each child Job
  ``<jobset>-<replicatedJob>-<jobIdx>`` and labelAndAnnotateObject writes ``jobset.sigs.k8s.io/jobset-name``,
  ``replicatedjob-name``, ``replicatedjob-replicas``, ``job-index`` and ``restart-attempt``
  (``pkg/constants/constants.go``) on the Job and its pod template, so every pod carries them.
- The Job controller (kubernetes ``pkg/controller/job``) labels an Indexed Job's pods with
  ``batch.kubernetes.io/job-name`` and ``batch.kubernetes.io/job-completion-index`` (also an annotation), owns
  them (controller ownerReference to the Job) and names them ``<job-name>-<index>-<random5>``
  (podGenerateNameWithIndex).

A child Job has one pod per node of its replicated job, capped at ``MAX_PODS_PER_JOB``: a TrainJob may ask
for thousands of nodes, and the simulated cluster keeps its pod population bounded (the cap is the
simulator's, not the cluster's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from kubesim.trainer import jobset

JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"
REPLICAS_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-replicas"
RESTART_ATTEMPT_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
MAX_PODS_PER_JOB: Final = 64
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery rand.String's alphabet


def child_job_name(jobset: str, replicated_job: str, job_index: int) -> str:
    """JobSet's child Job name (constructJob: ``placement.GenJobName``)."""
    return f"{jobset}-{replicated_job}-{job_index}"


def pod_count(nodes: int) -> int:
    """Pods of one child Job: one per node, at least none, at most ``MAX_PODS_PER_JOB``."""
    return max(0, min(nodes, MAX_PODS_PER_JOB))


def pod_phase(child_job_phase: str) -> str | None:
    """The ``status.phase`` of a child Job's pods in one of its JobSet phases (``jobset.py``), or None when
    the Job has no pods: not created yet or left behind (ABSENT), created with ``status.active`` 0 (CREATED),
    or suspended (the Job controller deletes the pods of a suspended Job: ``pkg/controller/job``
    syncJob, ``jobSuspended`` deletes active pods). STARTING counts pods not all ready: pending here;
    READY: every pod running and ready."""
    if child_job_phase in (jobset.ABSENT, jobset.CREATED, jobset.SUSPENDED):
        return None
    if child_job_phase == jobset.STARTING:
        return "Pending"
    if child_job_phase == jobset.READY:
        return "Running"
    if child_job_phase == jobset.SUCCEEDED:
        return "Succeeded"
    if child_job_phase == jobset.FAILED:
        return "Failed"
    return None


def pod_suffix(job_uid: str, index: int, restart: int, incarnation: int = 0) -> str:
    """A stable stand-in for the Job controller's random five-character suffix (deterministic for replays);
    ``incarnation`` tells apart the pods a Job creates again for one index (after a suspension)."""
    seed = f"{job_uid}/{index}/{restart}" + (f"/{incarnation}" if incarnation else "")
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])


def pod_manifest(
    *,
    namespace: str,
    jobset: str,
    replicated_job: str,
    job_index: int,
    replicas: int,
    completion_index: int,
    restart: int,
    job_uid: str,
    containers: list[Mapping[str, Any]],
    node: str | None,
    phase: str,
    incarnation: int = 0,
) -> dict[str, Any]:
    """One pod of a child Job as the Job controller creates it from JobSet's pod template."""
    job = child_job_name(jobset, replicated_job, job_index)
    index = str(completion_index)
    spec: dict[str, Any] = {"containers": [dict(c) for c in containers], "restartPolicy": "Never"}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{index}-{pod_suffix(job_uid, completion_index, restart, incarnation)}",
            "namespace": namespace,
            "labels": {
                JOBSET_NAME_LABEL: jobset,
                REPLICATED_JOB_LABEL: replicated_job,
                REPLICAS_LABEL: str(replicas),
                JOB_INDEX_LABEL: str(job_index),
                RESTART_ATTEMPT_LABEL: str(restart),
                JOB_NAME_LABEL: job,
                COMPLETION_INDEX_LABEL: index,
            },
            "annotations": {COMPLETION_INDEX_LABEL: index},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": {"phase": phase},
    }


# Why a pod of a failed child Job failed, as the kubelet or the container runtime words it: (pod
# status.reason, the failed container's terminated reason, its exit code). The kubelet writes status.reason
# ``Evicted`` (pkg/kubelet/eviction, eviction_manager.go Reason) and ``DeadlineExceeded``
# (pkg/kubelet/active_deadline.go); the runtime terminates a container ``OOMKilled`` (137) or ``Error``.
Failure = tuple[str | None, str, int]
EVICTED: Final[Failure] = ("Evicted", "Error", 137)
DEADLINE_EXCEEDED: Final[Failure] = ("DeadlineExceeded", "Error", 137)
OOM_KILLED: Final[Failure] = (None, "OOMKilled", 137)
ERROR: Final[Failure] = (None, "Error", 1)
# A Job's podFailurePolicy fails it on this exit code (the simulated restartable runtime's rule).
POLICY_EXIT: Final[Failure] = (None, "Error", 42)
CRASHES: Final = (OOM_KILLED, ERROR, ERROR, EVICTED, DEADLINE_EXCEEDED)
_MESSAGES: Final = {
    "Evicted": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. ",
    "DeadlineExceeded": "Pod was active on the node longer than the specified deadline",
}


def failure_of(pod_name: str, job_reason: str) -> Failure:
    """Why one pod of a child Job that failed for ``job_reason`` failed: the exit code a pod failure policy
    matches (``PodFailurePolicy``), else a crash drawn from the pod's name (stable, no random draw)."""
    if job_reason == jobset.POD_FAILURE_POLICY:
        return POLICY_EXIT
    digest = hashlib.sha256(pod_name.encode()).digest()
    return CRASHES[digest[0] % len(CRASHES)]


def pod_status(
    phase: str, containers: list[Mapping[str, Any]], when: str, failure: Failure | None = None
) -> dict[str, Any]:
    """The ``status`` the kubelet reports for a pod in ``phase`` (pods/status): a running pod's containers
    running, a finished pod's terminated (exit 0 ``Completed``, or ``failure``'s on the first container)."""
    status: dict[str, Any] = {"phase": phase}
    if phase == "Pending":
        return status
    status["startTime"] = when
    states = []
    for i, container in enumerate(containers):
        name = str(container.get("name", ""))
        if phase == "Running":
            state: dict[str, Any] = {"running": {"startedAt": when}}
        elif phase == "Failed" and failure is not None and i == 0:
            state = {"terminated": {"exitCode": failure[2], "reason": failure[1], "finishedAt": when}}
        elif phase == "Failed":
            state = {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": when}}
        else:
            state = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": when}}
        states.append(
            {
                "name": name,
                "ready": phase == "Running",
                "restartCount": 0,
                "image": str(container.get("image", "")),
                "imageID": "",
                "state": state,
            }
        )
    status["containerStatuses"] = states
    if phase == "Failed" and failure is not None and failure[0] is not None:
        status["reason"] = failure[0]
        status["message"] = _MESSAGES.get(failure[0], "")
    return status
