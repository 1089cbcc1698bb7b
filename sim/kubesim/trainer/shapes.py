"""Realistic TrainJob specs for the workload generator, seeded from the upstream examples: which runtime,
how many nodes, which resources, whether Kueue queues it (and MultiKueue runs it elsewhere), a deadline.

Builders return fresh, small dicts (no deep copies of big templates): populate() builds 100k TrainJobs
and the store keeps whatever it is given. Runtimes are in ``shapes_runtimes``, status blocks in
``shapes_status``, Kueue's part of a spec in ``kueue``.
"""

from __future__ import annotations

import copy
import random
from bisect import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, Generic, TypeVar

from kubesim.trainer import kueue
from kubesim.trainer.kinds import TRAINER_GROUP
from kubesim.trainer.shapes_runtimes import API_VERSION, CLUSTER_KIND, NAMESPACED_KIND, RuntimeChoice

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


# References to a runtime kind the controller has not registered, as people get them wrong: a plural kind,
# the Training Operator v1 group. The validating webhook refuses them (kubeflow/trainer v2.3.0
# pkg/webhooks/trainjob_webhook.go ValidateCreate: "unsupported runtime"); one reaches the store only while
# the webhook is bypassed (its configuration being reinstalled, say): the generator makes them rare.
UNREGISTERED_REFS: Final[tuple[dict[str, str], ...]] = (
    {"apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntimes"},
    {"apiGroup": "kubeflow.org", "kind": CLUSTER_KIND},
)


def unregistered_ref(rng: random.Random, runtime: RuntimeChoice) -> dict[str, Any]:
    return {**UNREGISTERED_REFS[int(rng.random() * len(UNREGISTERED_REFS))], "name": runtime.name}


def num_nodes(rng: random.Random, max_nodes: int | None = None) -> int | None:
    """Absent a quarter of the time, rarely 0 (legal, stays 0), else 1..16 with powers of two favoured;
    never above ``max_nodes`` (what the runtime's webhook accepts)."""
    roll = rng.random()
    if roll < 0.25:
        return None
    if roll < 0.28:
        count = 0
    elif roll < 0.85:
        count = (1, 2, 4, 8, 16)[int(rng.random() * 5)]
    else:
        count = 1 + int(rng.random() * 16)
    return count if max_nodes is None else min(count, max_nodes)


# Accelerator requests beyond plain GPUs (docs/design/product.md §3): MIG slices, TPUs, Gaudi, Neuron, two
# classes on one node, NVIDIA's time-sliced GPUs renamed to gpu.shared; Intel GPUs with the resources
# Intel's device plugin advertises beside its devices (millicores, memory.max, tiles: shares and sizes, not
# devices; i915_monitoring / xe_monitoring: a monitoring pod's handle on every GPU), which never count; and
# a name that contains "gpu" without being a device.
OTHER_ACCELERATORS: Final[tuple[dict[str, Any], ...]] = (
    {"limits": {"nvidia.com/mig-1g.10gb": 2}},
    {"requests": {"nvidia.com/mig-3g.40gb": "1", "cpu": "4"}, "limits": {"nvidia.com/mig-3g.40gb": "1"}},
    {"limits": {"google.com/tpu": 4}},
    {"requests": {"habana.ai/gaudi": "8", "memory": "128Gi"}, "limits": {"habana.ai/gaudi": "8"}},
    {"limits": {"aws.amazon.com/neuron": 1, "aws.amazon.com/neuroncore": 2}},
    {"limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-2g.20gb": 2}},
    {"limits": {"gpu.intel.com/i915": 1}},
    {"requests": {"cpu": "2", "example.com/gpu-memory": "16"}},
    {"limits": {"nvidia.com/gpu.shared": 1}},
    {"limits": {"gpu.intel.com/i915": 1, "gpu.intel.com/millicores": 500, "gpu.intel.com/memory.max": "8G"}},
    {"limits": {"gpu.intel.com/xe": 2, "gpu.intel.com/tiles": 2}},
    {"limits": {"gpu.intel.com/millicores": "250", "gpu.intel.com/memory.max": "4Gi"}},
    {"limits": {"gpu.intel.com/i915_monitoring": 1, "gpu.intel.com/xe_monitoring": 1}},
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
    if roll < 0.70:
        return {
            "requests": {"cpu": "8", "memory": "64Gi", gpu_name: gpus},
            "limits": {"memory": "64Gi", gpu_name: gpus},
        }
    if roll < 0.76:
        return {"requests": {"cpu": "8"}, "limits": {gpu_name: gpus}}
    if roll < 0.82:
        return {"limits": {gpu_name: gpus}}
    return copy.deepcopy(OTHER_ACCELERATORS[int(rng.random() * len(OTHER_ACCELERATORS))])


