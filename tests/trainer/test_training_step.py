"""Issue 22, finding 1: a TrainJob runs when a child Job of its *training step* is ready, not any child Job.

The controller copies the JobSet's ``replicatedJobsStatus`` into ``status.jobsStatus`` (kubeflow/trainer
v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go Status), one entry per replicated job name; JobSet
counts a child Job ``ready`` while it is active with all its pods ready (kubernetes-sigs/jobset v0.12.0
pkg/controllers/jobset_controller.go calculateReplicatedJobStatuses: only ``jobs.active`` are counted), so
an initializer is ready while it downloads and drops to 0 when it finishes. The training step is the
replicated jobs labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` (pkg/constants
LabelTrainJobAncestor, AncestorTrainer), under MPI the ``launcher`` alone (plugins/mpi/mpi.go), found
through the referenced runtime; a runtime not known reads by the controller's naming (``node``,
``launcher``).
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from app.trainer import rules
from app.trainer.events import JobStarted
from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
    TrainJobProjector,
)
from app.trainer.projection_types import RuntimeProjection, TrainJobProjection
from app.trainer.state import TrainerState
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import Clock, G, runtime, runtime_doc

CREATED = "2025-06-01T10:00:00Z"
CREATED_EPOCH = 1748772000.0
TUNE = f"{G}/ClusterTrainingRuntime//torchtune-llama3.2-1b"
CUSTOM = f"{G}/ClusterTrainingRuntime//custom-steps"


class Wall:
    def __init__(self) -> None:
        self.now = CREATED_EPOCH + 60.0

    def __call__(self) -> float:
        return self.now


def job_obj(runtime_name: str, jobs: list[dict[str, Any]], *, rv: int = 10) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "tune",
            "namespace": "team-a",
            "uid": "uid-tune",
            "resourceVersion": str(rv),
            "generation": 1,
            "creationTimestamp": CREATED,
        },
        "spec": {"runtimeRef": {"name": runtime_name}, "trainer": {"numNodes": 1}},
        "status": {"jobsStatus": jobs},
    }


def project(obj: dict[str, Any], projector: TrainJobProjector = TRAINJOB_PROJECTOR) -> TrainJobProjection:
    """Both decoding paths, which must agree (the typed one is the informer's fast path)."""
    p = projector.from_json(obj)
    assert p is not None
    typed = projector.from_wire(msgspec.json.decode(msgspec.json.encode(obj), type=projector.wire_type))
    assert typed == p
    return p


def rj(name: str, *, ready: int = 0, active: int = 0, succeeded: int = 0) -> dict[str, Any]:
    """One status.jobsStatus entry (counts of child Jobs, as the controller copies them from the JobSet)."""
    return {
        "name": name,
        "ready": ready,
        "active": active,
        "succeeded": succeeded,
        "failed": 0,
        "suspended": 0,
    }


# The lifecycle of a torchtune TrainJob (manifests/base/runtimes/torchtune/llama3_2/llama3_2_1B.yaml: the
# dataset and model initializers run first, `node` dependsOn both Complete).
TORCHTUNE_LIFECYCLE: list[tuple[str, list[dict[str, Any]], str]] = [
    ("no JobSet yet", [], "pending"),
    (
        "initializers downloading",
        [
            rj("dataset-initializer", ready=1, active=1),
            rj("model-initializer", ready=1, active=1),
            rj("node"),
        ],
        "pending",
    ),
    (
        "dataset done, model still downloading",
        [rj("dataset-initializer", succeeded=1), rj("model-initializer", ready=1, active=1), rj("node")],
        "pending",
    ),
    (
        "initializers done, trainer pods wait for GPUs",
        [rj("dataset-initializer", succeeded=1), rj("model-initializer", succeeded=1), rj("node", active=1)],
        "pending",
    ),
    (
        "trainer pods ready",
        [
            rj("dataset-initializer", succeeded=1),
            rj("model-initializer", succeeded=1),
            rj("node", ready=1, active=1),
        ],
        "running",
    ),
]


@pytest.mark.parametrize(
    ("what", "jobs", "state"), TORCHTUNE_LIFECYCLE, ids=[w for w, _, _ in TORCHTUNE_LIFECYCLE]
)
def test_initializers_never_make_a_job_running(what: str, jobs: list[dict[str, Any]], state: str) -> None:
    """Before: any ``jobsStatus[].ready > 0`` was running, so a torchtune job ran while its model downloaded
    and fell back to pending when the download finished."""
    assert project(job_obj("torchtune-llama3.2-1b", jobs)).state == state


def test_time_to_running_is_observed_when_the_trainer_is_ready() -> None:
    """The started edge (``trainjob_startup_seconds``) is taken when the trainer's pods are ready, not when
    the first initializer is: 1500 s here (before the fix: 420 s, when the initializers started
    downloading, and never again)."""
    sink, wall = RecordingSink(), Wall()
    state = TrainerState(sink, clock=Clock(), wall_clock=wall)
    state.runtime_handler.on_added(runtime("torchtune-llama3.2-1b"), True)
    old: TrainJobProjection | None = None
    for rv, (_, jobs, _) in enumerate(TORCHTUNE_LIFECYCLE, start=10):
        new = project(job_obj("torchtune-llama3.2-1b", jobs, rv=rv))
        if old is None:
            state.job_handler.on_added(new, False)
        else:
            state.job_handler.on_updated(old, new)
        old = new
        wall.now += 360.0
    started = [e for e in sink.events if isinstance(e, JobStarted)]
    assert [e.startup_seconds for e in started] == [60.0 + 4 * 360.0]
    assert state.jobs_gauge() == {("team-a", TUNE, "running"): 1}


def test_torch_with_cache_dataset_initializer_is_pending() -> None:
    """manifests/base/runtimes/data-cache/torch_distributed_with_cache.yaml: the cache initializer is labelled
    ancestor ``dataset-initializer``, the trainer ``node`` (dependsOn it) ancestor ``trainer``."""
    cache = "torch-distributed-with-cache"
    assert (
        project(job_obj(cache, [rj("dataset-initializer", ready=1, active=1), rj("node")])).state == "pending"
    )
    assert (
        project(job_obj(cache, [rj("dataset-initializer", succeeded=1), rj("node", ready=1)])).state
        == "running"
    )


@pytest.mark.parametrize(
    ("jobs", "state"),
    [
        # sshd workers up, launcher not created yet (JobSet dependsOn): nothing trains
        ([rj("node", ready=1, active=1), rj("launcher")], "pending"),
        ([rj("node", ready=1, active=1), rj("launcher", active=1)], "pending"),  # launcher's pod starting
        ([rj("node", ready=1, active=1), rj("launcher", ready=1, active=1)], "running"),
        ([rj("node", active=1), rj("launcher")], "pending"),  # workers wait for capacity
        ([rj("node", ready=1), rj("launcher", ready=1)], "running"),
    ],
)
def test_mpi_runs_when_the_launcher_is_ready(jobs: list[dict[str, Any]], state: str) -> None:
    """MPI's training process is the launcher's ``mpirun``: deepspeed-distributed labels only ``launcher``
    ancestor ``trainer``, so the job's command goes to it alone (kubeflow/trainer v2.3.0
    pkg/runtime/framework/plugins/jobset/builder.go Trainer); it ``dependsOn`` ``node`` Ready
    (manifests/base/runtimes/deepspeed_distributed.yaml), which JobSet enforces by creating it only once
    every ``node`` Job is ready (kubernetes-sigs/jobset v0.12.0 pkg/controllers/depends_on.go
    dependencyReachedStatus); a ready ``node`` runs sshd (its readinessProbe is a TCP check of port 2222).
    Running is the launcher ready, whatever the workers are."""
    sink = RecordingSink()
    state_ = TrainerState(sink, clock=Clock())
    state_.runtime_handler.on_added(runtime("deepspeed-distributed"), True)
    projector = TrainJobProjector(runtimes=state_.runtimes_by_ref)
    assert project(job_obj("deepspeed-distributed", jobs), projector).state == state


def test_mpi_nodes_unchanged_by_the_launcher_rule() -> None:
    """Nodes and accelerators are not the training step's: runLauncherAsNode still counts the launcher
    as a node beside the workers (plugins/mpi/mpi.go isNode), 2 for numNodes 1."""
    rt = runtime("deepspeed-distributed")
    assert rt.training_jobs == frozenset({"launcher"})
    assert rt.run_launcher_as_node and rules.requested_nodes(1, rt.nodes) == 2


# --- runtimes with their own names: found through the referenced runtime -------------------------------


def custom_runtime(*, labelled: bool = True) -> RuntimeProjection:
    """A runtime whose trainer is named ``trainer`` and whose initializer ``prep``: only the labels say which
    is which (the webhook only requires a ``node`` container in the ancestor-trainer job)."""
    obj = copy.deepcopy(runtime_doc("torch-distributed-with-cache"))
    obj["metadata"]["name"] = "custom-steps"
    prep, trainer = obj["spec"]["template"]["spec"]["replicatedJobs"]
    prep["name"], trainer["name"] = "prep", "trainer"
    trainer.pop("dependsOn", None)
    if not labelled:
        for job in (prep, trainer):
            job["template"].get("metadata", {}).pop("labels", None)
    p = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    assert p is not None
    return p


def test_training_step_is_found_through_the_runtime() -> None:
    rt = custom_runtime()
    assert rt.training_jobs == frozenset({"trainer"})
    sink = RecordingSink()
    state = TrainerState(sink, clock=Clock())
    state.runtime_handler.on_added(rt, True)
    projector = TrainJobProjector(runtimes=state.runtimes_by_ref)
    assert (
        project(job_obj("custom-steps", [rj("prep", ready=1), rj("trainer")]), projector).state == "pending"
    )
    assert project(
        job_obj("custom-steps", [rj("prep", succeeded=1), rj("trainer", ready=2)]), projector
    ).ready
    # a job named `node` in that runtime's jobs would not be its training step
    assert not project(job_obj("custom-steps", [rj("node", ready=1)]), projector).ready


def test_unknown_runtime_reads_by_the_controllers_naming() -> None:
    """Runtime not (yet) known: ``node`` and ``launcher`` train (pkg/constants Node, Launcher), initializers
    never do; so ``trainer`` of the custom runtime is not running until the runtime is known."""
    for name, ready in [
        ("node", True),
        ("launcher", True),
        ("dataset-initializer", False),
        ("model-initializer", False),
        ("trainer", False),
    ]:
        assert project(job_obj("custom-steps", [rj(name, ready=1)])).ready is ready, name
    assert {"node", "launcher"} == rules.FALLBACK_TRAINING_JOBS


def test_a_runtime_that_labels_no_trainer_reads_by_the_controllers_naming() -> None:
    rt = custom_runtime(labelled=False)
    assert rt.training_jobs == rules.FALLBACK_TRAINING_JOBS


def test_a_runtime_arriving_later_applies_from_the_jobs_next_event() -> None:
    """The classification is taken when a projection is made and kept in it: the gauge, recomputed from the
    old projection on the next event, stays consistent when a runtime arrives (or changes) in between."""
    sink = RecordingSink()
    state = TrainerState(sink, clock=Clock(), runtime_wait_seconds=0)
    projector = TrainJobProjector(runtimes=state.runtimes_by_ref)
    first = project(job_obj("custom-steps", [rj("trainer", ready=1)]), projector)
    state.job_handler.on_added(first, False)
    assert first.state == "pending"  # not known: by the controller's naming
    state.runtime_handler.on_added(custom_runtime(), False)
    second = project(job_obj("custom-steps", [rj("trainer", ready=1)], rv=11), projector)
    state.job_handler.on_updated(first, second)
    assert second.state == "running"
    assert sink.gauge == {("team-a", CUSTOM, "running"): 1}
    assert [type(e).__name__ for e in sink.events] == ["JobCreated", "JobStarted"]
    # and a runtime deleted: the next event reads by the naming again, the gauge follows the projections
    state.runtime_handler.on_deleted(custom_runtime())
    third = project(job_obj("custom-steps", [rj("trainer", ready=1)], rv=12), projector)
    state.job_handler.on_updated(second, third)
    assert sink.gauge == {("team-a", CUSTOM, "pending"): 1}


def test_the_incremental_path_applies_the_same_rule() -> None:
    """Nearly every watch event takes ``from_wire(wire, previous)``, which re-derives only the status with its
    own loop over jobsStatus: it must agree with a full projection."""
    sink = RecordingSink()
    state = TrainerState(sink, clock=Clock())
    state.runtime_handler.on_added(custom_runtime(), True)
    projector = TrainJobProjector(runtimes=state.runtimes_by_ref)
    previous = project(job_obj("custom-steps", []), projector)
    for jobs in (
        [rj("prep", ready=1), rj("trainer")],
        [rj("prep", succeeded=1), rj("trainer", active=1)],
        [rj("prep", succeeded=1), rj("trainer", ready=1)],
        [rj("node", ready=3)],
    ):
        obj = job_obj("custom-steps", jobs, rv=11)
        wire = msgspec.json.decode(msgspec.json.encode(obj), type=projector.wire_type)
        assert projector.from_wire(wire, previous) == project(obj, projector)


@pytest.mark.parametrize(
    ("replicated", "mpi", "names"),
    [
        ([("node", {rules.ANCESTOR_LABEL: "trainer"})], False, {"node"}),
        (
            [
                ("dataset-initializer", {rules.ANCESTOR_LABEL: "dataset-initializer"}),
                ("model-initializer", {rules.ANCESTOR_LABEL: "model-initializer"}),
                ("node", {rules.ANCESTOR_LABEL: "trainer"}),
            ],
            False,
            {"node"},
        ),
        (
            [("a", {rules.ANCESTOR_LABEL: "trainer"}), ("b", {rules.ANCESTOR_LABEL: "trainer"})],
            False,
            {"a", "b"},
        ),
        ([("node", None), ("launcher", {rules.ANCESTOR_LABEL: "trainer"})], True, {"launcher"}),
        ([("node", {rules.ANCESTOR_LABEL: "trainer"}), ("launcher", None)], True, {"launcher"}),  # MPI
        ([("worker", None)], False, {"node", "launcher"}),  # no label: the controller's naming
        # a job labelled as an initializer is never the training step, whatever its name
        ([("node", {rules.ANCESTOR_LABEL: "dataset-initializer"})], False, {"launcher"}),
        ([("node", {rules.ANCESTOR_LABEL: "model-initializer"})], True, {"launcher"}),
        ([(None, {rules.ANCESTOR_LABEL: "trainer"}), (7, None)], False, {"node", "launcher"}),
    ],
)
def test_training_jobs(replicated: list[tuple[object, object]], mpi: bool, names: set[str]) -> None:
    assert rules.training_jobs(replicated, mpi) == frozenset(names)


@pytest.mark.parametrize(
    ("jobs_status", "ready"),
    [
        ([("node", 1)], True),
        ([("node", 0), ("dataset-initializer", 1)], False),
        ([("node", "1")], False),  # not a count
        ([("node", True)], False),
        ([("node", 1.0)], True),
        ([(["node"], 1)], False),  # not a name (and unhashable)
        ([], False),
    ],
)
def test_training_ready(jobs_status: list[tuple[object, object]], ready: bool) -> None:
    assert rules.training_ready(jobs_status, frozenset({"node"})) is ready
