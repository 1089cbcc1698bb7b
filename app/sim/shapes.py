"""Realistic Trainer object shapes for the workload generator: runtimes from the vendored manifests,
TrainJob specs seeded from the upstream examples, and the status blocks the Trainer controller writes.

Builders return fresh, small dicts (no deep copies of big templates): populate() builds 100k TrainJobs
and the store keeps whatever it is given.
"""

from __future__ import annotations

import copy
import random
import time
from bisect import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

import yaml

from app.sim.truth import runtime_facts
from app.trainer.kinds import TRAINER_GROUP, TRAINER_VERSION

DATA_DIR: Final = Path(__file__).resolve().parent / "data"
RUNTIMES_DIR: Final = DATA_DIR / "manifests" / "base" / "runtimes"
EXAMPLES_DIR: Final = DATA_DIR / "examples"

API_VERSION: Final = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
CLUSTER_KIND: Final = "ClusterTrainingRuntime"
NAMESPACED_KIND: Final = "TrainingRuntime"
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL: Final = "trainer.kubeflow.org/framework"
SIM_FINALIZER: Final = "sim.trainer-metrics.io/artifact-export"

# Controller messages (trainer pkg/constants, jobset pkg/constants) so status looks like a real cluster's.
SUSPENDED_MESSAGE: Final = "TrainJob is suspended"
RESUMED_MESSAGE: Final = "TrainJob is resumed"
COMPLETE_REASON: Final = "AllJobsCompleted"
COMPLETE_MESSAGE: Final = "jobset completed successfully"
FAILURE_MESSAGES: Final = {
    "FailedJobs": "jobset failed due to one or more job failures",
    "DeadlineExceeded": "TrainJob exceeded its active deadline",
    "ReachedMaxRestarts": "jobset failed due to reaching max number of restarts",
    "FailJobSetFailurePolicyAction": "jobset failed due to applying failure policy rule: FailJobSet",
    "TrainingRuntimeNotSupported": "Specified runtime is not supported",
    # Not Trainer v2.3 or JobSet v0.12 reasons, as a newer release (or another controller) could write: the
    # well-formed ones (CamelCase, <= 64 characters) are label values by name, the rest count as "other".
    # All match the CRD's condition-reason pattern, so the API server stores them.
    "PodFailurePolicyRuleMatched": "pod failure policy rule matched on container node",
    "InPlaceRestartBudgetExhausted": "jobset failed: in-place restart budget exhausted",
    "evicted_by_descheduler": "pods evicted by the descheduler",
    "Preempted:HigherPriority": "preempted by a higher-priority workload",
    "FailedJobsBecauseTheNodePoolWasScaledDownWhileTheTrainerPodsWereStillRunning": "node pool scaled down",
}

NAMESPACE_NAMES: Final = ("default", "ml-research", "team-vision", "team-nlp", "kueue-tenant-a", "recsys")
JOB_NAME_BASES: Final = (
    "multi-node-example",
    "runtime-patches-example",
    "kueue-example",
    "volcano-example",
    "multi-step-example",
    "lammps-flux",
    "lammps-flux-interactive",
    "llama3-2-1b-finetune",
    "qwen2-5-sft",
    "resnet50-imagenet",
    "bert-base-mlm",
    "xgb-ctr",
    "jax-gpt2",
    "deepspeed-zero3",
)
# A realistic long name: generated names get trimmed to it so some reach the 63-character limit.
LONG_NAME_BASE: Final = "llama3-2-3b-full-finetune-alpaca-bf16-fsdp-lr2e-5-warmup-cosine-sweep"
QUEUE_NAMES: Final = ("training-queue", "team-queue", "gpu-queue")
IMAGES: Final = (
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
    "python:3.11-slim",
    "ghcr.io/flux-framework/tutorials:gpu-lammps-hwloc",
    "nvcr.io/nvidia/jax:25.10-py3",
)
HUGE_ANNOTATION: Final = "sim.trainer-metrics.io/blob"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RuntimeChoice:
    """A runtime TrainJobs may reference, with what the generator needs to write plausible status."""

    kind: str
    namespace: str  # "" for ClusterTrainingRuntime
    name: str
    replicated_jobs: tuple[str, ...]  # names, in template order
    initializers: tuple[str, ...]  # replicated jobs that run before the trainer
    trainers: tuple[str, ...]  # "node" and, for MPI, "launcher"
    has_gpu: bool  # the trainer container requests GPUs itself
    weight: float

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.namespace, self.name

    @property
    def ref_label(self) -> str:
        """The runtime_ref label of a TrainJob that references this runtime."""
        return f"{TRAINER_GROUP}/{self.kind}/{self.namespace}/{self.name}"


