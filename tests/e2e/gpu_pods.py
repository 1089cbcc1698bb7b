"""TrainJobs and the pods their JobSet would run, written into the simulated API server's storage as the
controllers write them: the user's TrainJob (with the simulated dcgm-exporter's profile annotation), the
Trainer's status (a ready training step: ``running``; and ``trainerStatus.lastUpdatedTime``), and each pod as
the Job controller creates it from the JobSet's template, bound by the scheduler (pods/binding) and reported
Running by the kubelet (pods/status).

Labels, from kubernetes-sigs/jobset v0.12.0 ``pkg/controllers/jobset_controller.go`` (labelAndAnnotateObject:
``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``, ``job-index``, ``restart-attempt``) and the Job
controller (``batch.kubernetes.io/job-name``, ``batch.kubernetes.io/job-completion-index``); the JobSet is
named after the TrainJob (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubesim.apiserver.core import PODS
from kubesim.apiserver.storage.store import Store
from kubesim.dcgm import PROFILE_ANNOTATION
from kubesim.trainer.kinds import TRAINJOBS
from tests.support.harness import running_status, trainjob_manifest, write_status


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_pod_manifest(
    trainjob: str,
    index: int,
    *,
    gpus: int = 0,
    mig: dict[str, int] | None = None,
    replicated_job: str = "node",
    container: str = "node",
) -> dict[str, Any]:
    """Pod ``index`` of the JobSet's ``replicated_job`` (one child Job, indexed completions), its container
    limited to ``gpus`` nvidia.com/gpu and ``mig`` MIG instances by profile (``{"1g.10gb": 2}``)."""
    job = f"{trainjob}-{replicated_job}-0"
    limits = {**({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    limits |= {f"nvidia.com/mig-{profile}": str(n) for profile, n in (mig or {}).items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{index}-x{index:04d}",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": trainjob,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                "jobset.sigs.k8s.io/job-index": "0",
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "batch.kubernetes.io/job-name": job,
                "batch.kubernetes.io/job-completion-index": str(index),
            },
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [{"name": container, "image": "pytorch/pytorch", "resources": {"limits": limits}}],
        },
    }


def run_pod(store: Store, namespace: str, manifest: dict[str, Any], node: str) -> dict[str, Any]:
    """Create the pod, bind it to ``node`` and report it Running."""
    name = manifest["metadata"]["name"]
    store.create(PODS, namespace, manifest)
    store.bind_pod(namespace, name, {"target": {"kind": "Node", "name": node}})
    obj = store.get(PODS, namespace, name)
    obj["status"] = {"phase": "Running"}
    result: dict[str, Any] = store.update(PODS, namespace, obj, subresource="status", field_manager="kubelet")
    return result


def finish_pod(store: Store, namespace: str, name: str, phase: str = "Succeeded") -> None:
    obj = store.get(PODS, namespace, name)
    obj["status"] = {"phase": phase}
    store.update(PODS, namespace, obj, subresource="status", field_manager="kubelet")


def run_trainjob(
    store: Store,
    namespace: str,
    name: str,
    *,
    profile: str | None,
    trainer_updated: float | None,
    num_nodes: int = 1,
) -> None:
    """A TrainJob whose training step is ready (state ``running``), annotated with its GPU profile (None: the
    hashed one), and its trainerStatus last updated at ``trainer_updated`` (None: no trainerStatus)."""
    annotations = {PROFILE_ANNOTATION: profile} if profile is not None else None
    store.create(TRAINJOBS, namespace, trainjob_manifest(name, num_nodes=num_nodes, annotations=annotations))
    status = running_status()
    if trainer_updated is not None:
        status["trainerStatus"] = {"progressPercentage": 40, "lastUpdatedTime": rfc3339(trainer_updated)}
    write_status(store, namespace, name, status)
