"""TrainerState: the docs/design/product.md §6 invariants that live at this layer, with a recording sink."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from app.trainer.events import GaugeKey, JobCreated, JobFinished
from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
)
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import TORCH, Clock, G, by_kind, runtime, runtime_doc, stored

TUNE = f"{G}/ClusterTrainingRuntime//torchtune-llama3.2-1b"
DEEPSPEED = f"{G}/ClusterTrainingRuntime//deepspeed-distributed"
CREATED = "2025-06-01T10:00:00Z"
CREATED_AT = 1748772000.0  # CREATED in epoch seconds
DONE = "2025-06-01T10:30:00Z"


def job(
    name: str = "j1",
    *,
    uid: str | None = None,
    rv: int = 10,
    ns: str = "team-a",
    runtime: str = "torch-distributed",
    kind: str | None = "ClusterTrainingRuntime",
    num_nodes: int | str | None = 2,
    gpus: str | None = None,
    resources: dict[str, Any] | None = None,
    suspend: bool = False,
    active: int = 0,
    ready: int | None = None,
    complete: bool = False,
    failed: str | None = None,
) -> TrainJobProjection:
    """``ready`` defaults to ``active``: a child Job whose pods all run."""
    trainer: dict[str, Any] = {}
    if num_nodes is not None:
        trainer["numNodes"] = num_nodes
    if gpus is not None:
        trainer["resourcesPerNode"] = {"requests": {"nvidia.com/gpu": gpus}}
    if resources is not None:
        trainer["resourcesPerNode"] = resources
    ref: dict[str, Any] = {"name": runtime}
    if kind is not None:
        ref["kind"] = kind
    conditions = []
    if complete:
        conditions.append(
            {"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "lastTransitionTime": DONE}
        )
    if failed:
        conditions.append({"type": "Failed", "status": "True", "reason": failed, "lastTransitionTime": DONE})
    obj = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
            "creationTimestamp": CREATED,
        },
        "spec": {"runtimeRef": ref, "trainer": trainer, "suspend": suspend},
        "status": {
            "conditions": conditions,
            "jobsStatus": [{"name": "node", "active": active, "ready": active if ready is None else ready}],
        },
    }
    p = TRAINJOB_PROJECTOR.from_json(obj)
    assert p is not None
    return p


def make(**kw: Any) -> tuple[TrainerState, RecordingSink, Clock]:
    sink, clock = RecordingSink(), Clock()
    state = TrainerState(sink, clock=clock, wall_clock=lambda: 1.75e9, **kw)
    state.runtime_handler.on_added(runtime(), True)
    return state, sink, clock


def gauge_matches_cache(
    state: TrainerState, sink: RecordingSink, cache: dict[str, TrainJobProjection]
) -> None:
    """The sink's gauge equals what the cache implies (every ref here is a known runtime)."""
    expected: dict[GaugeKey, int] = {}
    for p in cache.values():
        key = (p.namespace, p.runtime_ref, p.state)
        expected[key] = expected.get(key, 0) + 1
    assert sink.gauge == expected == state.jobs_gauge()


# --- invariant 1: the initial list ---------------------------------------------------------------


def test_initial_list_is_not_created_and_terminal_not_finished() -> None:
    state, sink, _ = make()
    state.job_handler.on_added(job("a"), True)
    state.job_handler.on_added(job("b", complete=True), True)
    state.job_handler.on_added(job("c", failed="FailedJobs"), True)
    assert sink.events == []
    assert state.terminal_count == 2  # recorded without counting
    assert sink.gauge == {
        ("team-a", TORCH, "pending"): 1,
        ("team-a", TORCH, "succeeded"): 1,
        ("team-a", TORCH, "failed"): 1,
    }
    # a later duplicate terminal update of an initially-terminal job is not an edge
    state.job_handler.on_updated(job("b", complete=True), job("b", rv=11, complete=True))
    assert sink.finished == []


def test_created_after_the_initial_list() -> None:
    state, sink, _ = make()
    state.job_handler.on_added(job("a", rv=42, gpus="2", num_nodes=3), False)
    assert sink.events == [
        JobCreated(
            rv=42,
            uid="uid-a",
            namespace="team-a",
            runtime_ref=TORCH,
            requested_nodes=3,
            accelerator_class="nvidia.com/gpu",
            requested_accelerators=6,
            key="team-a/a",  # the job behind it, for exemplars
            at=CREATED_AT,
        )
    ]
    assert sink.gauge == {("team-a", TORCH, "pending"): 1}


# --- invariant 2: finished at most once per uid ---------------------------------------------------


def test_terminal_edge_counted_once_whatever_the_updates() -> None:
    state, sink, _ = make()
    a0 = job("a", rv=10)
    a1 = job("a", rv=11, active=2)
    a2 = job("a", rv=12, failed="ReachedMaxRestarts")
    a3 = job("a", rv=13, failed="ReachedMaxRestarts", active=0)
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, a1)
    assert sink.gauge == {("team-a", TORCH, "running"): 1}
    state.job_handler.on_updated(a1, a2)
    state.job_handler.on_updated(a2, a3)  # duplicate terminal MODIFIED
    state.job_handler.on_updated(a3, a3)  # resync
    state.job_handler.on_updated(a3, job("a", rv=14, failed="ReachedMaxRestarts", complete=True))
    assert sink.finished == [
        JobFinished(
            rv=12,
            uid="uid-a",
            result="failed",
            reason="ReachedMaxRestarts",
            runtime_ref=TORCH,
            lifetime_seconds=1800.0,
            namespace="team-a",
            key="team-a/a",
            at=CREATED_AT + 1800.0,  # the terminal condition's time
        )
    ]
    assert sink.gauge == {("team-a", TORCH, "failed"): 1}


