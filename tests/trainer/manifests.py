"""The real Kubeflow Trainer manifests vendored in sim/kubesim/trainer/data, as JSON-ready objects.

The examples are what a user applies, so they lack server-set metadata; ``stored`` adds what the
apiserver would (uid, namespace, resourceVersion, creationTimestamp) without touching the spec, so
that defaulting (e.g. runtimeRef without apiGroup/kind in the flux examples) stays our job.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import msgspec
import yaml

from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
)
from app.trainer.projection_types import RuntimeProjection, TrainJobProjection
from kubesim.trainer.manifests import DATA_DIR

DATA = DATA_DIR


def _documents() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(DATA.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or "crds" in path.parts:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind"):
                out.append((str(path.relative_to(DATA)), doc))
    return out


DOCUMENTS = _documents()


def stored(
    doc: dict[str, Any], *, namespace: str = "default", rv: int = 100, uid: str | None = None
) -> dict[str, Any]:
    obj = copy.deepcopy(doc)
    meta = obj.setdefault("metadata", {})
    if obj["kind"] != "ClusterTrainingRuntime":
        meta.setdefault("namespace", namespace)
    meta.setdefault("uid", uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{obj['kind']}/{meta['name']}")))
    meta.setdefault("resourceVersion", str(rv))
    meta.setdefault("creationTimestamp", "2025-06-01T10:00:00Z")
    meta.setdefault("managedFields", [{"manager": "kubectl", "fieldsV1": {"f:spec": {"x": "y" * 500}}}])
    return obj


def by_kind(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path}:{doc['metadata']['name']}", stored(doc)) for path, doc in DOCUMENTS if doc["kind"] == kind
    ]


def typed(obj: Any, wire_type: type) -> Any:
    """What the informer's fast path does: msgspec decodes the JSON bytes into the wire struct."""
    return msgspec.json.decode(msgspec.json.encode(obj), type=wire_type)


# --- shared by the TrainerState tests ---------------------------------------------------------------------

G = "trainer.kubeflow.org"
TORCH = f"{G}/ClusterTrainingRuntime//torch-distributed"


class Clock:
    """A settable monotonic clock for TrainerState."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def runtime_doc(name: str) -> dict[str, Any]:
    for kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
        for _, o in by_kind(kind):
            if o["metadata"]["name"] == name:
                return copy.deepcopy(o)
    raise KeyError(name)


def runtime(
    name: str = "torch-distributed", *, rv: int = 5, num_nodes: int | None = 1, ns: str = "team-a"
) -> RuntimeProjection:
    obj = runtime_doc(name)
    obj["metadata"]["resourceVersion"] = str(rv)
    if num_nodes is None:
        obj["spec"]["mlPolicy"].pop("numNodes", None)
    else:
        obj["spec"]["mlPolicy"]["numNodes"] = num_nodes
    if obj["kind"] == "TrainingRuntime":
        obj["metadata"]["namespace"] = ns
        p = TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    else:
        p = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    assert p is not None
    return p


def trainjob(name: str, spec: dict[str, Any]) -> TrainJobProjection:
    """A TrainJob with ``spec`` in namespace team-a (uid ``uid-<name>``), as the informer projects it."""
    p = TRAINJOB_PROJECTOR.from_json(
        {
            "metadata": {
                "name": name,
                "namespace": "team-a",
                "uid": f"uid-{name}",
                "resourceVersion": "10",
                "creationTimestamp": "2025-06-01T10:00:00Z",
            },
            "spec": spec,
        }
    )
    assert p is not None
    return p