class WeightedPicker(Generic[T]):
    """rng.choices without its per-call setup: one random() and a bisect, as populate() needs."""

    def __init__(self, items: Sequence[T], weights: Sequence[float]) -> None:
        if not items:
            raise ValueError("nothing to pick from")
        self._items = list(items)
        self._cumulative = list(accumulate(weights))
        self._total = self._cumulative[-1]

    def pick(self, rng: random.Random) -> T:
        index = bisect(self._cumulative, rng.random() * self._total)
        return self._items[min(index, len(self._items) - 1)]


# ---------------------------------------------------------------------------------------------------------
# Runtimes
# ---------------------------------------------------------------------------------------------------------


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.load_all(handle, Loader=loader) if isinstance(doc, dict)]


@lru_cache(maxsize=1)
def _cluster_runtime_docs() -> tuple[dict[str, Any], ...]:
    paths = sorted(p for p in RUNTIMES_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")
    paths += [
        EXAMPLES_DIR / "flux" / "flux-runtime.yaml",
        EXAMPLES_DIR / "yaml" / "04-volcano-integration.yaml",
    ]
    docs = [doc for path in paths for doc in _yaml_docs(path)]
    return tuple(doc for doc in docs if doc.get("kind") == CLUSTER_KIND)


@lru_cache(maxsize=1)
def _namespaced_runtime_docs() -> tuple[dict[str, Any], ...]:
    """Per-namespace TrainingRuntimes: the multi-step example's runtime and a copy of torch-distributed."""
    docs = [
        doc
        for doc in _yaml_docs(EXAMPLES_DIR / "yaml" / "05-multi-step.yaml")
        if doc["kind"] == NAMESPACED_KIND
    ]
    torch = next(doc for doc in _cluster_runtime_docs() if doc["metadata"]["name"] == "torch-distributed")
    docs.append({**copy.deepcopy(torch), "kind": NAMESPACED_KIND})
    return tuple(docs)


def cluster_runtimes() -> list[dict[str, Any]]:
    """The real ClusterTrainingRuntimes (upstream manifests plus the flux and volcano examples)."""
    return copy.deepcopy(list(_cluster_runtime_docs()))


def namespaced_runtimes(namespace: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(list(_namespaced_runtime_docs()))
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs


def synthetic_runtime(index: int, namespace: str | None) -> dict[str, Any]:
    """A benchmark runtime: torch-like, with varied mlPolicy.numNodes and trainer GPUs."""
    ml_policy: dict[str, Any] = {("torch", "jax", "xgboost")[index % 3]: {}}
    num_nodes = (None, 1, 2, 4)[index % 4]
    if num_nodes is not None:
        ml_policy["numNodes"] = num_nodes
    container: dict[str, Any] = {"name": "node", "image": IMAGES[index % 2]}
    gpus = (0, 1, 2, 8)[(index // 4) % 4]
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    metadata: dict[str, Any] = {"name": f"bench-rt-{index:05d}", "labels": {FRAMEWORK_LABEL: "torch"}}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": CLUSTER_KIND if namespace is None else NAMESPACED_KIND,
        "metadata": metadata,
        "spec": {
            "mlPolicy": ml_policy,
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {"template": {"spec": {"containers": [container]}}},
                            },
                        }
                    ]
                }
            },
        },
    }


