"""Born at zero: every Trainer counter and histogram series is first served with all its values 0, and shows
its real values only once that zero has been served for the hold time (app/metrics/series_cache.py).

PromQL never counts the first sample of a series; a series first scraped at 1 hides that increment from
``increase()`` and ``rate()``. The clock is injected, so every step here is exact."""

from __future__ import annotations

import pytest

from app.metrics.counted import FAMILIES
from app.metrics.family_kinds import CounterFamily, HistogramFamily
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import RuntimeInfo

from .helpers import REF, created, feed, finished, reference_text, samples, value

HOLD = 10.0
RUNTIME = RuntimeInfo(
    "", "torch-distributed", "trainer.kubeflow.org", "ClusterTrainingRuntime", "torch", "none", "torch"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def held_state(hold: float = HOLD) -> tuple[TrainerMetricState, Clock]:
    clock = Clock()
    state = TrainerMetricState(lambda: [RUNTIME], zero_hold=hold, clock=clock)
    state.on_runtimes_changed()
    return state, clock


def trainer_values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (name, labels): v
        for name, labels, v in samples(text)
        if name.startswith("kubeflow_trainer_trainjob_")
    }


def counting_values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The counter and histogram samples (the gauge kubeflow_trainer_trainjobs excluded)."""
    return {
        k: v for k, v in trainer_values(text).items() if not k[0].startswith("kubeflow_trainer_trainjobs")
    }


def test_a_new_series_is_served_as_zero_for_the_hold_then_with_its_values() -> None:
    state, clock = held_state()
    feed(state, [created(1, nodes=2, accel_class="nvidia.com/gpu", accel=8), finished(2, lifetime=90.0)])
    first = state.render_text()
    values = counting_values(first)
    # Every sample of every new counter and histogram series is there, at 0: buckets, _sum and _count.
    assert len(values) > 30 and set(values.values()) == {0.0}
    clock.now += HOLD - 0.001
    assert counting_values(state.render_text()) == values  # still within the hold
    clock.now += 0.001  # the first served render at t0 + hold shows the real values
    released = state.render_text()
    assert (
        value(released, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 1
    )
    assert value(released, "kubeflow_trainer_trainjob_requested_accelerators_sum",
                 accelerator_class="nvidia.com/gpu", runtime_ref=REF) == 8  # fmt: skip
    assert value(released, "kubeflow_trainer_trainjob_lifetime_seconds_count", result="succeeded",
                 runtime_ref=REF) == 1  # fmt: skip
    # Same samples, now with the real values: byte for byte what prometheus_client prints for the state.
    assert set(counting_values(released)) == set(values)
    assert released == reference_text(state)


def test_the_hold_starts_at_the_first_served_render_not_when_the_series_appears() -> None:
    state, clock = held_state()
    feed(state, [created(1)])
    clock.now += 5 * HOLD  # nobody scraped meanwhile: the zero has not been served yet
    text = state.render_text()
    assert value(text, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 0
    clock.now += HOLD
    text = state.render_text()
    assert value(text, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 1


def test_increments_during_the_hold_show_at_the_release_and_later_ones_at_once() -> None:
    state, clock = held_state()
    feed(state, [created(1)])
    state.render_text()
    feed(state, [created(2), created(3)])
    assert value(state.render_text(), "kubeflow_trainer_trainjob_created_total", namespace="team-a",
                 runtime_ref=REF) == 0  # fmt: skip
    clock.now += HOLD
    assert value(state.render_text(), "kubeflow_trainer_trainjob_created_total", namespace="team-a",
                 runtime_ref=REF) == 3  # fmt: skip
    feed(state, [created(4)])  # a series out of its hold: no delay
    assert value(state.render_text(), "kubeflow_trainer_trainjob_created_total", namespace="team-a",
                 runtime_ref=REF) == 4  # fmt: skip


def test_hold_zero_serves_the_zero_once() -> None:
    state, _clock = held_state(hold=0.0)
    feed(state, [finished(1)])
    name, labels = "kubeflow_trainer_trainjob_finished_total", {"result": "succeeded", "reason": "none"}
    assert value(state.render_text(), name, runtime_ref=REF, **labels) == 0
    assert value(state.render_text(), name, runtime_ref=REF, **labels) == 1  # same instant, next render


def test_openmetrics_renders_are_served_renders_too() -> None:
    state, clock = held_state()
    feed(state, [created(1)])
    assert b'kubeflow_trainer_trainjob_created_total{namespace="team-a"' in state.render_openmetrics()
    assert b"} 0.0\n" in state.render_openmetrics()
    clock.now += HOLD
    text = state.render_text()
    assert value(text, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 1


def test_gauges_are_never_held() -> None:
    state, _ = held_state()
    state.on_jobs_gauge(("team-a", REF, "running"), 3)
    text = state.render_text()
    assert (
        value(text, "kubeflow_trainer_trainjobs", namespace="team-a", runtime_ref=REF, state="running") == 3
    )
    assert value(text, "kubeflow_trainer_runtime_info", namespace="", name="torch-distributed",
                 api_group="trainer.kubeflow.org", kind="ClusterTrainingRuntime", ml_policy="torch",
                 pod_group_policy="none", framework="torch") == 1  # fmt: skip


def test_every_counter_and_histogram_family_is_born_at_zero() -> None:
    """Every family of the table (app/metrics/counted.py) is held; no counter or histogram is outside it."""
    state, _ = held_state()
    counting = [f for f in state.families if isinstance(f, CounterFamily | HistogramFamily)]
    assert len(counting) == len(FAMILIES)
    for family in counting:
        assert family._holds, family.name


def test_a_scrape_handles_only_the_series_whose_hold_starts_or_ends() -> None:
    """The hold bookkeeping of a scrape is O(held series): once 2,000 series are out of their hold, nothing
    about them is queued, and a new series is the only one a later scrape releases."""
    state, clock = held_state()
    feed(state, [created(i, ns=f"ns-{i}") for i in range(2000)])
    state.render_text()
    assert state.held_series == 2002  # 2,000 created_total series, plus nodes and accelerators
    clock.now += HOLD
    state.render_text()
    assert state.held_series == 0
    assert all(not f._releases and not f._unserved for f in state.families)
    feed(state, [created(5000, ns="fresh")])
    served: list[tuple[float, list[tuple[str, tuple[str, ...]]]]] = []
    state.add_served_listener(lambda now, released: served.append((now, released)))
    state.render_text()
    assert state.held_series == 1  # created_total{namespace="fresh"}: the histograms' series are old
    clock.now += HOLD
    state.render_text()
    assert served[-1] == (clock.now, [("kubeflow_trainer_trainjob_created_total", ("fresh", REF))])


def test_held_series_of_names_a_series_still_shown_as_zero() -> None:
    state, clock = held_state()
    old, new = created(1, ns="team-a"), created(2, ns="team-b")
    feed(state, [old])
    state.render_text()
    clock.now += HOLD
    state.render_text()
    assert state.held_series_of(old) is None
    feed(state, [new])
    assert state.held_series_of(new) == ("kubeflow_trainer_trainjob_created_total", ("team-b", REF))
    done = finished(3, lifetime=None)  # no lifetime observed: only finished_total matters
    feed(state, [done])
    assert state.held_series_of(done) == (
        "kubeflow_trainer_trainjob_finished_total",
        ("succeeded", "none", REF),
    )


def test_reset_counts_starts_a_term_from_zero_and_keeps_the_gauges() -> None:
    state, clock = held_state()
    feed(state, [created(1)])
    state.on_jobs_gauge(("team-a", REF, "running"), 1)
    state.render_text()
    clock.now += HOLD
    assert value(state.render_text(), "kubeflow_trainer_trainjob_created_total", namespace="team-a",
                 runtime_ref=REF) == 1  # fmt: skip
    state.reset_counts()
    text = state.render_text()
    assert counting_values(text) == {}
    assert (
        value(text, "kubeflow_trainer_trainjobs", namespace="team-a", runtime_ref=REF, state="running") == 1
    )
    feed(state, [created(2)])  # the new term's series is born at zero again
    assert value(state.render_text(), "kubeflow_trainer_trainjob_created_total", namespace="team-a",
                 runtime_ref=REF) == 0  # fmt: skip


def test_without_a_hold_every_render_shows_the_values() -> None:
    state = TrainerMetricState()
    feed(state, [created(1)])
    assert value(state.render_text(), "kubeflow_trainer_trainjob_created_total", namespace="team-a",
                 runtime_ref=REF) == 1  # fmt: skip


@pytest.mark.parametrize("hold", [-1.0, float("inf"), float("nan")])
def test_the_hold_must_be_finite_and_not_negative(hold: float) -> None:
    with pytest.raises(ValueError, match="zero_hold"):
        TrainerMetricState(zero_hold=hold)
