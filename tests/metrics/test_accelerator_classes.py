"""A TrainJob requesting several accelerator classes is one observation per class (finding 2 of the
"Read TrainJobs as the Trainer controller does" issue), and each of those series is born at zero."""

from __future__ import annotations

from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import JobCreated

from .helpers import REF, value

NAME = "kubeflow_trainer_trainjob_requested_accelerators"


def _multi(rv: int) -> JobCreated:
    return JobCreated(
        rv,
        f"uid-{rv}",
        "team-a",
        REF,
        2,
        "nvidia.com/gpu",
        2,
        more_accelerators=(("nvidia.com/mig-1g.10gb", 4),),
    )


def test_every_class_of_a_job_is_observed() -> None:
    state = TrainerMetricState()
    event = _multi(1)
    assert event.accelerators == (("nvidia.com/gpu", 2), ("nvidia.com/mig-1g.10gb", 4))
    state.on_countable(event)
    text = state.render_text()
    for cls, count in event.accelerators:
        assert value(text, NAME + "_count", accelerator_class=cls, runtime_ref=REF) == 1.0
        assert value(text, NAME + "_sum", accelerator_class=cls, runtime_ref=REF) == float(count)
    # the job itself is counted once
    assert value(text, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 1.0
    assert (
        value(text, "kubeflow_trainer_trainjob_requested_training_nodes_per_job_count", runtime_ref=REF)
        == 1.0
    )


def test_a_new_class_series_holds_the_event_back() -> None:
    """The hand-over asks which series of an event are still shown as zeros: a second class counts."""
    clock = [0.0]
    state = TrainerMetricState(zero_hold=10.0, clock=lambda: clock[0])
    state.on_countable(JobCreated(1, "uid-1", "team-a", REF, 2, "nvidia.com/gpu", 2))
    state.render_text()  # starts the hold of the new series
    clock[0] = 11.0
    state.render_text()  # ends it
    event = _multi(2)  # created, nodes and nvidia.com/gpu series exist; the MIG series is new
    state.on_countable(event)
    state.render_text()
    assert state.held_series_of(event) == (NAME, ("nvidia.com/mig-1g.10gb", REF))
    clock[0] = 22.0
    state.render_text()
    assert state.held_series_of(event) is None
    text = state.render_text()
    assert value(text, NAME + "_count", accelerator_class="nvidia.com/mig-1g.10gb", runtime_ref=REF) == 1.0
