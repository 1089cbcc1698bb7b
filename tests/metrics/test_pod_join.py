"""The join's record of a job (app/metrics/pod_join.py): its device sums (``add_sums``, ``shared_sums``)
and how it keeps its pods (``JobPods``)."""

from __future__ import annotations

from app.metrics.pod_join import SMALL_JOB, JobPods, add_sums, shared_sums
from app.trainer.pods import PodProjection, PodProjector

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


def _pod(name: str, phase: str = "Running") -> PodProjection:
    p = PodProjector().from_json(
        {
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
            "status": {"phase": phase},
        }
    )
    assert p is not None
    return p


def test_a_jobs_pods_are_one_pod_then_a_tuple_then_a_dict_in_the_order_they_came() -> None:
    record = JobPods("team-a/llama")
    a, b = _pod("a"), _pod("b")
    assert record.put(a) is None and record.pods is a and list(record.all()) == [a] and len(record) == 1
    a2 = _pod("a", "Succeeded")
    assert record.put(a2) is a and record.pods is a2  # replaced in place
    assert record.put(b) is None and record.pods == (a2, b) and len(record) == 2
    assert record.pop("team-a/a") is a2 and record.pods is b  # one left: the pod itself again
    assert record.pop("team-a/zz") is None and record.pop("team-a/b") is b and len(record) == 0
    many = [_pod(f"p{i}") for i in range(SMALL_JOB + 1)]
    for p in many:
        record.put(p)
    assert isinstance(record.pods, dict) and list(record.all()) == many
    assert record.pop("team-a/p0") is many[0] and len(record) == SMALL_JOB
