"""The table of counted families (app/metrics/counted.py): complete, and the one source of what an event
counts, what a served render must show of it, and what the hand-over reads at the floor."""

from __future__ import annotations

from typing import get_args

import msgspec
import pytest

from app.metrics.counted import (
    AT_FLOOR_FAILED,
    AT_FLOOR_RESUMED,
    AT_FLOOR_RUNNING,
    AT_FLOOR_TERMINAL,
    EDGES,
    FAMILIES,
    CountedFamily,
    check_table,
    edge_of,
    series_of,
)
from app.metrics.family_kinds import CounterFamily, HistogramFamily
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import CountableEvent, JobAdmitted, JobCreated, JobFinished, JobStarted, PodFailed

from .helpers import admitted, created, finished, pod_failed, started

HOLD = 10.0

# One event of every countable type, each moving every family of its row.
SAMPLES: dict[type, CountableEvent] = {
    JobCreated: created(1, nodes=2, accel_class="nvidia.com/gpu", accel=8),
    JobFinished: finished(2, lifetime=90.0),
    JobStarted: started(3),
    JobAdmitted: admitted(4),
    PodFailed: pod_failed(5),
}


def test_every_countable_event_type_has_one_row() -> None:
    assert {edge.event for edge in EDGES} == set(get_args(CountableEvent))
    assert set(SAMPLES) == set(get_args(CountableEvent)), "add a sample event of the new type above"


@pytest.mark.parametrize("dropped", range(len(EDGES)))
def test_an_event_type_without_a_row_is_refused_at_import(dropped: int) -> None:
    """``check_table`` runs when app/metrics/counted.py is imported: a new event type in
    ``CountableEvent`` without a row stops the import, never falls into another type's branch."""
    edges = EDGES[:dropped] + EDGES[dropped + 1 :]
    families = tuple(f for edge in edges for f in edge.families)
    with pytest.raises(TypeError, match=EDGES[dropped].event.__name__):
        check_table(edges, families, get_args(CountableEvent))


def test_a_family_in_no_row_or_in_two_is_refused() -> None:
    stray = CountedFamily("kubeflow_trainer_stray", "Not counted by any edge.", ("runtime_ref",), "counter")
    with pytest.raises(TypeError, match="exactly one row"):
        check_table(EDGES, (*FAMILIES, stray), get_args(CountableEvent))
    with pytest.raises(TypeError, match="two rows"):
        check_table((*EDGES, EDGES[0]), FAMILIES, get_args(CountableEvent))


@pytest.mark.parametrize("event", SAMPLES.values(), ids=lambda e: type(e).__name__)
def test_an_event_increments_exactly_the_families_of_its_row(event: CountableEvent) -> None:
    edge = edge_of(event)
    assert edge.event is type(event)
    assert {increment.family for increment in series_of(event)} == set(edge.families)
    for family, labels, _ in series_of(event):
        assert len(labels) == len(family.labels), family.name


def test_every_family_is_born_at_zero_carries_exemplars_and_starts_each_term_from_zero() -> None:
    """Born-at-zero completeness for every family of the table, and no counter or histogram outside it."""
    state = TrainerMetricState(zero_hold=HOLD, exemplars=True, clock=lambda: 0.0)
    counting = [f for f in state.families if isinstance(f, CounterFamily | HistogramFamily)]
    assert [f.name for f in counting] == [
        spec.name + "_total" if spec.kind == "counter" else spec.name for spec in FAMILIES
    ]
    for event in SAMPLES.values():
        state.on_countable(event)
    for spec in FAMILIES:
        family = state.counter(spec) if spec.kind == "counter" else state.histogram(spec)
        assert family._holds and family._exemplars_on, spec.name
        assert len(family) == 1, spec.name  # the samples moved every family
    state.render_text()
    assert state.held_series == len(FAMILIES)
    state.reset_counts()
    assert all(len(family) == 0 for family in counting)


@pytest.mark.parametrize("event", SAMPLES.values(), ids=lambda e: type(e).__name__)
def test_held_series_of_waits_for_every_series_the_event_moved(event: CountableEvent) -> None:
    clock = [0.0]
    state = TrainerMetricState(zero_hold=HOLD, clock=lambda: clock[0])
    state.on_countable(event)
    state.render_text()
    increments = series_of(event)
    for family, labels, _ in increments:
        name = family.name + "_total" if family.kind == "counter" else family.name
        assert state.held_series_of(event) == (name, labels)
        # As if released one at a time: the event waits for the next of its series still held.
        (state.counter(family) if family.kind == "counter" else state.histogram(family))._held.discard(labels)
    assert state.held_series_of(event) is None


@pytest.mark.parametrize(
    ("event", "bits", "counted"),
    [
        (created(1, uid="u"), 0, True),  # it existed at the floor
        (finished(1, uid="u"), AT_FLOOR_TERMINAL, True),
        (finished(1, uid="u"), AT_FLOOR_RUNNING, False),
        (started(1, uid="u"), AT_FLOOR_RUNNING | AT_FLOOR_RESUMED, True),
        (admitted(1, uid="u"), AT_FLOOR_RUNNING, False),
        (pod_failed(1, uid="u"), AT_FLOOR_FAILED, True),  # the pod was Failed at the floor
        (pod_failed(1, uid="u"), 0, False),  # it existed, not failed yet
    ],
)
def test_a_row_says_what_the_job_was_at_the_floor_if_the_edge_was_counted(
    event: CountableEvent, bits: int, counted: bool
) -> None:
    assert edge_of(event).counted_before(bits) is counted
    assert edge_of(event).counted_before(None) is False  # the job did not exist at the floor


def test_a_duration_that_is_not_finite_increments_nothing() -> None:
    for event in (started(1, seconds=float("nan")), admitted(2, seconds=float("inf"))):
        assert series_of(event) == []
    unbelievable = msgspec.structs.replace(
        SAMPLES[JobCreated], nodes_observed=False, accelerators_observed=False
    )
    assert [i.family.name for i in series_of(unbelievable)] == ["kubeflow_trainer_trainjob_created"]


def test_a_pod_failure_is_settled_by_its_pod_and_shows_its_trainjob_as_exemplar() -> None:
    """The row of PodFailed reads the at-floor bits of the pod (its ``subject``), not of the TrainJob, and
    counts into (namespace, runtime_ref, reason) with the TrainJob's event as the exemplar."""
    event = pod_failed(7, uid="job-uid", pod_uid="pod-uid", reason="Evicted")
    edge = edge_of(event)
    assert edge.subject_uid(event) == "pod-uid"
    assert edge_of(SAMPLES[JobFinished]).subject_uid(SAMPLES[JobFinished]) == SAMPLES[JobFinished].uid
    [increment] = series_of(event)
    assert increment.family.name == "kubeflow_trainer_trainjob_pod_failures"
    assert increment.labels == ("default", event.runtime_ref, "Evicted")
    assert increment.value == 1.0
    state = TrainerMetricState(zero_hold=0.0, exemplars=True, clock=lambda: 0.0)
    state.on_countable(event)
    body = state.render_openmetrics()
    line = next(
        x for x in body.decode().splitlines() if x.startswith("kubeflow_trainer_trainjob_pod_failures_total")
    )
    assert 'uid="job-uid"' in line and 'name="job-7"' in line, line
