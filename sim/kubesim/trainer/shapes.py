"""Realistic Trainer object shapes for the workload generator: runtimes from the vendored manifests,
TrainJob specs seeded from the upstream examples, and the status blocks the Trainer controller writes.

Builders return fresh, small dicts (no deep copies of big templates): populate() builds 100k TrainJobs
and the store keeps whatever it is given.

Runtimes live in ``shapes_runtimes`` and status blocks in ``shapes_status``; this module builds TrainJob
specs and re-exports the other two, so ``shapes.X`` keeps working for every caller.
"""

from __future__ import annotations

import copy
import random
from bisect import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, Generic, TypeVar

from kubesim.trainer.kinds import TRAINER_GROUP
from kubesim.trainer.shapes_runtimes import (
    ANCESTOR_LABEL,
    API_VERSION,
    CLUSTER_KIND,
    FRAMEWORK_LABEL,
    IMAGES,
    NAMESPACED_KIND,
    RuntimeChoice,
    cluster_runtimes,
    namespaced_runtimes,
    plain_runtimes,
    runtime_choice,
    synthetic_runtime,
)
from kubesim.trainer.shapes_status import (
    COMPLETE_MESSAGE,
    COMPLETE_REASON,
    FAILURE_MESSAGES,
    RESUMED_MESSAGE,
    SUSPENDED_MESSAGE,
    TrainingRun,
    complete_condition,
    condition,
    failed_condition,
    jobs_status,
    resumed_condition,
    rfc3339,
    suspended_condition,
)

__all__ = [
    "ANCESTOR_LABEL",
    "API_VERSION",
    "CLUSTER_KIND",
    "COMPLETE_MESSAGE",
    "COMPLETE_REASON",
    "FAILURE_MESSAGES",
    "FRAMEWORK_LABEL",
    "HUGE_ANNOTATION",
    "IMAGES",
    "JOB_NAME_BASES",
    "LONG_NAME_BASE",
    "NAMESPACED_KIND",
    "NAMESPACE_NAMES",
    "OTHER_ACCELERATORS",
    "QUEUE_LABEL",
    "QUEUE_NAMES",
    "RESUMED_MESSAGE",
    "SIM_FINALIZER",
    "SUSPENDED_MESSAGE",
    "JobShape",
    "RuntimeChoice",
    "TrainingRun",
    "WeightedPicker",
    "cluster_runtimes",
    "complete_condition",
    "condition",
    "failed_condition",
    "job_name",
    "jobs_status",
    "namespace_names",
    "namespaced_runtimes",
    "num_nodes",
    "plain_runtimes",
    "random_shape",
    "resources_per_node",
    "resumed_condition",
    "rfc3339",
    "runtime_choice",
    "runtime_ref",
    "suspended_condition",
    "synthetic_runtime",
    "trainjob",
]

QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
SIM_FINALIZER: Final = "sim.trainer-metrics.io/artifact-export"
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
HUGE_ANNOTATION: Final = "sim.trainer-metrics.io/blob"

T = TypeVar("T")


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
