"""Bytes per TrainJob: projection + informer-cache entry + state (dedup entry when terminal).

Run ``.venv/bin/python -m tests.trainer.test_memory`` to print the figures. Measured on CPython 3.11
(20k jobs): ~295 B for an active job, ~412 B for a terminal one (its dedup entry included).
"""

from __future__ import annotations

import uuid

import msgspec

from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from app.trainer.wire import TrainJobWire
from tests.support.traced import traced_growth

N = 20_000
BOUND = 640  # generous: the target is 512 B; this catches a regression, not allocator noise


class _NullSink:
    def on_countable(self, event: object) -> None: ...
    def on_jobs_gauge(self, key: object, value: int) -> None: ...
    def on_runtimes_changed(self) -> None: ...


def _raw(i: int, terminal: bool) -> bytes:
    conditions = (
        [
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed",
                "lastTransitionTime": "2025-06-01T11:00:00Z",
            }
        ]
        if terminal
        else []
    )
    return msgspec.json.encode(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {
                "name": f"train-{i:06d}",
                "namespace": f"team-{i % 20}",
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(4_000_000 + i),
                "creationTimestamp": "2025-06-01T10:00:00Z",
                "labels": {"kueue.x-k8s.io/queue-name": "q"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"x": "y" * 2000}}}],
            },
            "spec": {
                "runtimeRef": {
                    "apiGroup": "trainer.kubeflow.org",
                    "kind": "ClusterTrainingRuntime",
                    "name": "torch-distributed",
                },
                "trainer": {
                    "numNodes": 4,
                    "resourcesPerNode": {"requests": {"nvidia.com/gpu": "8", "cpu": "16"}},
                },
            },
            "status": {
                "conditions": conditions,
                "jobsStatus": [{"name": "node", "active": 0 if terminal else 4}],
            },
        }
    )


def bytes_per_job(terminal: bool, n: int = N) -> float:
    raws = [_raw(i, terminal) for i in range(n)]
    decoder = msgspec.json.Decoder(TrainJobWire)
    state = TrainerState(_NullSink())
    cache: dict[str, TrainJobProjection] = {}  # stands for the informer's cache

    def ingest() -> None:
        for raw in raws:
            p = TRAINJOB_PROJECTOR.from_wire(decoder.decode(raw))
            cache[p.key] = p
            state.job_handler.on_added(p, True)

    grown = traced_growth(ingest)
    assert len(cache) == n and state.terminal_count == (n if terminal else 0)
    return grown / n


def test_bytes_per_trainjob() -> None:
    active, terminal = bytes_per_job(False, 5000), bytes_per_job(True, 5000)
    print(f"bytes per TrainJob: active {active:.0f}, terminal {terminal:.0f}")
    assert active < BOUND
    assert terminal < BOUND


if __name__ == "__main__":
    print(f"active TrainJob:   {bytes_per_job(False):.0f} B")
    print(f"terminal TrainJob: {bytes_per_job(True):.0f} B (dedup entry included)")
