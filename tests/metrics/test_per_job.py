"""The opt-in per-TrainJob series (app/metrics/per_job.py): families, escaping, caps and their telemetry,
leader-only export; and the new histograms through the hand-over journal."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.handover.journal import CountJournal
from app.metrics.counted import ADMISSION_WAIT, STARTUP
from app.metrics.exposition import MetricsExposition
from app.metrics.per_job import PerJobHandler, PerJobSeries, PerJobTelemetry
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import JobAdmitted, JobStarted
from app.trainer.informer_projectors import TrainJobProjector
from app.trainer.projection_types import TrainJobProjection

from .helpers import REF, reference_openmetrics, reference_text, samples, started

PROJECTOR = TrainJobProjector(trainer_status=True, max_trainer_metrics=3)
CREATED = "2025-06-01T10:00:00Z"
CREATED_EPOCH = 1748772000.0
UPDATED = "2025-06-01T10:20:00Z"


def job(
    name: str = "llama-ft",
    *,
    ns: str = "team-a",
    rv: int = 1,
    ready: bool = False,
    complete: bool = False,
    trainer: dict[str, Any] | None = None,
) -> TrainJobProjection:
    status: dict[str, Any] = {"jobsStatus": [{"name": "node", "active": 1, "ready": int(ready)}]}
    if complete:
        status["conditions"] = [
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "lastTransitionTime": UPDATED,
            }
        ]
    if trainer is not None:
        status["trainerStatus"] = {"lastUpdatedTime": UPDATED, **trainer}
    obj = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{ns}-{name}",
            "resourceVersion": str(rv),
            "creationTimestamp": CREATED,
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
        "status": status,
    }
    p = PROJECTOR.from_json(obj)
    assert p is not None
    return p


class _Null:
    def on_added(self, obj: Any, initial: bool) -> None: ...
    def on_updated(self, old: Any, new: Any) -> None: ...
    def on_deleted(self, last: Any) -> None: ...


def setup(**kw: Any) -> tuple[TrainerMetricState, PerJobSeries, PerJobHandler]:
    series = PerJobSeries(**kw)
    state = TrainerMetricState(extra_families=series.families)
    series._on_change = state.extra_changed
    return state, series, PerJobHandler(_Null(), series)


def per_job(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (name, labels): v
        for name, labels, v in samples(text)
        if name.startswith("kubeflow_trainer_trainjob_")
        and not name.startswith(("kubeflow_trainer_trainjob_startup", "kubeflow_trainer_trainjob_admission"))
    }


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def test_families_of_a_job_follow_its_state_and_trainer_status() -> None:
    state, series, handler = setup()
    a0 = job(rv=1)
    handler.on_added(a0, False)
    j = {"namespace": "team-a", "trainjob": "llama-ft"}
    assert per_job(state.render_text()) == {
        ("kubeflow_trainer_trainjob_info", labels(**j, runtime_ref=REF)): 1.0,
        ("kubeflow_trainer_trainjob_status_state", labels(**j, state="pending")): 1.0,
        ("kubeflow_trainer_trainjob_created_timestamp_seconds", labels(**j)): CREATED_EPOCH,
    }
    a1 = job(
        rv=2,
        ready=True,
        trainer={
            "progressPercentage": 35,
            "estimatedRemainingSeconds": 1800,
            "metrics": [
                {"name": "loss", "value": "0.4210"},
                {"name": "checkpoint", "value": "s3://ckpt/step-300"},  # text: skipped, counted
                {"name": "eval_accuracy", "value": "0.81"},
            ],
        },
    )
    handler.on_updated(a0, a1)
    got = per_job(state.render_text())
    assert got[("kubeflow_trainer_trainjob_status_state", labels(**j, state="running"))] == 1.0
    assert ("kubeflow_trainer_trainjob_status_state", labels(**j, state="pending")) not in got
    assert got[("kubeflow_trainer_trainjob_status_progress_percent", labels(**j))] == 35.0
    assert got[("kubeflow_trainer_trainjob_status_estimated_remaining_seconds", labels(**j))] == 1800.0
    assert got[("kubeflow_trainer_trainjob_status_trainer_metric", labels(**j, metric="loss"))] == 0.421
    assert (
        got[("kubeflow_trainer_trainjob_status_trainer_metric", labels(**j, metric="eval_accuracy"))] == 0.81
    )
    assert got[("kubeflow_trainer_trainjob_status_trainer_updated_timestamp_seconds", labels(**j))] == (
        CREATED_EPOCH + 1200
    )
    assert series.skipped == {"unparsable": 1, "invalid_name": 0, "over_cap": 0}
    # A metric that disappears from trainerStatus loses its series; the skip count follows the job.
    a2 = job(
        rv=3, ready=True, trainer={"progressPercentage": 60, "metrics": [{"name": "loss", "value": "0.3"}]}
    )
    handler.on_updated(a1, a2)
    got = per_job(state.render_text())
    assert ("kubeflow_trainer_trainjob_status_trainer_metric", labels(**j, metric="eval_accuracy")) not in got
    assert ("kubeflow_trainer_trainjob_status_estimated_remaining_seconds", labels(**j)) not in got
    assert series.skipped["unparsable"] == 0
    # Byte for byte what prometheus_client prints for the same state (text and OpenMetrics).
    assert state.render_text() == reference_text(state)
    assert state.render_openmetrics() == reference_openmetrics(state)
    # Deleted: every series of the job goes.
    handler.on_deleted(a2)
    assert per_job(state.render_text()) == {}
    assert series.series_count == 0


def test_label_values_are_validated_and_escaped() -> None:
    state, series, handler = setup()
    odd = 'eval "top-1" acc\\val'
    handler.on_added(
        job(
            trainer={
                "metrics": [
                    {"name": odd, "value": "0.5"},
                    {"name": "line\nbreak", "value": "1"},  # not a label value: skipped
                    {"name": "x" * 65, "value": "1"},  # longer than the CRD allows
                ]
            }
        ),
        False,
    )
    text = state.render_text()
    assert b'metric="eval \\"top-1\\" acc\\\\val"' in text
    assert text == reference_text(state)
    assert series.skipped["invalid_name"] == 2
    # A job whose name or namespace is not a Kubernetes name is not exported at all.
    handler.on_added(job("Not_A_Name"), False)
    handler.on_added(job("ok", ns="Bad_Namespace"), False)
    assert series.invalid == 2 and series.exported == 1


def test_the_cap_on_jobs_its_telemetry_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    state, series, handler = setup(max_jobs=2)
    jobs = [job(f"j{i}", rv=i) for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="app.metrics.per_job"):
        for j in jobs:
            handler.on_added(j, False)
    assert [r.getMessage() for r in caplog.records if "cap" in r.getMessage()] == [
        caplog.records[0].getMessage()
    ]
    assert len(caplog.records) == 1
    assert (series.exported, series.over_cap) == (2, 3)
    exported = {dict(lab)["trainjob"] for name, lab in per_job(state.render_text()) if name.endswith("_info")}
    assert exported == {"j0", "j1"}
    # A waiting job's latest state is what it is exported with, once a slot frees.
    j2_running = job("j2", rv=20, ready=True)
    handler.on_updated(jobs[2], j2_running)
    handler.on_deleted(jobs[0])
    got = per_job(state.render_text())
    assert {dict(lab)["trainjob"] for name, lab in got if name.endswith("_info")} == {"j1", "j2"}
    assert got[
        ("kubeflow_trainer_trainjob_status_state", labels(namespace="team-a", trainjob="j2", state="running"))
    ]
    registry = CollectorRegistry()
    registry.register(PerJobTelemetry(series))
    body = generate_latest(registry).decode()
    assert 'trainer_metrics_per_trainjob_jobs{status="exported"} 2.0' in body
    assert 'trainer_metrics_per_trainjob_jobs{status="over_cap"} 2.0' in body
    assert "trainer_metrics_per_trainjob_max_jobs 2.0" in body


def test_namespace_allow_list() -> None:
    state, series, handler = setup(namespaces=["team-b"])
    handler.on_added(job("a", ns="team-a"), False)
    handler.on_added(job("b", ns="team-b"), False)
    assert {dict(lab)["namespace"] for _, lab in per_job(state.render_text())} == {"team-b"}
    assert (series.exported, series.over_cap, series.invalid) == (1, 0, 0)


def test_per_job_series_are_exported_by_the_leader_only() -> None:
    """Followers keep them warm (as the trainjobs gauge); only a leading replica serves them."""
    state, _, handler = setup()
    handler.on_added(job(), False)
    exposition = MetricsExposition(CollectorRegistry())
    assert b"kubeflow_trainer_trainjob_info" not in exposition.build_metrics_response(None, None).body
    exposition.set_trainer_source(state)
    assert b"kubeflow_trainer_trainjob_info{" in exposition.build_metrics_response(None, None).body


def test_gauges_are_not_born_at_zero_but_the_new_histograms_are() -> None:
    now = [100.0]
    series = PerJobSeries()
    state = TrainerMetricState(extra_families=series.families, zero_hold=10.0, clock=lambda: now[0])
    series._on_change = state.extra_changed
    PerJobHandler(_Null(), series).on_added(job(trainer={"progressPercentage": 5}), False)
    state.on_countable(started(7, seconds=12.0))
    state.on_countable(JobAdmitted(8, "uid-8", REF, 30.0))
    first = {(n, lab): v for n, lab, v in samples(state.render_text())}
    assert (
        first[
            (
                "kubeflow_trainer_trainjob_status_progress_percent",
                labels(namespace="team-a", trainjob="llama-ft"),
            )
        ]
        == 5
    )
    assert first[("kubeflow_trainer_trainjob_startup_seconds_count", labels(runtime_ref=REF))] == 0.0
    assert first[("kubeflow_trainer_trainjob_admission_wait_seconds_sum", labels(runtime_ref=REF))] == 0.0
    now[0] += 10.0
    state.render_text()
    later = {(n, lab): v for n, lab, v in samples(state.render_text())}
    assert later[("kubeflow_trainer_trainjob_startup_seconds_count", labels(runtime_ref=REF))] == 1.0
    assert (
        later[("kubeflow_trainer_trainjob_startup_seconds_bucket", labels(runtime_ref=REF, le="15.0"))] == 1.0
    )
    assert later[("kubeflow_trainer_trainjob_admission_wait_seconds_sum", labels(runtime_ref=REF))] == 30.0


def test_a_new_leader_replays_time_to_running_above_the_watermark_and_skips_the_rest() -> None:
    """JobStarted and JobAdmitted go through the journal as the counters' events do (watermark by rv)."""
    state = TrainerMetricState()
    journal = CountJournal(state, journal_size=100)
    for event in (
        JobStarted(10, "a", REF, 3.0),
        JobAdmitted(11, "b", REF, 60.0),
        JobStarted(12, "b", REF, 90.0),
        JobStarted(13, "c", REF, 4.0),
    ):
        journal.on_countable(event)  # a follower: remembered, not counted
    assert state.histogram(STARTUP).counts == {}
    assert journal.start_leading(11) == 2  # the previous leader counted up to rv 11
    assert sum(state.histogram(STARTUP).counts[(REF,)]) == 2 and state.histogram(ADMISSION_WAIT).counts == {}
    assert state.histogram(STARTUP).sums[(REF,)] == 94.0
    journal.on_countable(JobStarted(9, "late", REF, 1.0))  # at or below the floor: the old leader's
    assert sum(state.histogram(STARTUP).counts[(REF,)]) == 2
    assert journal.watermark == 13