def plain_runtimes() -> list[dict[str, Any]]:
    """ClusterTrainingRuntimes without an mlPolicy ("plain ML"), the torch-distributed template otherwise:
    the controller runs their trainer job's ``parallelism`` nodes (default 1) and does not merge a
    TrainJob's resourcesPerNode into them. One asks for TPUs in its node container, one is CPU-only with
    no parallelism set."""
    torch = next(doc for doc in _cluster_runtime_docs() if doc["metadata"]["name"] == "torch-distributed")
    docs = []
    for name, parallelism, resources in (
        ("sim-plain-tpu", 4, {"limits": {"google.com/tpu": 4}}),
        ("sim-plain-cpu", None, {"requests": {"cpu": "2"}}),
    ):
        doc = copy.deepcopy(torch)
        doc["metadata"] = {"name": name, "labels": {FRAMEWORK_LABEL: "plain"}}
        del doc["spec"]["mlPolicy"]
        job = doc["spec"]["template"]["spec"]["replicatedJobs"][0]
        if parallelism is not None:
            job["template"]["spec"]["parallelism"] = parallelism
        job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
        docs.append(doc)
    return docs


def runtime_choice(runtime: dict[str, Any], weight: float) -> RuntimeChoice:
    meta = runtime.get("metadata") or {}
    jobs = ((runtime.get("spec") or {}).get("template") or {}).get("spec", {}).get("replicatedJobs") or []
    names = tuple(str(job.get("name")) for job in jobs if isinstance(job, dict) and job.get("name"))
    names = names or ("node",)
    return RuntimeChoice(
        kind=str(runtime.get("kind")),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name")),
        replicated_jobs=names,
        initializers=tuple(name for name in names if name not in ("node", "launcher")),
        trainers=tuple(name for name in names if name in ("node", "launcher")) or ("node",),
        has_gpu=bool(runtime_facts(runtime).accelerators()),
        weight=weight,
    )


# ---------------------------------------------------------------------------------------------------------
# TrainJobs
# ---------------------------------------------------------------------------------------------------------


def namespace_names(count: int) -> list[str]:
    names = list(NAMESPACE_NAMES[:count])
    names += [f"team-{index:02d}" for index in range(len(names), count)]
    return names


def job_name(rng: random.Random, suffix: str) -> str:
    """An RFC-1035 label of at most 63 characters ending in the unique ``suffix``."""
    if rng.random() < 0.05:
        base = LONG_NAME_BASE[: 62 - len(suffix)].rstrip("-")
    else:
        base = JOB_NAME_BASES[int(rng.random() * len(JOB_NAME_BASES))]
    return f"{base}-{suffix}"


def runtime_ref(rng: random.Random, runtime: RuntimeChoice) -> dict[str, Any]:
    """Sometimes omit apiGroup/kind so the CRD defaults must supply them (the flux examples do)."""
    roll = rng.random()
    if runtime.kind == CLUSTER_KIND:
        if roll < 0.3:
            return {"name": runtime.name}
        if roll < 0.45:
            return {"kind": CLUSTER_KIND, "name": runtime.name}
    elif roll < 0.3:
        return {"kind": NAMESPACED_KIND, "name": runtime.name}
    return {"apiGroup": TRAINER_GROUP, "kind": runtime.kind, "name": runtime.name}


def num_nodes(rng: random.Random) -> int | None:
    """Absent a quarter of the time, rarely 0 (legal, stays 0), else 1..16 with powers of two favoured."""
    roll = rng.random()
    if roll < 0.25:
        return None
    if roll < 0.28:
        return 0
    if roll < 0.85:
        return (1, 2, 4, 8, 16)[int(rng.random() * 5)]
    return 1 + int(rng.random() * 16)


