"""Realistic pods of TrainJobs for the benchmarks: what JobSet's child Jobs create for a TrainJob, written
into a simulated API server's store (bench/simproc.py's big cluster, bench/replay.py's pods stream).

A production pod of a training job is 5-20 KB of JSON: the labels and annotations JobSet and the Job
controller put on it, its owner reference, a trainer container with tens of environment variables (the
torchrun ``PET_*`` ones, NCCL and framework settings), volume mounts, the projected service-account volume,
tolerations, and a status with five conditions and per-container statuses; the store adds the managedFields
of the two writers (kube-controller-manager creates the pod, the kubelet writes its status). The pods watch
decodes only the few fields it reads (app/trainer/pod_wire.py) and skips the rest, so a benchmark with small
pods would flatter it: these carry the rest.

Labels (kubernetes-sigs/jobset v0.12 api/jobset/v1alpha2/jobset_types.go, pkg/controllers/jobset_controller.go
``labelAndAnnotateObject``): ``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``,
``replicatedjob-replicas``, ``job-index``, ``job-global-index``, ``job-key``, ``restart-attempt``,
``jobset-uid``; the Job controller's ``batch.kubernetes.io/job-name``, ``controller-uid`` and
``job-completion-index`` (Indexed completion mode, which JobSet uses).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from kubesim.apiserver.core import PODS
from kubesim.apiserver.storage.store import Store

JOBSET: Final = "jobset.sigs.k8s.io/"
RUNNING: Final = "Running"
PENDING: Final = "Pending"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
_T0: Final = "2026-11-30T08:00:00Z"
_T1: Final = "2026-11-30T08:01:12Z"
_T2: Final = "2026-11-30T08:03:40Z"
_T3: Final = "2026-11-30T11:20:05Z"
LATER: Final = "2026-11-30T09:30:00Z"  # a later kubelet probe (a status rewrite that changes nothing read)


@dataclass(frozen=True)
class PodSpot:
    """Where one pod sits: its TrainJob (and JobSet, named after it), child Job and index."""

    namespace: str
    trainjob: str
    trainjob_uid: str
    runtime: str
    replicated_job: str
    job_index: int
    pod_index: int
    pods_in_job: int
    node: str
    seed: int

    @property
    def job_name(self) -> str:
        return f"{self.trainjob}-{self.replicated_job}-{self.job_index}"

    @property
    def name(self) -> str:
        suffix = hashlib.sha1(f"{self.namespace}/{self.trainjob}/{self.pod_index}".encode()).hexdigest()[:5]
        return f"{self.job_name}-{self.pod_index}-{suffix}"


def _uid(*parts: object) -> str:
    h = hashlib.md5("/".join(map(str, parts)).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


_NCCL_ENV: Final = (
    ("NCCL_DEBUG", "WARN"),
    ("NCCL_SOCKET_IFNAME", "eth0"),
    ("NCCL_IB_DISABLE", "0"),
    ("NCCL_IB_HCA", "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"),
    ("NCCL_NET_GDR_LEVEL", "PHB"),
    ("NCCL_CROSS_NIC", "0"),
    ("NCCL_ASYNC_ERROR_HANDLING", "1"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    ("TORCH_DISTRIBUTED_DEBUG", "OFF"),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ("OMP_NUM_THREADS", "8"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("HF_HOME", "/workspace/cache/huggingface"),
    ("HF_DATASETS_CACHE", "/workspace/cache/datasets"),
    ("TRANSFORMERS_CACHE", "/workspace/cache/transformers"),
    ("WANDB_PROJECT", "llm-finetune"),
    ("WANDB_MODE", "offline"),
    ("MLFLOW_TRACKING_URI", "http://mlflow.mlops.svc.cluster.local:5000"),
    ("LOG_LEVEL", "INFO"),
)


def pod_object(spot: PodSpot, *, gpus: int, restart_attempt: int = 0) -> dict[str, Any]:
    """The pod as the Job controller creates it (no status: the store gives a new pod ``Pending``)."""
    rng = random.Random(spot.seed)
    jobset_uid = _uid("jobset", spot.namespace, spot.trainjob)
    job_uid = _uid("job", spot.namespace, spot.job_name, restart_attempt)
    job_key = hashlib.sha1(f"{spot.namespace}/{spot.job_name}".encode()).hexdigest()
    index = str(spot.pod_index)
    jobset_labels = {
        JOBSET + "jobset-name": spot.trainjob,
        JOBSET + "replicatedjob-name": spot.replicated_job,
        JOBSET + "replicatedjob-replicas": "1",
        JOBSET + "job-index": str(spot.job_index),
        JOBSET + "job-global-index": str(spot.job_index),
        JOBSET + "job-key": job_key,
        JOBSET + "restart-attempt": str(restart_attempt),
        JOBSET + "jobset-uid": jobset_uid,
    }
    labels = {
        **jobset_labels,
        "batch.kubernetes.io/controller-uid": job_uid,
        "batch.kubernetes.io/job-name": spot.job_name,
        "batch.kubernetes.io/job-completion-index": index,
        "controller-uid": job_uid,
        "job-name": spot.job_name,
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
    }
    annotations = {
        **jobset_labels,
        "batch.kubernetes.io/job-completion-index": index,
        "kueue.x-k8s.io/workload": f"jobset-{spot.trainjob}-{job_key[:5]}",
        "kubectl.kubernetes.io/default-container": "node",
    }
    # 5-20 KB a pod: the environment is what varies most between production training pods.
    env: list[dict[str, Any]] = [
        {"name": "PET_NNODES", "value": str(spot.pods_in_job)},
        {"name": "PET_NPROC_PER_NODE", "value": str(max(gpus, 1))},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {
                    "apiVersion": "v1",
                    "fieldPath": ("metadata.annotations['batch.kubernetes.io/job-completion-index']"),
                }
            },
        },
        {"name": "PET_MASTER_ADDR", "value": f"{spot.trainjob}-{spot.replicated_job}-0-0.{spot.trainjob}"},
        {"name": "PET_MASTER_PORT", "value": "29400"},
        {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {
                "fieldRef": {
                    "apiVersion": "v1",
                    "fieldPath": ("metadata.labels['batch.kubernetes.io/job-completion-index']"),
                }
            },
        },
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
    ]
    env += [{"name": k, "value": v} for k, v in _NCCL_ENV]
    for i in range(rng.randrange(10, 120)):  # the job's own settings: hyper-parameters, paths, feature flags
        env.append({"name": f"TRAIN_SETTING_{i:03d}", "value": f"value-{rng.getrandbits(48):012x}"})
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "dataset", "mountPath": "/workspace/dataset", "readOnly": True},
        {"name": "model", "mountPath": "/workspace/model"},
        {"name": "checkpoints", "mountPath": "/workspace/checkpoints"},
        {
            "name": "kube-api-access",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True,
        },
    ]
    devices = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    container = {
        "name": "node",
        "image": "ghcr.io/kubeflow/trainer/torchtune-trainer:v2.3.0",
        "imagePullPolicy": "IfNotPresent",
        "command": ["torchrun"],
        "args": [
            "/workspace/train.py",
            "--config",
            "/workspace/config.yaml",
            "--output",
            "/workspace/checkpoints",
        ],
        "env": env,
        "ports": [{"containerPort": 29400, "name": "c10d", "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": "32", "memory": "256Gi", **devices},
            "limits": {"memory": "256Gi", **devices},
        },
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": spot.name,
            "generateName": f"{spot.job_name}-{index}-",
            "namespace": spot.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": spot.job_name,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {
            "containers": [container],
            "volumes": [
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
                {
                    "name": "dataset",
                    "persistentVolumeClaim": {"claimName": f"{spot.trainjob}-dataset", "readOnly": True},
                },
                {"name": "model", "persistentVolumeClaim": {"claimName": f"{spot.trainjob}-model"}},
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}},
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
            ],
            "hostname": f"{spot.job_name}-{index}",
            "subdomain": spot.trainjob,
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "terminationGracePeriodSeconds": 30,
            "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
    }


def _condition(kind: str, status: str, when: str, reason: str = "") -> dict[str, Any]:
    out = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": when}
    if reason:
        out["reason"] = reason
    return out


def pod_status(spot: PodSpot, phase: str, *, bound: bool = True) -> dict[str, Any]:
    """The pod's status as the scheduler and the kubelet write it in ``phase`` (``bound``: a Pending pod
    already scheduled, pulling its image)."""
    if phase == PENDING and not bound:
        return {
            "phase": PENDING,
            "qosClass": "Burstable",
            "conditions": [
                _condition("PodScheduled", "False", _T0, "Unschedulable")
                | {
                    "message": "0/64 nodes are available: 64 Insufficient nvidia.com/gpu. preemption: 0/64 "
                    "nodes are available: 64 No preemption victims found for incoming pod."
                }
            ],
        }
    ip = f"10.{spot.seed % 250}.{spot.pod_index % 250}.{(spot.seed // 250) % 250 + 2}"
    host = f"172.16.{spot.seed % 200}.{spot.seed % 97 + 10}"
    running = phase == RUNNING
    done = phase in (SUCCEEDED, FAILED)
    state: dict[str, Any]
    if running:
        state = {"running": {"startedAt": _T2}}
    elif done:
        code = 0 if phase == SUCCEEDED else 137
        state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "OOMKilled",
                "startedAt": _T2,
                "finishedAt": _T3,
                "containerID": f"containerd://{hashlib.sha256(spot.name.encode()).hexdigest()}",
            }
        }
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    ready = "True" if running else "False"
    reason = "PodCompleted" if done else ("" if running else "ContainersNotReady")
    status: dict[str, Any] = {
        "phase": phase,
        "qosClass": "Burstable",
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": _T1,
        "conditions": [
            _condition("PodReadyToStartContainers", "True" if running or done else "False", _T1),
            _condition("Initialized", "True", _T1, "PodCompleted" if done else ""),
            _condition("Ready", ready, _T2, reason),
            _condition("ContainersReady", ready, _T2, reason),
            _condition("PodScheduled", "True", _T0),
        ],
        "containerStatuses": [
            {
                "name": "node",
                "image": "ghcr.io/kubeflow/trainer/torchtune-trainer:v2.3.0",
                "imageID": "ghcr.io/kubeflow/trainer/torchtune-trainer@sha256:"
                + hashlib.sha256(b"torchtune-trainer").hexdigest(),
                "containerID": f"containerd://{hashlib.sha256(spot.name.encode()).hexdigest()}",
                "ready": running,
                "started": running,
                "restartCount": 0,
                "lastState": {},
                "state": state,
                "volumeMounts": [
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    {
                        "name": "dataset",
                        "mountPath": "/workspace/dataset",
                        "readOnly": True,
                        "recursiveReadOnly": "Disabled",
                    },
                    {"name": "model", "mountPath": "/workspace/model"},
                    {"name": "checkpoints", "mountPath": "/workspace/checkpoints"},
                    {
                        "name": "kube-api-access",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": True,
                        "recursiveReadOnly": "Disabled",
                    },
                ],
            }
        ],
    }
    return status


def job_phase(trainjob: dict[str, Any]) -> str:
    """The phase of a TrainJob's pods from its status: finished jobs' pods are Succeeded or Failed (kept
    until the JobSet is deleted), the others' Running."""
    for cond in (trainjob.get("status") or {}).get("conditions") or ():
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return FAILED
    return RUNNING


