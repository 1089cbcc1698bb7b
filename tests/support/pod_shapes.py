"""Projected TrainJobs for the tests of the pods features: what the TrainJob informer would cache for a
minimal TrainJob (name, namespace, uid, creation, runtimeRef), the object the pod joins are keyed by."""

from __future__ import annotations

from app.trainer.informer_projectors import TrainJobProjector
from app.trainer.projection_types import TrainJobProjection

JOBS = TrainJobProjector()
JOB_CREATED = "2025-06-01T10:00:00Z"


def projected_trainjob(
    name: str = "llama",
    *,
    ns: str = "team-a",
    ref: str = "torch-distributed",
    uid: str = "",
    created: str = JOB_CREATED,
) -> TrainJobProjection:
    p = JOBS.from_json(
        {
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": uid or f"uid-{ns}-{name}",
                "resourceVersion": "1",
                "creationTimestamp": created,
            },
            "spec": {"runtimeRef": {"name": ref}},
        }
    )
    assert isinstance(p, TrainJobProjection)
    return p
