"""The TrainJob watch path decodes an update of a cached job without its spec, and the whole object only
when the spec may have changed (app/kube/ingest.py, TrainJobProjector.from_status_wire).

What it relies on: the API server bumps ``metadata.generation`` on every write that changes anything outside
metadata and, with the status subresource (which the TrainJob CRD enables), outside status
(k8s.io/apiextensions-apiserver ``pkg/registry/customresource/strategy.go`` PrepareForUpdate, which also puts
the old status back on a main-resource update; docs/design/k8s-protocol.md on ``generation``). An update with
the cached generation therefore has the cached spec: the tests below show that the informer does not read
it then, and that it reads it whenever the generation moves or the object is new.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from app.kube.cache import Cache
from app.kube.informer import cache_and_ingest
from app.kube.informer_telemetry import InformerCounters
from app.kube.ingest import Ingest
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR, TrainJobProjector
from app.trainer.projection_types import TrainJobProjection

UID = "6f1c2a7e-8d4b-4c1a-9e2f-0123456789ab"
COMPLETE = {
    "type": "Complete",
    "status": "True",
    "reason": "AllJobsCompleted",
    "message": "m",
    "lastTransitionTime": "2025-06-01T10:10:00Z",
}


def _job(rv: int, *, generation: int = 1, num_nodes: Any = 2, status: Any = None) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "j",
            "namespace": "team-a",
            "uid": UID,
            "resourceVersion": str(rv),
            "generation": generation,
            "creationTimestamp": "2025-06-01T10:00:00Z",
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": num_nodes}},
        "status": status or {},
    }


class _Handler:
    def __init__(self) -> None:
        self.updates: list[TrainJobProjection] = []

    def on_added(self, obj: TrainJobProjection, initial: bool) -> None:
        pass

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self.updates.append(new)

    def on_deleted(self, last: TrainJobProjection) -> None:
        pass


def _listed(projector: TrainJobProjector = TRAINJOB_PROJECTOR) -> tuple[Cache[Any], Ingest[Any], _Handler]:
    """The informer's cache and ingest after a LIST of one job, ``_job(100)``."""
    handler = _Handler()
    cache, ingest = cache_and_ingest(projector, handler, InformerCounters(), name="t", clock=time.monotonic)
    body = orjson.dumps({"metadata": {"resourceVersion": "100"}, "items": [_job(100)]})
    items: dict[str, Any] = {}
    unusable: set[str] = set()
    rv, _ = ingest.list_page(body, items, unusable)
    ingest.replace(items, rv, unusable)
    return cache, ingest, handler


def _line(etype: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": etype, "object": obj})


def test_a_status_write_is_read_without_the_spec() -> None:
    cache, ingest, handler = _listed()
    # The same generation with a spec the typed decode would reject: it is not even decoded.
    ingest.process_line(_line("MODIFIED", _job(101, num_nodes="two", status={"conditions": [COMPLETE]})))
    job = cache.store["team-a/j"]
    assert (job.result, job.num_nodes, job.malformed) == ("succeeded", 2, False)
    assert ingest.resource_version == "101"
    assert handler.updates == [job]


def test_a_spec_write_is_read_whole() -> None:
    cache, ingest, _ = _listed()
    ingest.process_line(_line("MODIFIED", _job(101, generation=2, num_nodes=4)))
    assert cache.store["team-a/j"].num_nodes == 4
    # and a bad one takes the tolerant path, as before: counted as best it can be, flagged malformed
    ingest.process_line(_line("MODIFIED", _job(102, generation=3, num_nodes="two")))
    job = cache.store["team-a/j"]
    assert job.malformed and job.resource_version == "102"


def test_a_new_job_and_a_recreated_one_are_read_whole() -> None:
    cache, ingest, _ = _listed()
    other = _job(101, num_nodes=3)
    other["metadata"] |= {"name": "k"}
    ingest.process_line(_line("ADDED", other))
    assert cache.store["team-a/k"].num_nodes == 3
    # deleted and created again under the same name between two events we saw: another uid, generation 1
    again = _job(102, num_nodes=5)
    again["metadata"] |= {"uid": "0f1c2a7e-8d4b-4c1a-9e2f-0123456789ab"}
    ingest.process_line(_line("MODIFIED", again))
    job = cache.store["team-a/j"]
    assert (job.num_nodes, job.uid) == (5, "0f1c2a7e-8d4b-4c1a-9e2f-0123456789ab")


def test_a_status_of_the_wrong_shape_still_takes_the_tolerant_path() -> None:
    cache, ingest, _ = _listed()
    ingest.process_line(_line("MODIFIED", _job(101, status={"conditions": {"type": "Complete"}})))
    job = cache.store["team-a/j"]
    assert job.malformed and job.resource_version == "101"


def test_trainer_progress_is_read_from_the_status_wire() -> None:
    projector = TrainJobProjector(trainer_status=True)
    cache, ingest, _ = _listed(projector)
    progress = {"progressPercentage": 40, "lastUpdatedTime": "2025-06-01T11:00:00Z"}
    update = _job(101, status={"trainerStatus": progress})
    ingest.process_line(_line("MODIFIED", update))
    job = cache.store["team-a/j"]
    assert job.progress is not None and job.progress.percent == 40
    assert job == projector.from_json(update)