def test_terminal_conditions_vanishing_and_returning_do_not_recount() -> None:
    state, sink, _ = make()
    a0, a1, a2 = job("a", rv=1), job("a", rv=2, complete=True), job("a", rv=3)
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, a1)
    state.job_handler.on_updated(a1, a2)  # status rewritten without the condition
    state.job_handler.on_updated(a2, job("a", rv=4, complete=True))
    assert len(sink.finished) == 1


@pytest.mark.parametrize(
    ("failed", "complete", "result", "reason"),
    [
        (None, True, "succeeded", "none"),
        ("FailedJobs", True, "failed", "FailedJobs"),  # Failed beats Complete
        ("DeadlineExceeded", False, "failed", "DeadlineExceeded"),
        ("TrainingRuntimeNotSupported", False, "failed", "TrainingRuntimeNotSupported"),
        ("FailJobSetFailurePolicyAction", False, "failed", "FailJobSetFailurePolicyAction"),
        ("PodFailurePolicy", False, "failed", "PodFailurePolicy"),  # a well-formed reason keeps its name
        ("pod-failure-policy", False, "failed", "other"),
    ],
)
def test_finished_result_and_reason(failed: str | None, complete: bool, result: str, reason: str) -> None:
    state, sink, _ = make()
    a0 = job("a")
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, job("a", rv=11, failed=failed, complete=complete))
    (ev,) = sink.finished
    assert (ev.result, ev.reason, ev.lifetime_seconds) == (result, reason, 1800.0)


def test_dedup_entry_dropped_on_delete_and_paginated() -> None:
    state, _, _ = make()
    jobs = [job(f"j{i:02d}", ns=f"ns{i % 3}", complete=True) for i in range(10)]
    for p in jobs:
        state.job_handler.on_added(p, True)
    assert state.terminal_count == 10
    seen: list[tuple[str, str, str]] = []
    token: str | None = None
    while True:
        page, token = state.terminal_entries(3, token)
        seen += [(e.namespace, e.name, e.uid) for e in page]
        if token is None:
            break
    assert seen == sorted((p.namespace, p.name, p.uid) for p in jobs)
    first = state.terminal_entries(1, None)[0][0]
    assert (first.result, first.reason, first.raw_reason, first.terminal_time, first.recorded_time) == (
        "succeeded",
        "none",
        "AllJobsCompleted",
        1748773800.0,
        1.75e9,
    )
    for p in jobs:
        state.job_handler.on_deleted(p)
    assert state.terminal_count == 0
    assert state.terminal_entries(5, None) == ([], None)
    with pytest.raises(ValueError):
        state.terminal_entries(5, "not-a-token")


def test_same_uid_readded_is_never_recounted() -> None:
    """A spurious delete + re-add of the same object (same uid) neither recreates nor refinishes it."""
    state, sink, _ = make()
    a0, a1 = job("a", rv=1), job("a", rv=2, complete=True)
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, a1)
    state.job_handler.on_deleted(a1)
    state.job_handler.on_added(a1, False)
    assert (len(sink.created), len(sink.finished)) == (1, 1)
    # re-added after a delete that happened before it finished: finishes once, not created again
    b0, b1 = job("b", rv=3), job("b", rv=4, complete=True)
    state.job_handler.on_added(b0, False)
    state.job_handler.on_deleted(b0)
    state.job_handler.on_added(b1, False)
    assert (len(sink.created), len(sink.finished)) == (2, 2)


def test_tombstones_are_bounded() -> None:
    """Exactly the last ``max_tombstones`` deleted uids are remembered: re-adding one of them does not
    recount it, re-adding an older one does."""
    state, sink, _ = make(max_tombstones=3)
    jobs = [job(f"j{i}") for i in range(10)]
    for p in jobs:
        state.job_handler.on_added(p, False)
        state.job_handler.on_deleted(p)
    assert len(sink.created) == 10
    for p in jobs[7:]:
        state.job_handler.on_added(p, False)
    assert len(sink.created) == 10
    state.job_handler.on_added(jobs[6], False)
    assert [e.uid for e in sink.created[10:]] == ["uid-j6"]


# --- invariant 3: relist diffs -------------------------------------------------------------------


def test_relist_with_adds_updates_deletes() -> None:
    """What the informer emits after a 410: adds (initial=False) for new objects, updates for changed
    ones, deletes for vanished ones. Edges that happened while the watch was down are not lost."""
    state, sink, _ = make()
    cache: dict[str, TrainJobProjection] = {}

    def add(p: TrainJobProjection, initial: bool) -> None:
        cache[p.key] = p
        state.job_handler.on_added(p, initial)

    def update(p: TrainJobProjection) -> None:
        old, cache[p.key] = cache[p.key], p
        state.job_handler.on_updated(old, p)

    def delete(key: str) -> None:
        state.job_handler.on_deleted(cache.pop(key))

    for name in ("keep", "finish", "gone", "gone-done"):
        add(job(name, rv=1), True)
    update(job("gone-done", rv=2, complete=True))
    assert (len(sink.created), len(sink.finished)) == (0, 1)
    # --- relist ---
    update(job("finish", rv=5, failed="FailedJobs"))  # finished while down: counted
    delete("team-a/gone")
    delete("team-a/gone-done")
    add(job("new", rv=6), False)  # created while down
    add(job("new-done", rv=7, complete=True), False)  # created AND finished while down
    update(job("keep", rv=1))  # unchanged object: nothing
    assert [e.uid for e in sink.created] == ["uid-new", "uid-new-done"]
    assert [e.uid for e in sink.finished] == ["uid-gone-done", "uid-finish", "uid-new-done"]
    assert state.terminal_count == 2  # finish, new-done; gone-done dropped with its delete
    gauge_matches_cache(state, sink, cache)
    # a second identical relist changes nothing
    before = list(sink.events)
    for p in list(cache.values()):
        update(p)
    assert sink.events == before