def spots(
    trainjobs: list[dict[str, Any]], count: int, *, max_per_job: int = 8
) -> Iterator[tuple[PodSpot, str]]:
    """``count`` pods (and each one's phase) over ``trainjobs`` in order: ``spec.trainer.numNodes`` pods a
    job (at most ``max_per_job``), in its replicated job ``node``; fewer TrainJobs than needed: round again
    with further child Jobs (``job_index`` 1, 2, ...)."""
    made, rounds = 0, 0
    while made < count and trainjobs:
        for job in trainjobs:
            meta, spec = job["metadata"], job.get("spec") or {}
            nodes = (spec.get("trainer") or {}).get("numNodes")
            per_job = max(1, min(max_per_job, nodes if isinstance(nodes, int) else 1))
            phase = job_phase(job)
            for i in range(per_job):
                if made >= count:
                    return
                spot = PodSpot(
                    namespace=meta["namespace"],
                    trainjob=meta["name"],
                    trainjob_uid=meta.get("uid", ""),
                    runtime=((spec.get("runtimeRef") or {}).get("name")) or "",
                    replicated_job="node",
                    job_index=rounds,
                    pod_index=i,
                    pods_in_job=per_job,
                    node=f"gpu-node-{made % 4096:04d}",
                    seed=made,
                )
                yield spot, phase
                made += 1
        rounds += 1


def write_pods(store: Store, trainjobs: list[dict[str, Any]], count: int) -> int:
    """``count`` pods of ``trainjobs`` created in ``store`` and given their status (bound to a node, in their
    TrainJob's phase), as kube-controller-manager and the kubelet write them; returns how many."""
    made = 0
    for spot, phase in spots(trainjobs, count):
        add_pod(store, spot, phase)
        made += 1
    return made


def add_pod(store: Store, spot: PodSpot, phase: str) -> dict[str, Any]:
    obj = pod_object(spot, gpus=8)
    obj["spec"]["nodeName"] = spot.node
    store.create(PODS, spot.namespace, obj, field_manager="kube-controller-manager", copy=False)
    return store.patch(
        PODS,
        spot.namespace,
        spot.name,
        {"status": pod_status(spot, phase)},
        subresource="status",
        field_manager="kubelet",
        copy=False,
    )