# activeDeadlineSeconds people set, as a safety net above the run they expect: half an hour to two days.
DEADLINES: Final = (1800, 3600, 7200, 14_400, 28_800, 43_200, 86_400, 172_800)
DEADLINE_RATIO: Final = 0.1
# Kueue-queued jobs whose ClusterQueue dispatches them through MultiKueue (managedBy defaulted by Kueue).
MULTIKUEUE_RATIO: Final = 0.1
UNREGISTERED_RATIO: Final = 0.003


@dataclass(slots=True)
class JobShape:
    """Knobs of one TrainJob, chosen before its object is built (so malformed mode can bend them)."""

    namespace: str
    name: str
    runtime: RuntimeChoice
    ref: dict[str, Any]
    num_nodes: int | None
    resources: dict[str, Any] | None
    queue: str | None  # Kueue queue label: Kueue's webhook suspends it
    deadline: int | None  # spec.activeDeadlineSeconds
    multikueue: bool = False  # Kueue defaulted managedBy to MultiKueue (implies a queue)
    finalizer: bool = False
    annotations: dict[str, str] | None = None


def random_shape(
    rng: random.Random,
    namespace: str,
    name: str,
    runtime: RuntimeChoice,
    *,
    suspend_ratio: float,
    deadline_ratio: float = DEADLINE_RATIO,
    unregistered_ratio: float = UNREGISTERED_RATIO,
) -> JobShape:
    queue = QUEUE_NAMES[int(rng.random() * len(QUEUE_NAMES))] if rng.random() < suspend_ratio else None
    deadline = DEADLINES[int(rng.random() * len(DEADLINES))] if rng.random() < deadline_ratio else None
    # Drawn whatever the ratio, so that a seed makes the same jobs with these references on or off.
    odd = rng.random() < unregistered_ratio
    ref = unregistered_ref(rng, runtime) if odd else runtime_ref(rng, runtime)
    return JobShape(
        namespace=namespace,
        name=name,
        runtime=runtime,
        ref=ref,
        num_nodes=num_nodes(rng, runtime.max_nodes),
        resources=resources_per_node(rng, runtime.has_gpu),
        queue=queue,
        deadline=deadline,
        multikueue=queue is not None and rng.random() < MULTIKUEUE_RATIO,
    )


def trainjob(shape: JobShape, when: str) -> dict[str, Any]:
    """The TrainJob as the API server stores it after the admission webhooks (``when``: the time they ran)."""
    trainer: dict[str, Any] = {"command": ["torchrun", "train.py"]}
    if shape.num_nodes is not None:
        trainer["numNodes"] = shape.num_nodes
    if shape.resources is not None:
        trainer["resourcesPerNode"] = shape.resources
    spec: dict[str, Any] = {"runtimeRef": shape.ref, "trainer": trainer}
    metadata: dict[str, Any] = {"name": shape.name, "namespace": shape.namespace}
    if shape.queue is not None:
        metadata["labels"] = {kueue.QUEUE_LABEL: shape.queue}
        kueue.queued_spec(spec, when=when, multikueue=shape.multikueue)
    if shape.deadline is not None:
        spec["activeDeadlineSeconds"] = shape.deadline
    if shape.finalizer:
        metadata["finalizers"] = [SIM_FINALIZER]
    if shape.annotations:
        metadata["annotations"] = shape.annotations
    initializer: dict[str, Any] = {}
    if "dataset-initializer" in shape.runtime.initializers:
        initializer["dataset"] = {"storageUri": "hf://tatsu-lab/alpaca"}
    if "model-initializer" in shape.runtime.initializers:
        initializer["model"] = {"storageUri": "hf://meta-llama/Llama-3.2-1B-Instruct"}
    if initializer:
        spec["initializer"] = initializer
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