def test_recreated_name_with_new_uid_is_a_new_job() -> None:
    state, sink, _ = make()
    old, new = job("a", uid="u1", rv=1, complete=True), job("a", uid="u2", rv=9)
    state.job_handler.on_added(old, True)
    state.job_handler.on_updated(old, new)  # relist saw the name with another uid
    assert [e.uid for e in sink.created] == ["u2"]
    assert state.terminal_count == 0
    assert sink.gauge == {("team-a", TORCH, "pending"): 1}


# --- gauge ---------------------------------------------------------------------------------------


def test_gauge_moves_and_empties() -> None:
    state, sink, _ = make()
    a0, a1 = job("a", suspend=True), job("a", rv=11)
    state.job_handler.on_added(a0, True)
    state.job_handler.on_updated(a0, a1)
    state.job_handler.on_deleted(a1)
    assert sink.gauge_calls == [
        (("team-a", TORCH, "suspended"), 1),
        (("team-a", TORCH, "suspended"), 0),
        (("team-a", TORCH, "pending"), 1),
        (("team-a", TORCH, "pending"), 0),
    ]
    assert state.jobs_gauge() == {}


def test_unchanged_key_emits_nothing() -> None:
    state, sink, _ = make()
    a0 = job("a")
    state.job_handler.on_added(a0, True)
    n = len(sink.gauge_calls)
    state.job_handler.on_updated(a0, job("a", rv=11))
    assert len(sink.gauge_calls) == n


# --- invariant 4: runtime updates and deletes -----------------------------------------------------


def test_runtime_update_and_delete_change_info_and_later_resolution() -> None:
    state, sink, _ = make(runtime_wait_seconds=0)
    assert [r.name for r in state.runtime_info()] == ["torch-distributed"]
    state.job_handler.on_added(job("a", num_nodes=None), False)
    state.runtime_handler.on_updated(runtime(), runtime(rv=6, num_nodes=4))
    state.job_handler.on_added(job("b", num_nodes=None), False)
    state.runtime_handler.on_deleted(runtime(rv=6, num_nodes=4))
    state.job_handler.on_added(job("c", num_nodes=None), False)
    assert [e.requested_nodes for e in sink.created] == [1, 4, 1]
    # the deleted runtime's jobs keep their label (no flip to "unknown")
    assert {e.runtime_ref for e in sink.created} == {TORCH}
    assert state.runtime_info() == []
    assert sink.runtime_changes == 3
    assert state.runtimes() == []


def test_runtime_info_and_snapshot() -> None:
    state, _sink, _ = make()
    state.runtime_handler.on_added(runtime("deepspeed-distributed"), True)
    state.runtime_handler.on_added(runtime("torch-with-dataset-init", ns="team-b"), True)
    info = {(r.kind, r.namespace, r.name): r for r in state.runtime_info()}
    ds = info[("ClusterTrainingRuntime", "", "deepspeed-distributed")]
    assert (ds.api_group, ds.ml_policy, ds.pod_group_policy, ds.framework) == (G, "mpi", "none", "deepspeed")
    assert ("TrainingRuntime", "team-b", "torch-with-dataset-init") in info
    snap = {r.ref: r for r in state.runtimes()}
    assert snap[DEEPSPEED].num_nodes == 1 and snap[DEEPSPEED].resource_version == "5"
    assert f"{G}/TrainingRuntime/team-b/torch-with-dataset-init" in snap


def test_mpi_run_launcher_as_node_counts_the_launcher_as_a_node() -> None:
    """kubeflow/trainer v2.3.0 plugins/mpi/mpi.go: numNodes 4 gives `node` 3 pods beside the launcher; with
    no numNodes, deepspeed runs its launcher and one `node` worker, both hosts (see test_node_count.py)."""
    state, sink, _ = make()
    state.runtime_handler.on_added(runtime("deepspeed-distributed"), True)
    state.job_handler.on_added(job("a", runtime="deepspeed-distributed", num_nodes=4, gpus="1"), False)
    state.job_handler.on_added(job("b", runtime="deepspeed-distributed", num_nodes=None, gpus="1"), False)
    assert [(e.requested_nodes, e.requested_accelerators) for e in sink.created] == [(4, 4), (2, 2)]


