"""Requested quantities have a documented ceiling (app/trainer/rules/): a TrainJob asking for more nodes
or accelerators than any real job is counted as created, counted as a limit hit (requested_quantity), and
left out of the requested-nodes / requested-accelerators histograms, so that one "1e300 GPUs on 1,000 nodes"
job does not add 9.2e21 to requested_accelerators_sum and every mean computed from it."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.metrics.telemetry import Limit, SelfTelemetry
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer import rules
from app.trainer.events import JobCreated
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.state import TrainerState
from tests.badinput import strategies as S

GPU = "nvidia.com/gpu"


def job(i: int, nodes: Any, gpus: Any) -> Any:
    return TRAINJOB_PROJECTOR.from_json(
        {
            "metadata": {
                "name": f"j{i}",
                "uid": f"u{i}",
                "namespace": "ns",
                "resourceVersion": str(i),
                "creationTimestamp": "2025-06-01T10:00:00Z",
            },
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {GPU: gpus}}},
            },
        }
    )


def created(jobs: list[Any]) -> tuple[list[JobCreated], SelfTelemetry]:
    telemetry = SelfTelemetry()
    sink = S.recording_sink()
    state = TrainerState(sink, runtime_wait_seconds=0, on_limit=telemetry.limit_hit)
    for j in jobs:
        state.job_handler.on_added(j, False)
    events = [e for e in sink.events if isinstance(e, JobCreated)]
    assert len(events) == len(jobs)  # every job counts as created, believable or not
    return events, telemetry


def limit_hits(telemetry: SelfTelemetry) -> float:
    value = telemetry.registry.get_sample_value(
        "trainer_metrics_limit_hits_total", {"limit": Limit.REQUESTED_QUANTITY}
    )
    return value or 0.0


def test_ceilings() -> None:
    ok = rules.requests_within_ceilings
    assert ok(((GPU, 8),), 1000) == (True, True)
    assert ok(((GPU, rules.MAX_ACCELERATORS_PER_NODE),), 1024) == (True, True)  # 2^20 per job: the ceiling
    assert ok(((GPU, rules.MAX_ACCELERATORS_PER_NODE + 1),), 1) == (True, False)  # per node
    assert ok(((GPU, 16),), rules.MAX_ACCELERATORS_PER_JOB // 16 + 1) == (True, False)  # per job
    assert ok((), rules.MAX_REQUESTED_NODES) == (True, True)
    assert ok((), rules.MAX_REQUESTED_NODES + 1) == (False, False)
    assert ok((("amd.com/gpu", 1), (GPU, 2**63 - 1)), 1) == (True, False)  # any class out of range


def test_huge_gpu_request_is_counted_but_left_out_of_the_histograms() -> None:
    events, telemetry = created([job(1, 4, "8"), job(2, 1000, "1e300"), job(3, 2, 1)])
    sane, huge, small = events
    assert (sane.nodes_observed, sane.accelerators_observed, sane.requested_accelerators) == (True, True, 32)
    assert (huge.nodes_observed, huge.accelerators_observed) == (True, False)
    assert small.accelerators_observed
    assert limit_hits(telemetry) == 1

    metrics = TrainerMetricState()
    for event in events:
        metrics.on_countable(event)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render_text().decode())
        for s in family.samples
    }

    def total(name: str) -> float:
        return sum(v for (n, _), v in samples.items() if n == name)

    assert total("kubeflow_trainer_trainjob_created_total") == 3
    assert total("kubeflow_trainer_trainjob_requested_accelerators_sum") == 32 + 2  # not 9.2e21
    assert total("kubeflow_trainer_trainjob_requested_accelerators_count") == 2
    # Its nodes are believable, so they are observed.
    assert total("kubeflow_trainer_trainjob_requested_training_nodes_per_job_sum") == 4 + 1000 + 2


def test_absurd_node_count_is_left_out_of_both_histograms() -> None:
    events, telemetry = created([job(1, 2**31 - 1, 1), job(2, rules.MAX_REQUESTED_NODES, 0)])
    absurd, largest = events
    assert (absurd.nodes_observed, absurd.accelerators_observed) == (False, False)
    assert (largest.nodes_observed, largest.accelerators_observed) == (True, True)
    assert limit_hits(telemetry) == 1

    metrics = TrainerMetricState()
    for event in events:
        metrics.on_countable(event)
    text = metrics.render_text().decode()
    nodes_sum = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "kubeflow_trainer_trainjob_requested_training_nodes_per_job_sum"
    ]
    assert sum(nodes_sum) == rules.MAX_REQUESTED_NODES
