"""An update whose projection differs only in its resourceVersion reaches no rule: the informer's cache keeps
it, and the TrainerState is not called (``TrainJobProjector.unchanged``). Every other field is compared."""

from __future__ import annotations

from typing import Any

import msgspec

from app.kube.cache import ADDED, MODIFIED, Cache
from app.kube.informer_telemetry import InformerCounters
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR, TrainJobProjector
from app.trainer.projection_types import JobExtra, TrainJobProjection, same_but_version
from tests.trainer.test_state import job

# A value other than the base job's for every field (the base: tests/trainer/test_state.py's job()).
OTHER: dict[str, Any] = {
    "key": "team-a/other",
    "uid": "uid-other",
    "namespace": "team-b",
    "created": 1.0,
    "runtime_ref": "other-runtime",
    "num_nodes": 7,
    "resources": None,
    "result": "succeeded",
    "reason": "AllJobsCompleted",
    "terminal_time": 2.0,
    "flags": 255,
    "generation": 99,
    "extra": JobExtra(resumed_time=3.0),
}


def test_every_field_but_the_resource_version_is_compared() -> None:
    base = job(rv=10, gpus="2")
    fields = set(TrainJobProjection.__struct_fields__)
    assert fields == set(OTHER) | {"resource_version"}, "a new field must be compared (and named here)"
    for name, value in OTHER.items():
        changed = msgspec.structs.replace(base, **{name: value})
        assert not same_but_version(base, changed), name
        assert not TrainJobProjector.unchanged(base, msgspec.structs.replace(changed, resource_version="11"))
    assert same_but_version(base, msgspec.structs.replace(base, resource_version="11"))


class _Recorder:
    def __init__(self) -> None:
        self.updates: list[tuple[str, str]] = []

    def on_added(self, obj: TrainJobProjection, initial: bool) -> None:
        pass

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self.updates.append((old.resource_version, new.resource_version))

    def on_deleted(self, last: TrainJobProjection) -> None:
        pass


def _trainjob(rv: int, *, progress: int | None = None, complete: bool = False) -> TrainJobProjection:
    status: dict[str, Any] = {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}], "conditions": []}
    if complete:
        status["conditions"] = [
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "lastTransitionTime": "2025-06-01T10:30:00Z",
            }
        ]
    if progress is not None:
        status["trainerStatus"] = {"progressPercentage": progress}
    obj = {
        "metadata": {"name": "j1", "namespace": "team-a", "uid": "u1", "resourceVersion": str(rv)},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
        "status": status,
    }
    projected = TRAINJOB_PROJECTOR.from_json(obj)
    assert projected is not None
    return projected


def test_a_status_write_no_rule_reads_is_cached_but_reaches_no_handler() -> None:
    recorder = _Recorder()
    cache = Cache(
        recorder,
        InformerCounters(),
        name="trainjobs",
        same_uid=TrainJobProjector.same_uid,
        unchanged=TrainJobProjector.unchanged,
    )
    cache.apply(ADDED, _trainjob(10))
    # Trainer progress is not projected while the per-TrainJob series are off: the same state, a new version.
    progressed = _trainjob(11, progress=40)
    cache.apply(MODIFIED, progressed)
    assert recorder.updates == []
    assert cache.store["team-a/j1"] is progressed  # the cache holds the newest version all the same
    cache.apply(MODIFIED, _trainjob(12, progress=60, complete=True))
    assert recorder.updates == [("11", "12")]
