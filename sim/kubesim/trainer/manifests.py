"""The Kubeflow Trainer's own manifests, shipped in ``data/`` (kubeflow/trainer v2.3.0, Apache-2.0): its CRDs,
the ClusterTrainingRuntimes it installs, and the example TrainJobs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from kubesim.apiserver.crds import CrdRegistry, crd_registry, load_manifest_objects

DATA_DIR = Path(__file__).parent / "data"
MANIFESTS_DIR = DATA_DIR / "manifests" / "base"
CRDS_DIR = MANIFESTS_DIR / "crds"
RUNTIMES_DIR = MANIFESTS_DIR / "runtimes"
EXAMPLES_DIR = DATA_DIR / "examples"


@functools.cache
def trainer_crds() -> CrdRegistry:
    """The TrainJob, TrainingRuntime and ClusterTrainingRuntime CRDs. Parsed once per process."""
    return crd_registry(load_manifest_objects(CRDS_DIR))


def cluster_training_runtimes() -> list[dict[str, Any]]:
    """The ClusterTrainingRuntimes upstream ships (fresh copies)."""
    return [obj for obj in load_manifest_objects(RUNTIMES_DIR) if obj.get("kind") == "ClusterTrainingRuntime"]