# Accelerator requests beyond plain GPUs (docs/design/product.md §3): MIG slices, TPUs, Gaudi, Neuron, and
# two classes on one node; plus a name that contains "gpu" but is not an accelerator by default.
OTHER_ACCELERATORS: Final[tuple[dict[str, Any], ...]] = (
    {"limits": {"nvidia.com/mig-1g.10gb": 2}},
    {"requests": {"nvidia.com/mig-3g.40gb": "1", "cpu": "4"}, "limits": {"nvidia.com/mig-3g.40gb": "1"}},
    {"limits": {"google.com/tpu": 4}},
    {"requests": {"habana.ai/gaudi": "8", "memory": "128Gi"}, "limits": {"habana.ai/gaudi": "8"}},
    {"limits": {"aws.amazon.com/neuron": 1, "aws.amazon.com/neuroncore": 2}},
    {"limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-2g.20gb": 2}},
    {"limits": {"gpu.intel.com/i915": 1}},
    {"requests": {"cpu": "2", "example.com/gpu-memory": "16"}},
)


def resources_per_node(rng: random.Random, runtime_has_gpu: bool) -> dict[str, Any] | None:
    """None; CPU only (on a GPU runtime too: merged into the runtime's container, its GPUs stay); GPUs
    (nvidia/amd) in requests+limits, limits only, or CPU requests with GPU limits; an explicit 0 GPUs (a
    GPU runtime made CPU-only); or another accelerator shape (OTHER_ACCELERATORS)."""
    roll = rng.random()
    if roll < 0.30:
        return None
    gpus: int | str = (1, 2, 4, 8)[int(rng.random() * 4)]
    if rng.random() < 0.5:
        gpus = str(gpus)
    gpu_name = "nvidia.com/gpu" if rng.random() < 0.8 else "amd.com/gpu"
    if roll < 0.48:
        return {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
    if roll < 0.52 and runtime_has_gpu:
        return {"requests": {"nvidia.com/gpu": 0}, "limits": {"nvidia.com/gpu": 0}}
    if roll < 0.72:
        return {
            "requests": {"cpu": "8", "memory": "64Gi", gpu_name: gpus},
            "limits": {"memory": "64Gi", gpu_name: gpus},
        }
    if roll < 0.78:
        return {"requests": {"cpu": "8"}, "limits": {gpu_name: gpus}}
    if roll < 0.86:
        return {"limits": {gpu_name: gpus}}
    return copy.deepcopy(OTHER_ACCELERATORS[int(rng.random() * len(OTHER_ACCELERATORS))])


@dataclass(slots=True)
class JobShape:
    """Knobs of one TrainJob, chosen before its object is built (so malformed mode can bend them)."""

    namespace: str
    name: str
    runtime: RuntimeChoice
    ref: dict[str, Any]
    num_nodes: int | None
    resources: dict[str, Any] | None
    queue: str | None  # Kueue queue label; implies spec.suspend true
    deadline: int | None
    finalizer: bool = False
    annotations: dict[str, str] | None = None


def random_shape(
    rng: random.Random, namespace: str, name: str, runtime: RuntimeChoice, *, suspend_ratio: float
) -> JobShape:
    return JobShape(
        namespace=namespace,
        name=name,
        runtime=runtime,
        ref=runtime_ref(rng, runtime),
        num_nodes=num_nodes(rng),
        resources=resources_per_node(rng, runtime.has_gpu),
        queue=QUEUE_NAMES[int(rng.random() * len(QUEUE_NAMES))] if rng.random() < suspend_ratio else None,
        deadline=(3600, 7200, 86400)[int(rng.random() * 3)] if rng.random() < 0.2 else None,
    )


def trainjob(shape: JobShape) -> dict[str, Any]:
    trainer: dict[str, Any] = {"command": ["torchrun", "train.py"]}
    if shape.num_nodes is not None:
        trainer["numNodes"] = shape.num_nodes
    if shape.resources is not None:
        trainer["resourcesPerNode"] = shape.resources
    spec: dict[str, Any] = {"runtimeRef": shape.ref, "trainer": trainer}
    metadata: dict[str, Any] = {"name": shape.name, "namespace": shape.namespace}
    if shape.queue is not None:
        metadata["labels"] = {QUEUE_LABEL: shape.queue}
        spec["suspend"] = True
    if shape.deadline is not None:
        spec["activeDeadlineSeconds"] = shape.deadline
    if shape.finalizer:
        metadata["finalizers"] = [SIM_FINALIZER]
    if shape.annotations:
        metadata["annotations"] = shape.annotations
    if shape.runtime.initializers:
        spec["initializer"] = {"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}}
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}


# ---------------------------------------------------------------------------------------------------------
# Status, as the Trainer controller writes it (docs/design/trainer-domain.md §1-§2)
# ---------------------------------------------------------------------------------------------------------


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def condition(cond_type: str, status: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "type": cond_type,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when,
    }


def suspended_condition(when: str) -> dict[str, Any]:
    return condition("Suspended", "True", "Suspended", SUSPENDED_MESSAGE, when)


def resumed_condition(when: str) -> dict[str, Any]:
    return condition("Suspended", "False", "Resumed", RESUMED_MESSAGE, when)


def complete_condition(when: str) -> dict[str, Any]:
    return condition("Complete", "True", COMPLETE_REASON, COMPLETE_MESSAGE, when)


def failed_condition(reason: str, when: str) -> dict[str, Any]:
    return condition("Failed", "True", reason, FAILURE_MESSAGES.get(reason, "TrainJob failed"), when)


def jobs_status(
    names: Sequence[str],
    *,
    active: Sequence[str] = (),
    succeeded: Sequence[str] = (),
    failed: Sequence[str] = (),
    suspended: bool = False,
    ready: bool = False,
) -> list[dict[str, Any]]:
    """status.jobsStatus: one entry per replicated job; counts are child Jobs (one per replicated job)."""
    return [
        {
            "name": name,
            "active": int(name in active),
            "ready": int(ready and name in active),
            "succeeded": int(name in succeeded),
            "failed": int(name in failed),
            "suspended": int(suspended),
        }
        for name in names
    ]


# ---------------------------------------------------------------------------------------------------------
# Trainer progress (status.trainerStatus, KEP-2779: alpha, feature gate TrainJobStatus)
# ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class TrainingRun:
    """What a running trainer reports about itself: progress that ticks, a loss that goes down, an accuracy
    that goes up, an ETA from the pace so far; plus a checkpoint path, a metric that is text, not a number."""

    started_at: float  # clock() when it began reporting
    progress: float  # percent
    loss: float
    accuracy: float
    step: int

    @classmethod
    def begin(cls, rng: random.Random, now: float, *, warm: bool = False) -> TrainingRun:
        """A run that starts now, or (``warm``) one that has been training for a while already."""
        done = rng.random() * 80.0 if warm else 0.0
        run = cls(now - done * 30.0, done, 2.0 + rng.random(), 0.1 + rng.random() * 0.2, int(done * 50))
        run.loss *= 0.97 ** (done / 2)
        return run

    def advance(self, rng: random.Random) -> None:
        gain = 2.0 + rng.random() * 10.0
        self.progress = min(99.0, self.progress + gain)
        self.loss *= 0.88 + rng.random() * 0.1
        self.accuracy = min(0.99, self.accuracy + (1.0 - self.accuracy) * rng.random() * 0.2)
        self.step += int(gain * 50)

    def status(self, now: float) -> dict[str, Any]:
        percent = int(self.progress)
        status: dict[str, Any] = {
            "progressPercentage": percent,
            "lastUpdatedTime": rfc3339(now),
            "metrics": [
                {"name": "loss", "value": f"{self.loss:.4f}"},
                {"name": "eval_accuracy", "value": f"{self.accuracy:.4f}"},
                {"name": "learning_rate", "value": "3e-05"},
                {"name": "checkpoint", "value": f"s3://checkpoints/step-{self.step}"},
            ],
        }
        if percent > 0:
            elapsed = max(now - self.started_at, 1.0)
            status["estimatedRemainingSeconds"] = int(elapsed * (100 - percent) / percent)
        return status
