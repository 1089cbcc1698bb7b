"""Bytes per watched pod: projection + informer-cache entry + the pod series' join (app/metrics/pods.py), and
for a pod bound to a node its info series rendered as a scrape keeps it.

Run ``.venv/bin/python -m tests.trainer.test_pod_memory`` to print the figures. Measured on CPython 3.11
(20k pods of 2,500 TrainJobs): ~290 B for a finished pod, ~650 B for one bound to a node. The difference
is mostly its ``pod_info`` line in the joined text body a plain scrape keeps (~250 B; the family keeps it
once more, compressed, and nothing else per pod: app/metrics/record_family.py). The bench measures the same
in RSS at the big cluster (docs/benchmarks.md, P3 "per watched pod").
"""

from __future__ import annotations

import uuid

import msgspec

from app.metrics.pods import PodJobHandler, PodSeries, PodSeriesHandler
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.pod_wire import PodWire
from app.trainer.pods import PodProjection, PodProjector
from tests.support.pod_shapes import projected_trainjob
from tests.support.traced import traced_growth
from tests.support.trainjob_cache import NullHandler, TrainJobCache

N = 20_000
PODS_PER_JOB = 8
# Regression bounds, with room: inside the whole suite (a fresh-clone CI run) a finished pod once measured
# ~190 B more than in this module alone; what earlier tests leave in the process was not pinned down.
BOUND_FINISHED = 500
BOUND_BOUND = 900


def _raw(i: int, phase: str) -> bytes:
    job = f"train-{i // PODS_PER_JOB:06d}"
    return msgspec.json.encode(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job}-node-0-{i % PODS_PER_JOB}-{uuid.uuid4().hex[:5]}",
                "namespace": f"team-{(i // PODS_PER_JOB) % 20}",
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(4_000_000 + i),
                "creationTimestamp": "2025-06-01T10:00:05Z",
                "labels": {
                    "jobset.sigs.k8s.io/jobset-name": job,
                    "jobset.sigs.k8s.io/replicatedjob-name": "node",
                    "jobset.sigs.k8s.io/restart-attempt": "0",
                    "batch.kubernetes.io/job-name": f"{job}-node-0",
                },
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"x": "y" * 2000}}}],
            },
            "spec": {
                "nodeName": f"gpu-node-{i % 4096:04d}",
                "containers": [
                    {"name": "node", "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "16"}}}
                ],
            },
            "status": {"phase": phase},
        }
    )


def bytes_per_pod(phase: str, n: int = N) -> float:
    raws = [_raw(i, phase) for i in range(n)]
    jobs = TrainJobCache()
    for j in range(n // PODS_PER_JOB):
        jobs.on_added(projected_trainjob(f"train-{j:06d}", ns=f"team-{j % 20}"), True)
    decoder = msgspec.json.Decoder(PodWire)
    projector = PodProjector()
    series = PodSeries(jobs.get, on_change=lambda: None)
    jobs.handler = PodJobHandler(NullHandler(), series)
    handler = PodSeriesHandler(series)
    cache: dict[str, PodProjection] = {}  # stands for the pods informer's cache
    states: list[TrainerMetricState] = []

    def ingest_and_scrape() -> None:
        for raw in raws:
            p = projector.from_wire(decoder.decode(raw))
            cache[p.key] = p
            handler.on_added(p, True)
        state = TrainerMetricState(extra_families=series.families)
        state.render_text()  # what a scrape keeps: the rendered series, their blocks and the joined body
        states.append(state)

    grown = traced_growth(ingest_and_scrape)
    assert len(cache) == n and series.pods == n and states[0].series_count > 0
    assert series.pod_statuses()["exported" if phase == "Running" else "not_holding"] == n
    return grown / n


def test_bytes_per_pod() -> None:
    # 20k: fewer pods give the fixed costs (the TrainJobs' join state, dict growth steps) too large a share.
    finished, running = bytes_per_pod("Succeeded"), bytes_per_pod("Running")
    print(f"bytes per pod: finished {finished:.0f}, bound to a node {running:.0f}")
    assert finished < BOUND_FINISHED
    assert running < BOUND_BOUND


if __name__ == "__main__":
    print(f"finished pod:          {bytes_per_pod('Succeeded'):.0f} B")
    print(f"pod bound to a node:   {bytes_per_pod('Running'):.0f} B (its pod_info series included)")