def test_accelerators_from_runtime_container_vs_resources_per_node() -> None:
    state, sink, _ = make()
    state.runtime_handler.on_added(runtime("torchtune-llama3.2-1b"), True)
    tune = "torchtune-llama3.2-1b"
    state.job_handler.on_added(job("a", runtime=tune, num_nodes=3), False)
    one_gpu = {"limits": {"nvidia.com/gpu": "1"}}
    state.job_handler.on_added(job("b", runtime=tune, num_nodes=3, resources=one_gpu), False)
    state.job_handler.on_added(job("c", runtime=tune, num_nodes=0), False)
    no_gpu = {"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "0"}}
    state.job_handler.on_added(job("d", runtime=tune, num_nodes=3, resources=no_gpu), False)
    assert [e.accelerators for e in sink.created] == [
        (("nvidia.com/gpu", 6),),  # 2 per node from the runtime's node container x 3
        (("nvidia.com/gpu", 3),),  # resourcesPerNode's limit replaces the runtime's, per key
        (("nvidia.com/gpu", 0),),  # numNodes 0
        (("none", 0),),  # an explicit 0 GPUs overrides the runtime's 2
    ]
    assert [e.runtime_ref for e in sink.created] == [TUNE] * 4


def _example_job(name: str, **changes: Any) -> dict[str, Any]:
    """A vendored example TrainJob as stored, its spec.trainer / runtimeRef changed."""
    obj = stored(next(o for n, o in by_kind("TrainJob") if n.endswith(f":{name}")), uid=f"u-{name}")
    obj["spec"]["runtimeRef"].update(changes.pop("runtimeRef", {}))
    obj["spec"]["trainer"].update(changes)
    return obj


def test_resources_per_node_merge_into_the_runtime_container() -> None:
    """Finding 1. kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go newRuntimeInfo merges
    spec.trainer.resourcesPerNode into the trainer job's `node` container with
    pkg/util/trainingruntime/trainingruntime.go MergeResourceRequirements (since #3602), so a CPU-only
    override of torchtune-llama3.2-1b (`limits: {nvidia.com/gpu: 2}`) keeps its GPUs: 2 per pod, 4 in all.
    Replacing (as #4190 does) reported `none`, 0."""
    state, sink, _ = make(runtime_wait_seconds=0)
    state.runtime_handler.on_added(runtime("torchtune-llama3.2-1b"), True)
    obj = _example_job(
        "multi-node-example",
        runtimeRef={"name": "torchtune-llama3.2-1b"},
        numNodes=2,
        resourcesPerNode={"requests": {"cpu": "4"}},
    )
    p = TRAINJOB_PROJECTOR.from_json(obj)
    assert p is not None
    state.job_handler.on_added(p, False)
    (ev,) = sink.created
    assert (ev.runtime_ref, ev.requested_nodes, ev.accelerators) == (TUNE, 2, (("nvidia.com/gpu", 4),))


def test_resources_per_node_are_ignored_by_a_runtime_without_ml_policy() -> None:
    """newRuntimeInfo merges only into the ancestor-trainer job of a runtime with an mlPolicy (or the MPI
    `node` job with runLauncherAsNode): a plain runtime's pods keep the runtime's resources."""
    state, sink, _ = make(runtime_wait_seconds=0)
    doc = runtime_doc("torchtune-llama3.2-1b")
    del doc["spec"]["mlPolicy"]
    rt = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(doc)
    assert rt is not None and not rt.merges_job_resources
    state.runtime_handler.on_added(rt, True)
    tpu = {"limits": {"google.com/tpu": "4"}}
    state.job_handler.on_added(job("a", runtime="torchtune-llama3.2-1b", num_nodes=1, resources=tpu), False)
    assert sink.created[0].accelerators == (("nvidia.com/gpu", 2),)


def test_every_accelerator_class_is_observed() -> None:
    """Finding 2: each class a job requests is its own observation, and MIG slices, TPUs, Gaudi and Neuron
    are accelerators (the default patterns); upstream observes each class, #4190 counted only `gpu` names."""
    state, sink, _ = make(runtime_wait_seconds=0)
    shapes = [
        {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"}},
        {"limits": {"google.com/tpu": "4"}},
        {"requests": {"habana.ai/gaudi": "8", "cpu": "16"}, "limits": {"habana.ai/gaudi": "8"}},
        {"limits": {"aws.amazon.com/neuroncore": "2", "aws.amazon.com/neuron": "1"}},
        {"limits": {"example.com/gpu-memory": "16"}},  # contains "gpu" but is not an accelerator
    ]
    for i, res in enumerate(shapes):
        state.job_handler.on_added(job(f"j{i}", num_nodes=2, resources=res), False)
    assert [e.accelerators for e in sink.created] == [
        (("nvidia.com/gpu", 2), ("nvidia.com/mig-1g.10gb", 4)),
        (("google.com/tpu", 8),),
        (("habana.ai/gaudi", 16),),
        (("aws.amazon.com/neuron", 2), ("aws.amazon.com/neuroncore", 4)),
        (("none", 0),),
    ]
    first = sink.created[0]
    assert (first.accelerator_class, first.requested_accelerators) == ("nvidia.com/gpu", 2)
    assert first.more_accelerators == (("nvidia.com/mig-1g.10gb", 4),)


def test_accelerator_patterns_are_configurable() -> None:
    state, sink, _ = make(runtime_wait_seconds=0, accelerator_patterns=["*gpu*"])  # #4190's reading
    state.job_handler.on_added(
        job("a", resources={"limits": {"google.com/tpu": "4", "x.io/gpu": "1"}}), False
    )
    assert sink.created[0].accelerators == (("x.io/gpu", 2),)
    tpu = state.runtime_accelerators(runtime("torchtune-llama3.2-1b"))
    assert tpu == (("nvidia.com/gpu", 2),)


def test_node_count_of_a_runtime_without_ml_policy_is_its_parallelism() -> None:
    """Finding 3: newRuntimeInfo gives the trainer job ``ptr.Deref(parallelism, 1)`` nodes when the
    runtime has no mlPolicy; the TrainJob's numNodes still wins (plainml.go EnforceMLPolicy)."""
    state, sink, _ = make(runtime_wait_seconds=0)
    doc = runtime_doc("torch-distributed")
    del doc["spec"]["mlPolicy"]
    doc["metadata"]["name"] = "plain-parallel"
    doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 3
    rt = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(doc)
    assert rt is not None
    state.runtime_handler.on_added(rt, True)
    state.job_handler.on_added(job("a", runtime="plain-parallel", num_nodes=None), False)
    state.job_handler.on_added(job("b", runtime="plain-parallel", num_nodes=5), False)
    assert [e.requested_nodes for e in sink.created] == [3, 5]


def test_a_runtime_edited_after_the_job_was_counted_changes_nothing_counted() -> None:
    """The controller builds a job's JobSet from the runtime as it was at the job's first reconcile (and
    keeps it in the `<job>-runtime-snapshot` ConfigMap); we resolve a job once, when it is counted created,
    against the runtime known then. A later edit of the runtime changes the jobs created after it only."""
    state, sink, _ = make(runtime_wait_seconds=0)
    state.runtime_handler.on_added(runtime("torchtune-llama3.2-1b"), True)
    a = job("a", runtime="torchtune-llama3.2-1b", num_nodes=None)
    state.job_handler.on_added(a, False)
    edited = runtime_doc("torchtune-llama3.2-1b")
    edited["metadata"]["resourceVersion"] = "9"
    edited["spec"]["mlPolicy"]["numNodes"] = 4
    node = edited["spec"]["template"]["spec"]["replicatedJobs"][-1]["template"]["spec"]["template"]["spec"]
    node["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    rt = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(edited)
    assert rt is not None
    state.runtime_handler.on_updated(runtime("torchtune-llama3.2-1b"), rt)
    state.job_handler.on_updated(
        a, job("a", runtime="torchtune-llama3.2-1b", num_nodes=None, rv=11, active=1)
    )
    state.job_handler.on_added(job("b", runtime="torchtune-llama3.2-1b", num_nodes=None), False)
    assert [(e.uid, e.requested_nodes, e.accelerators) for e in sink.created] == [
        ("uid-a", 1, (("nvidia.com/gpu", 2),)),
        ("uid-b", 4, (("nvidia.com/gpu", 32),)),
    ]


def test_namespaced_runtime_resolution() -> None:
    state, sink, _ = make()
    state.runtime_handler.on_added(runtime("torch-with-dataset-init", ns="team-a", num_nodes=5), True)
    state.job_handler.on_added(
        job("a", runtime="torch-with-dataset-init", kind="TrainingRuntime", num_nodes=None), False
    )
    state.job_handler.on_added(
        job("b", ns="team-b", runtime="torch-with-dataset-init", kind="TrainingRuntime", num_nodes=None),
        False,
    )
    clock_flush = state.flush_pending(1e9)
    assert clock_flush == 1
    assert [(e.namespace, e.requested_nodes) for e in sink.created] == [("team-a", 5), ("team-b", 1)]
    assert sink.created[1].runtime_ref == f"{G}/TrainingRuntime/team-b/torch-with-dataset-init"


# --- unknown runtime refs: capped ----------------------------------------------------------------


def test_junk_refs_are_capped() -> None:
    state, sink, _ = make(max_unknown_runtime_refs=2, runtime_wait_seconds=0)
    for i in range(5):
        state.job_handler.on_added(job(f"j{i}", runtime=f"junk-{i}"), False)
    state.job_handler.on_added(job("x", runtime="torch-distributed"), False)  # known: never capped
    state.job_handler.on_added(job("y", runtime="junk-0"), False)  # admitted ref stays admitted
    state.job_handler.on_added(job("z", runtime="x", kind="Deployment"), False)  # not a runtime kind
    refs = [e.runtime_ref for e in sink.created]
    j = f"{G}/ClusterTrainingRuntime//junk-"
    assert refs == [f"{j}0", f"{j}1", "unknown", "unknown", "unknown", TORCH, f"{j}0", "unknown"]
    assert state.unknown_runtime_refs == 2
    assert {k[1] for k in sink.gauge} == {f"{j}0", f"{j}1", "unknown", TORCH}
    assert sink.gauge[("team-a", "unknown", "pending")] == 4


def test_cap_slot_frees_when_jobs_leave_and_overflowed_ref_recovers_when_runtime_arrives() -> None:
    state, sink, _ = make(max_unknown_runtime_refs=1, runtime_wait_seconds=0)
    a = job("a", runtime="junk-a")
    b = job("b", runtime="deepspeed-distributed")  # over the cap: "unknown" until its runtime arrives
    state.job_handler.on_added(a, False)
    state.job_handler.on_added(b, False)
    assert sink.gauge[("team-a", "unknown", "pending")] == 1
    state.runtime_handler.on_added(runtime("deepspeed-distributed"), False)
    assert sink.gauge == {
        ("team-a", f"{G}/ClusterTrainingRuntime//junk-a", "pending"): 1,
        ("team-a", DEEPSPEED, "pending"): 1,
    }
    state.job_handler.on_deleted(b)  # the stored label was remapped: decrement hits the right key
    state.job_handler.on_deleted(a)
    assert sink.gauge == {} and state.unknown_runtime_refs == 0
    state.job_handler.on_added(job("c", runtime="junk-c"), False)  # the freed slot is reusable
    assert sink.created[-1].runtime_ref == f"{G}/ClusterTrainingRuntime//junk-c"


# --- pending resolution --------------------------------------------------------------------------


def test_created_waits_for_a_late_runtime() -> None:
    state, sink, clock = make(runtime_wait_seconds=5)
    state.job_handler.on_added(job("a", runtime="torchtune-llama3.2-1b", num_nodes=None, rv=20), False)
    assert sink.created == [] and state.pending_count == 1
    assert sink.gauge == {("team-a", TUNE, "pending"): 1}  # the gauge does not wait
    clock.now += 1
    state.runtime_handler.on_added(runtime("torchtune-llama3.2-1b", num_nodes=2), False)
    assert sink.created == [
        JobCreated(
            rv=20,
            uid="uid-a",
            namespace="team-a",
            runtime_ref=TUNE,
            requested_nodes=2,
            accelerator_class="nvidia.com/gpu",
            requested_accelerators=4,
            key="team-a/a",
            at=CREATED_AT,
        )
    ]
    assert state.pending_count == 0


def test_created_emitted_with_defaults_after_the_wait() -> None:
    state, sink, clock = make(runtime_wait_seconds=5)
    state.job_handler.on_added(job("a", runtime="late", num_nodes=None), False)
    assert state.flush_pending(clock.now + 4.9) == 0
    clock.now += 5
    assert state.flush_pending() == 1
    (ev,) = sink.created
    assert (ev.requested_nodes, ev.accelerator_class, ev.requested_accelerators) == (1, "none", 0)
    assert ev.runtime_ref == f"{G}/ClusterTrainingRuntime//late"


def test_job_events_flush_expired_pending() -> None:
    state, sink, clock = make(runtime_wait_seconds=5)
    state.job_handler.on_added(job("a", runtime="late", num_nodes=None), False)
    clock.now += 6
    state.job_handler.on_added(job("b"), False)
    assert [e.uid for e in sink.created] == ["uid-a", "uid-b"]


def test_fully_specified_job_waits_for_its_runtime_too() -> None:
    """numNodes and resourcesPerNode set: the runtime's container still merges in (its GPUs count)."""
    state, sink, clock = make(runtime_wait_seconds=5)
    cpu = {"requests": {"cpu": "4"}}
    state.job_handler.on_added(job("a", runtime="torchtune-llama3.2-1b", num_nodes=2, resources=cpu), False)
    assert sink.created == [] and state.pending_count == 1
    clock.now += 1
    state.runtime_handler.on_added(runtime("torchtune-llama3.2-1b"), False)
    assert sink.created[0].accelerators == (("nvidia.com/gpu", 4),)


def test_unwatched_cluster_runtimes_are_not_waited_for() -> None:
    """A namespaced install does not watch ClusterTrainingRuntimes: their jobs are counted at once, with the
    job's own spec; a TrainingRuntime not known yet is still waited for."""
    sink, clock = RecordingSink(), Clock()
    state = TrainerState(
        sink, clock=clock, wall_clock=lambda: 1.75e9, runtime_wait_seconds=5, cluster_runtimes_watched=False
    )
    state.job_handler.on_added(job("a", runtime="torchtune-llama3.2-1b", num_nodes=3, gpus="2"), False)
    assert state.pending_count == 0
    (ev,) = sink.created
    assert (ev.runtime_ref, ev.requested_nodes, ev.accelerators) == (TUNE, 3, (("nvidia.com/gpu", 6),))
    state.job_handler.on_added(job("b", runtime="mine", kind="TrainingRuntime"), False)
    assert state.pending_count == 1 and len(sink.created) == 1


def test_finished_waits_behind_its_pending_created() -> None:
    state, sink, _clock = make(runtime_wait_seconds=5)
    a0, a1 = (
        job("a", runtime="late", num_nodes=None, rv=1),
        job("a", runtime="late", num_nodes=None, rv=2, complete=True),
    )
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, a1)
    assert sink.events == []
    state.job_handler.on_deleted(a1)  # deletion flushes: it was created and finished
    assert [type(e).__name__ for e in sink.events] == ["JobCreated", "JobFinished"]
    assert [e.rv for e in sink.events] == [1, 2]


def test_added_terminal_waits_too() -> None:
    state, sink, clock = make(runtime_wait_seconds=5)
    state.job_handler.on_added(job("a", runtime="late", num_nodes=None, complete=True), False)
    assert sink.events == []
    clock.now += 5
    state.flush_pending()
    assert [type(e).__name__ for e in sink.events] == ["JobCreated", "JobFinished"]


# --- invariant 6: malformed objects ---------------------------------------------------------------


def test_malformed_job_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    state, sink, _ = make(runtime_wait_seconds=0)
    caplog.set_level(logging.WARNING, logger="app.trainer.state")
    bad0 = job("bad", num_nodes="lots", rv=1)
    bad1 = job("bad", num_nodes="lots", rv=2, failed="oops")
    assert bad0.malformed
    state.job_handler.on_added(bad0, False)
    state.job_handler.on_updated(bad0, bad1)
    state.job_handler.on_updated(bad1, bad1)
    assert [r.getMessage() for r in caplog.records if "bad" in r.getMessage()].__len__() == 1
    assert sink.created[0].requested_nodes == 1  # the runtime's numNodes, as if unset
    assert sink.finished[0].reason == "other"
    # a delete forgets the uid (the logged set does not grow with history): seen again, logged again
    state.job_handler.on_deleted(bad1)
    state.job_handler.on_added(bad1, False)
    assert [r.getMessage() for r in caplog.records if "bad" in r.getMessage()].__len__() == 2


def test_non_numeric_resource_version_gives_rv_zero() -> None:
    state, sink, _ = make()
    obj = stored(next(o for n, o in by_kind("TrainJob") if n.endswith("multi-node-example")))
    obj["metadata"]["resourceVersion"] = "opaque-xyz"
    p = TRAINJOB_PROJECTOR.from_json(obj)
    assert p is not None
    state.job_handler.on_added(p, False)
    assert sink.created[0].rv == 0


def test_every_example_trainjob_through_the_state() -> None:
    """All vendored runtimes and example jobs: created events resolve as the rules say."""
    state, sink, _ = make(runtime_wait_seconds=0)
    for kind, projector in (
        ("ClusterTrainingRuntime", CLUSTER_TRAINING_RUNTIME_PROJECTOR),
        ("TrainingRuntime", TRAINING_RUNTIME_PROJECTOR),
    ):
        for _, o in by_kind(kind):
            rt = projector.from_json(o)
            assert rt is not None
            state.runtime_handler.on_added(rt, True)
    for i, (_, o) in enumerate(by_kind("TrainJob")):
        p = TRAINJOB_PROJECTOR.from_json(stored(o, uid=f"u{i}"))
        assert p is not None
        state.job_handler.on_added(p, False)
    got = {
        (e.runtime_ref.rsplit("/", 1)[1], e.requested_nodes, e.accelerator_class, e.requested_accelerators)
        for e in sink.created
    }
    assert got == {
        ("flux-distributed", 4, "none", 0),
        ("flux-distributed", 2, "nvidia.com/gpu", 2),
        ("flux-distributed", 2, "none", 0),
        ("torch-distributed", 3, "none", 0),
        ("torch-distributed", 2, "none", 0),
        ("torch-distributed-volcano", 4, "none", 0),
        ("torch-with-dataset-init", 2, "none", 0),
    }
    assert len(sink.created) == 8
    assert "unknown" not in {e.runtime_ref for e in sink.created}


# --- label bounds --------------------------------------------------------------------------------


def test_accelerator_classes_are_capped_into_other() -> None:
    hits: list[str] = []
    state, sink, _ = make(
        runtime_wait_seconds=0, max_accelerator_classes=2, on_limit=hits.append, accelerator_patterns=["*gpu"]
    )
    for i, gpus in enumerate(
        [
            ["a.io/gpu"],
            ["b.io/gpu"],
            ["c.io/gpu"],
            ["a.io/gpu"],
            ["d.io/gpu"],
            ["a.io/gpu", "e.io/gpu", "f.io/gpu"],
        ]
    ):
        trainer = {"numNodes": 1, "resourcesPerNode": {"requests": dict.fromkeys(gpus, "1")}}
        obj = {
            "metadata": {"name": f"j{i}", "namespace": "team-a", "uid": f"u{i}", "resourceVersion": "5"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer},
        }
        p = TRAINJOB_PROJECTOR.from_json(obj)
        assert p is not None
        state.job_handler.on_added(p, False)
    assert [e.accelerators for e in sink.created] == [
        (("a.io/gpu", 1),),
        (("b.io/gpu", 1),),
        (("other", 1),),
        (("a.io/gpu", 1),),
        (("other", 1),),
        (("a.io/gpu", 1), ("other", 2)),  # the job's classes beyond the cap: one "other" observation
    ]
    assert hits == ["accelerator_classes"] * 4


def _fail(state: TrainerState, name: str, reason: str) -> None:
    j0 = job(name)
    state.job_handler.on_added(j0, False)
    state.job_handler.on_updated(j0, job(name, rv=11, failed=reason))


def test_failure_reasons_by_name_up_to_a_cap() -> None:
    """Finding 5: a reason upstream does not list (a new JobSet or Trainer release's) shows by name when it
    is a well-formed condition reason, up to ``max_failure_reasons`` distinct names; then "other", and the
    cap hit is reported (trainer_metrics_limit_hits_total{limit="failure_reasons"})."""
    hits: list[str] = []
    state, sink, _ = make(runtime_wait_seconds=0, max_failure_reasons=2, on_limit=hits.append)
    reasons = ["PodFailurePolicyRuleMatched", "FailedJobs", "NewJobSetReason", "ThirdReason"]
    reasons += ["PodFailurePolicyRuleMatched", "DeadlineExceeded", "not-camel-case", "A" * 65]
    for i, reason in enumerate(reasons):
        _fail(state, f"j{i}", reason)
    assert [e.reason for e in sink.finished] == [
        "PodFailurePolicyRuleMatched",
        "FailedJobs",  # upstream's reasons never use up the cap
        "NewJobSetReason",
        "other",  # the third distinct new reason
        "PodFailurePolicyRuleMatched",  # admitted once, kept
        "DeadlineExceeded",
        "other",
        "other",
    ]
    assert hits == ["failure_reasons"]


def test_pending_until_a_child_job_is_ready() -> None:
    """Finding 4: ``active`` counts child Jobs with pods running or pending, so a job waiting for GPUs is
    pending until a child Job is ``ready`` (kubernetes-sigs/jobset v0.12.0
    pkg/controllers/jobset_controller.go calculateReplicatedJobStatuses)."""
    state, sink, _ = make()
    a0 = job("a")
    waiting = job("a", rv=11, active=1, ready=0)  # pods pending for capacity
    running = job("a", rv=12, active=1, ready=1)
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, waiting)
    assert sink.gauge == {("team-a", TORCH, "pending"): 1}
    state.job_handler.on_updated(waiting, running)
    assert sink.gauge == {("team-a", TORCH, "running"): 1}
    state.job_handler.on_updated(running, job("a", rv=13, active=1, ready=0))  # a pod restarts
    assert sink.gauge == {("team-a", TORCH, "pending"): 1}


def test_namespace_label_of_a_malformed_namespace_is_unknown(caplog: pytest.LogCaptureFixture) -> None:
    state, sink, _ = make(runtime_wait_seconds=0)
    bad = job("j", ns="N" * 100_000, uid="u-bad")
    with caplog.at_level(logging.WARNING, logger="app.trainer.state"):
        state.job_handler.on_added(bad, False)
        state.job_handler.on_updated(bad, job("j", ns="N" * 100_000, uid="u-bad", rv=11, complete=True))
    (created,) = sink.created
    (finished,) = sink.finished
    assert created.namespace == finished.namespace == "unknown"
    assert {key[0] for key in sink.gauge} == {"unknown"}
    (record,) = caplog.records
    assert len(record.getMessage()) < 1000  # the key is truncated in the warning


def test_runtime_info_leaves_out_runtimes_with_invalid_names() -> None:
    state, _, _ = make()
    for projector, ns in ((TRAINING_RUNTIME_PROJECTOR, "x" * 64), (CLUSTER_TRAINING_RUNTIME_PROJECTOR, None)):
        r = projector.from_json({"metadata": {"name": "N" * 300, "uid": "u-" + str(ns)[:3], "namespace": ns}})
        assert r is not None and r.ref == "unknown"
        state.runtime_handler.on_added(r, False)
    assert [i.name for i in state.runtime_info()] == ["torch-distributed"]
    assert len(state.runtimes()) == 3  # still in the debug snapshot


def test_compact_uids_key_the_dedup_set_and_read_back_as_strings() -> None:
    state, sink, _ = make(runtime_wait_seconds=0)
    uid = "6f1c2a7e-8d4b-4c1a-9e2f-0123456789ab"
    a0, a1 = job("a", uid=uid, rv=1), job("a", uid=uid, rv=2, complete=True)
    state.job_handler.on_added(a0, False)
    state.job_handler.on_updated(a0, a1)
    state.job_handler.on_updated(a1, job("a", uid=uid, rv=3, complete=True))
    assert [e.uid for e in sink.created] == [e.uid for e in sink.finished] == [uid]
    (entry,), _ = state.terminal_entries(10)
    assert entry.uid == uid and entry.name == "a" and entry.namespace == "team-a"
    assert [e.rv for e in sink.events] == [1, 2]


def test_edges_found_by_a_relist_carry_the_rv_held_before_the_gap() -> None:
    """app/trainer/events.py: a relist's edges happened after ``since`` and at or before ``rv``; watch edges
    carry since 0."""
    state, sink, _clock = make()
    state.job_handler.on_added(job("old", rv=1), True)
    state.job_handler.on_added(job("watched", rv=3), False)
    state.job_handler.on_relist(3)
    state.job_handler.on_added(job("new-done", rv=9, complete=True), False)
    state.job_handler.on_updated(job("old", rv=1), job("old", rv=8, failed="FailedJobs"))
    state.job_handler.on_relist(None)
    state.job_handler.on_added(job("after", rv=10), False)
    assert [(e.uid, e.rv, e.since) for e in sink.events] == [
        ("uid-watched", 3, 0),
        ("uid-new-done", 9, 3),
        ("uid-new-done", 9, 3),
        ("uid-old", 8, 3),
        ("uid-after", 10, 0),
    ]


def test_a_relisted_creation_waiting_for_its_runtime_keeps_its_since() -> None:
    state, sink, _clock = make(runtime_wait_seconds=5)
    a0 = job("a", runtime="late", num_nodes=None, rv=7)
    a1 = job("a", runtime="late", num_nodes=None, rv=8, complete=True)
    state.job_handler.on_relist(4)
    state.job_handler.on_added(a0, False)
    state.job_handler.on_relist(None)
    state.job_handler.on_updated(a0, a1)  # seen on the watch
    assert sink.events == []
    state.job_handler.on_deleted(a1)
    assert [(type(e).__name__, e.rv, e.since) for e in sink.events] == [
        ("JobCreated", 7, 4),
        ("JobFinished", 8, 0),
    ]


def test_waiting_creations_name_the_lowest_rv_they_may_have_happened_at() -> None:
    """What keeps a hand-over watermark below the edges not emitted yet (app/handover/journal.py)."""
    state, sink, clock = make(runtime_wait_seconds=5)
    assert state.waiting_rvs(per_namespace=True) == {}
    state.job_handler.on_added(job("a", runtime="late", rv=7), False)
    state.job_handler.on_relist(4)
    state.job_handler.on_added(job("b", runtime="late", rv=9, ns="team-b"), False)  # created in (4, 9]
    state.job_handler.on_relist(None)
    state.job_handler.on_added(job("c", runtime="late", rv=11, ns="team-b"), False)
    assert state.waiting_rvs(per_namespace=True) == {"team-a": 7, "team-b": 5}
    assert state.waiting_rvs(per_namespace=False) == {"": 5}
    clock.now += 5
    state.flush_pending()
    assert state.waiting_rvs(per_namespace=False) == {} and len(sink.created) == 3
