"""The join's record of a job's device sums (app/metrics/pod_join.py ``add_sums``, ``shared_sums``) and the
TrainJob handler that tells the join and the pod failures of each TrainJob (``PodJobHandler``)."""

from __future__ import annotations

import pytest

from app.metrics.pod_join import add_sums, shared_sums
from app.metrics.pods import PodJobHandler
from tests.support.pod_shapes import projected_trainjob

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"


def test_a_class_is_added_at_the_end_and_its_total_grows_in_place() -> None:
    sums = add_sums(add_sums((), GPU, 8), MIG, 2)
    assert sums == ((GPU, 8), (MIG, 2))
    assert add_sums(sums, GPU, 8) == ((GPU, 16), (MIG, 2))


def test_a_total_that_reaches_zero_goes_and_comes_back_last() -> None:
    sums = ((GPU, 8), (MIG, 2))
    assert add_sums(sums, GPU, -8) == ((MIG, 2),)
    assert add_sums(add_sums(sums, GPU, -8), GPU, 4) == ((MIG, 2), (GPU, 4))


def test_taking_away_from_a_class_not_held_changes_nothing() -> None:
    sums = ((GPU, 8),)
    assert add_sums(sums, MIG, -2) is sums
    assert add_sums((), GPU, 0) == ()


def test_equal_sums_are_one_object() -> None:
    first = shared_sums(((GPU, 8),))
    assert shared_sums(((GPU, 8),)) is first
    assert shared_sums(add_sums((), GPU, 8)) is first


class Listener:
    def __init__(self, fails: bool = False) -> None:
        self.told: list[str] = []
        self.fails = fails

    def job_added(self, job: object) -> None:
        self.told.append("added")
        if self.fails:
            raise RuntimeError("listener bug")

    def job_updated(self, old: object, new: object) -> None:
        self.told.append("updated")

    def job_deleted(self, last: object) -> None:
        self.told.append("deleted")


class Inner:
    def on_added(self, obj: object, initial: bool) -> None:
        raise ValueError("inner bug")

    def on_updated(self, old: object, new: object) -> None:
        pass

    def on_deleted(self, last: object) -> None:
        pass


def test_every_trainjob_listener_is_told_even_if_the_inner_handler_or_another_listener_fails() -> None:
    """The pod series' join and the pod failures waiting for their TrainJob both follow the TrainJob cache
    (app/metrics/pods.py PodJobHandler); the informer logs the first failure (app/kube/cache.py)."""
    first, second = Listener(fails=True), Listener()
    handler = PodJobHandler(Inner(), first, second)
    job = projected_trainjob()
    with pytest.raises(ValueError, match="inner bug"):
        handler.on_added(job, True)
    handler.on_updated(job, job)
    handler.on_deleted(job)
    assert first.told == second.told == ["added", "updated", "deleted"]
