"""The runtimes the simulated cluster offers: the vendored upstream ClusterTrainingRuntimes, per-namespace
TrainingRuntimes, "plain" runtimes without an mlPolicy and synthetic benchmark runtimes, plus the
``RuntimeChoice`` a TrainJob is pointed at.

Split from ``sim/kubesim/trainer/shapes.py`` because reading manifests from disk and describing a runtime is a
different job from building TrainJobs and their status.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

import yaml

from kubesim.trainer.kinds import TRAINER_GROUP, TRAINER_VERSION
from kubesim.trainer.manifests import EXAMPLES_DIR, RUNTIMES_DIR
from kubesim.trainer.truth_resources import runtime_facts

API_VERSION: Final = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
CLUSTER_KIND: Final = "ClusterTrainingRuntime"
NAMESPACED_KIND: Final = "TrainingRuntime"
ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL: Final = "trainer.kubeflow.org/framework"
IMAGES: Final = (
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
    "python:3.11-slim",
    "ghcr.io/flux-framework/tutorials:gpu-lammps-hwloc",
    "nvcr.io/nvidia/jax:25.10-py3",
)


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
