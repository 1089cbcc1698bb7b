"""The join's record of a job's device sums (app/metrics/pod_join.py ``add_sums``, ``shared_sums``)."""

from __future__ import annotations

from app.metrics.pod_join import add_sums, shared_sums

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
