"""What Kueue writes to TrainJobs in the simulated cluster: its webhook's defaults on a queued job, admission
and preemption, and MultiKueue's copy of a worker cluster's status.

Each write follows kubernetes-sigs/kueue v0.19.2 ``pkg/controller/jobs/trainjob`` (cited where used). The
Trainer controller's answer to these spec changes is ``controller.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
# trainjob_controller.go runtimePatchManagerName: the runtimePatches entry Kueue owns.
RUNTIME_PATCH_MANAGER: Final = "kueue.x-k8s.io/manager"
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"  # kueue.MultiKueueControllerName

# Node selectors of the ResourceFlavors a ClusterQueue admits onto (what RunWithPodSetsInfo passes on).
FLAVORS: Final = (
    {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
    {"cloud.google.com/gke-accelerator": "nvidia-l4"},
    {"node.kubernetes.io/instance-type": "p4d.24xlarge"},
    {"kubernetes.io/arch": "amd64"},
)


def queued_spec(spec: dict[str, Any], *, when: str, multikueue: bool) -> None:
    """Kueue's TrainJob webhook Default on a job with a queue label (trainjob_webhook.go): ``suspend: true``
    (WorkloadShouldBeSuspended), ``managedBy`` set to MultiKueue when the queue's ClusterQueue has a
    MultiKueue admission check (jobframework/defaults.go ApplyDefaultForManagedBy), and an empty runtime
    patch of its own; the Trainer's defaulting webhook stamps the patch's ``time``
    (pkg/webhooks/trainjob_webhook.go TrainJobDefaulter.Default)."""
    spec["suspend"] = True
    if multikueue:
        spec["managedBy"] = MULTIKUEUE
    spec["runtimePatches"] = [runtime_patch(when, None)]


def runtime_patch(when: str, replicated_jobs: list[str] | None, flavor: int = 0) -> dict[str, Any]:
    """Kueue's runtimePatches entry: empty while queued; on admission, RunWithPodSetsInfo fills one
    replicatedJobs patch per PodSet with the flavor's node selector (RestorePodSetsInfo empties it again)."""
    template_spec: dict[str, Any] = {}
    if replicated_jobs:
        selector = FLAVORS[flavor % len(FLAVORS)]
        template_spec["replicatedJobs"] = [
            {"name": name, "template": {"spec": {"template": {"spec": {"nodeSelector": dict(selector)}}}}}
            for name in replicated_jobs
        ]
    return {
        "manager": RUNTIME_PATCH_MANAGER,
        "time": when,
        "trainingRuntimeSpec": {"template": {"spec": template_spec}},
    }


def admission_patches(replicated_jobs: list[str], when: str, flavor: int) -> list[dict[str, Any]]:
    """Admission, two writes (jobframework startJob): trainjob_controller.go RunWithPodSetsInfo updates
    Kueue's runtime patch while the job is still suspended (the Trainer's webhook allows that only then),
    then the job is unsuspended."""
    patch = runtime_patch(when, replicated_jobs, flavor)
    return [{"spec": {"runtimePatches": [patch]}}, {"spec": {"suspend": False}}]


def preemption_patches(when: str) -> list[dict[str, Any]]:
    """Preemption or eviction, two writes: trainjob_controller.go Stop suspends the job, then
    RestorePodSetsInfo empties Kueue's runtime patch."""
    return [{"spec": {"suspend": True}}, {"spec": {"runtimePatches": [runtime_patch(when, None)]}}]


def multikueue_status(remote: Mapping[str, Any]) -> dict[str, Any]:
    """MultiKueue's SyncJob once the worker's copy exists (trainjob_multikueue_adapter.go): the local job's
    status becomes the worker's, whole (``localJob.Status = remoteJob.Status``). As a merge patch: every
    field the worker's status lacks is removed."""
    return {key: remote.get(key) for key in ("conditions", "jobsStatus", "trainerStatus")}
