"""Projections of every TrainJob and runtime in sim/kubesim/trainer/data, through both decoding paths."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from app.trainer import rules
from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
    RuntimeProjector,
    TrainJobProjector,
)
from app.trainer.projection_types import (
    READY,
    SUSPEND,
    SUSPENDED_CONDITION,
    RuntimeProjection,
    TrainJobProjection,
)
from app.trainer.quantity import NOT_A_COUNT
from tests.trainer.manifests import by_kind, stored, typed

G = "trainer.kubeflow.org"
CTR = f"{G}/ClusterTrainingRuntime/"
JOBS = by_kind("TrainJob")
RUNTIMES = [(n, o, TRAINING_RUNTIME_PROJECTOR) for n, o in by_kind("TrainingRuntime")] + [
    (n, o, CLUSTER_TRAINING_RUNTIME_PROJECTOR) for n, o in by_kind("ClusterTrainingRuntime")
]


def project_job(obj: Any) -> TrainJobProjection:
    """Both paths; they must agree."""
    fast = TRAINJOB_PROJECTOR.from_wire(typed(obj, TRAINJOB_PROJECTOR.wire_type))
    slow = TRAINJOB_PROJECTOR.from_json(obj)
    assert slow == fast
    return fast


def project_runtime(obj: Any, projector: RuntimeProjector) -> RuntimeProjection:
    fast = projector.from_wire(typed(obj, projector.wire_type))
    slow = projector.from_json(obj)
    assert slow == fast
    return fast


# A size is kept, but never as a count of devices (app/trainer/quantity.py device_count).
SIZE = NOT_A_COUNT
# The example jobs' CPU/memory resourcesPerNode (examples 02, 03, 05): requests 2 CPU 4Gi, limits 4 CPU 8Gi.
CPU_2_4: rules.NodeResources = ((("cpu", 2), ("memory", SIZE)), (("cpu", 4), ("memory", SIZE)))

# (ref, numNodes, resourcesPerNode as kept, state) per example TrainJob
JOB_EXPECTED: dict[str, tuple[str, int | None, rules.NodeResources | None, str]] = {
    # apiGroup/kind omitted: CRD defaults
    "examples/flux/flux-interactive.yaml:lammps-flux-interactive": (
        f"{CTR}/flux-distributed",
        4,
        None,
        "pending",
    ),
    "examples/flux/lammps-train-gpus.yaml:lammps-flux": (
        f"{CTR}/flux-distributed",
        2,
        ((("nvidia.com/gpu", 1),), (("nvidia.com/gpu", 1),)),
        "pending",
    ),
    "examples/flux/lammps-train-job.yaml:lammps-flux": (f"{CTR}/flux-distributed", 2, None, "pending"),
    "examples/yaml/01-multi-node.yaml:multi-node-example": (f"{CTR}/torch-distributed", 3, None, "pending"),
    "examples/yaml/02-runtime-patches.yaml:runtime-patches-example": (
        f"{CTR}/torch-distributed",
        2,
        CPU_2_4,
        "pending",
    ),
    # spec.suspend: true
    "examples/yaml/03-kueue-integration.yaml:kueue-example": (
        f"{CTR}/torch-distributed",
        3,
        CPU_2_4,
        "suspended",
    ),
    "examples/yaml/04-volcano-integration.yaml:volcano-example": (
        f"{CTR}/torch-distributed-volcano",
        4,
        ((("cpu", 1), ("memory", SIZE)), (("cpu", 2), ("memory", SIZE))),
        "pending",
    ),
    "examples/yaml/05-multi-step.yaml:multi-step-example": (
        f"{G}/TrainingRuntime/default/torch-with-dataset-init",
        2,
        CPU_2_4,
        "pending",
    ),
}

NO_RES = rules.NO_RESOURCES
NODE_ONLY = frozenset({"node"})
MPI_STEP = frozenset({"launcher"})
TORCH_NODES = rules.NodeRule(1, True, False, 0)
TORCH = ("torch", "none", "torch", 1, False, TORCH_NODES, NO_RES, True, NODE_ONLY)
# MPI runLauncherAsNode (plugins/mpi/mpi.go): the launcher (ancestor trainer: mlPolicy.numNodes 1) and the
# `node` workers (parallelism 1) are both hosts; numNodes sizes `node` as max(n-1, 1) beside the launcher.
MPI_LAUNCHER_AS_NODE = rules.NodeRule(2, True, True, 1)
MPI = ("mpi", "none", "", 1, True, MPI_LAUNCHER_AS_NODE, NO_RES, True, MPI_STEP)
# (ml_policy, pod_group_policy, framework, mlPolicy.numNodes, runLauncherAsNode, node rule,
#  node container resources, merges resourcesPerNode, training-step jobs)
RUNTIME_EXPECTED: dict[
    str, tuple[str, str, str, int | None, bool, rules.NodeRule, rules.NodeResources, bool, frozenset[str]]
] = {
    "flux-distributed": ("flux", "none", "flux", 1, False, TORCH_NODES, NO_RES, True, NODE_ONLY),
    "torch-distributed-volcano": ("torch", "volcano", *TORCH[2:]),
    "torch-distributed-with-cache": TORCH,  # the dataset initializer is not part of the training step
    # MPI: the `node` worker job (no ancestor label) gets resourcesPerNode through runLauncherAsNode
    "deepspeed-distributed": ("mpi", "none", "deepspeed", *MPI[3:]),
    "jax-distributed": ("jax", "none", "jax", 1, False, TORCH_NODES, NO_RES, True, NODE_ONLY),
    "mlx-distributed": ("mpi", "none", "mlx", *MPI[3:]),
    "torch-distributed": TORCH,
    # limits only, a YAML int
    "torchtune-llama3.2-1b": (
        "torch",
        "none",
        "torchtune",
        1,
        False,
        TORCH_NODES,
        ((), (("nvidia.com/gpu", 2),)),
        True,
        NODE_ONLY,
    ),
    "torchtune-llama3.2-3b": (
        "torch",
        "none",
        "torchtune",
        1,
        False,
        TORCH_NODES,
        ((), (("nvidia.com/gpu", 2),)),
        True,
        NODE_ONLY,
    ),
    "torchtune-qwen2.5-1.5b": (
        "torch",
        "none",
        "torchtune",
        1,
        False,
        TORCH_NODES,
        ((), (("nvidia.com/gpu", 2),)),
        True,
        NODE_ONLY,
    ),
    "xgboost-distributed": ("xgboost", "none", "xgboost", 1, False, TORCH_NODES, NO_RES, True, NODE_ONLY),
    "torch-with-dataset-init": ("torch", "none", "torch", 1, False, TORCH_NODES, NO_RES, True, NODE_ONLY),
}


def test_every_manifest_is_covered() -> None:
    assert sorted(n for n, _ in JOBS) == sorted(JOB_EXPECTED)
    assert sorted(o["metadata"]["name"] for _, o, _ in RUNTIMES) == sorted(RUNTIME_EXPECTED)


@pytest.mark.parametrize(("name", "obj"), JOBS, ids=[n for n, _ in JOBS])
def test_example_trainjobs(name: str, obj: dict[str, Any]) -> None:
    job = project_job(obj)
    ref, nodes, resources, state = JOB_EXPECTED[name]
    assert job.key == f"default/{obj['metadata']['name']}"
    assert job.name == obj["metadata"]["name"]
    assert job.namespace == "default"
    assert job.uid == obj["metadata"]["uid"]
    assert job.resource_version == "100"
    assert job.created == 1748772000.0
    assert job.runtime_ref == ref
    assert (job.num_nodes, job.resources) == (nodes, resources)
    assert job.state == state
    assert not job.terminal and not job.malformed


@pytest.mark.parametrize(("name", "obj", "projector"), RUNTIMES, ids=[n for n, _, _ in RUNTIMES])
def test_example_runtimes(name: str, obj: dict[str, Any], projector: RuntimeProjector) -> None:
    rt = project_runtime(obj, projector)
    rname = obj["metadata"]["name"]
    expected = RUNTIME_EXPECTED[rname]
    got = (
        rt.ml_policy,
        rt.pod_group_policy,
        rt.framework,
        rt.num_nodes,
        rt.run_launcher_as_node,
        rt.nodes,
        rt.node_resources,
        rt.merges_job_resources,
        rt.training_jobs,
    )
    assert got == expected
    assert rt.name == rname and rt.kind == projector.kind and not rt.malformed
    if projector is TRAINING_RUNTIME_PROJECTOR:
        assert (rt.namespace, rt.key, rt.ref) == (
            "default",
            f"default/{rname}",
            f"{G}/TrainingRuntime/default/{rname}",
        )
    else:
        assert (rt.namespace, rt.key, rt.ref) == ("", rname, f"{CTR}/{rname}")


def _multi_node() -> dict[str, Any]:
    return next(o for n, o in JOBS if n.endswith(":multi-node-example"))


def _with_status(
    obj: dict[str, Any], conditions: list[dict[str, Any]], jobs: list[dict[str, Any]] | None = None
) -> Any:
    obj = copy.deepcopy(obj)
    obj["status"] = {"conditions": conditions, "jobsStatus": jobs or []}
    return obj


def _cond(ctype: str, status: str, reason: str, t: str = "2025-06-01T10:10:00Z") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": "m", "lastTransitionTime": t}


@pytest.mark.parametrize(
    ("conditions", "jobs", "state", "result", "reason"),
    [
        ([], [{"name": "node", "active": 3, "ready": 3}], "running", "", ""),
        ([], [{"name": "node", "active": 0, "succeeded": 1}], "pending", "", ""),
        # pods pending (waiting for GPUs, pulling images): active counts them, ready does not
        ([], [{"name": "node", "active": 1, "ready": 0}], "pending", "", ""),
        (
            [],
            [
                {"name": "dataset-initializer", "active": 1, "ready": 1},
                {"name": "node", "active": 0, "ready": 0},
            ],
            "pending",
            "",
            "",
        ),  # an initializer's pods run: not the training step (rules.training_ready)
        # a reason longer than 64 characters is cut and marked, so it never passes for a CamelCase reason
        ([_cond("Failed", "True", "X" * 100)], [], "failed", "failed", "X" * 63 + "…"),
        ([_cond("Suspended", "True", "Suspended")], [], "suspended", "", ""),
        (
            [_cond("Suspended", "False", "Resumed")],
            [{"name": "node", "active": 1, "ready": 1}],
            "running",
            "",
            "",
        ),  # resumed
        ([_cond("Complete", "True", "AllJobsCompleted")], [], "succeeded", "succeeded", "AllJobsCompleted"),
        (
            [_cond("Complete", "True", "AllJobsCompleted"), _cond("Failed", "True", "FailedJobs")],
            [],
            "failed",
            "failed",
            "FailedJobs",
        ),  # Failed True beats Complete True
        (
            [_cond("Failed", "True", "DeadlineExceeded"), _cond("Suspended", "True", "Suspended")],
            [],
            "failed",
            "failed",
            "DeadlineExceeded",
        ),
        ([_cond("Created", "True", "JobsCreationSucceeded")], [], "pending", "", ""),  # old removed type
    ],
)
def test_status_summary(
    conditions: list[dict[str, Any]], jobs: list[dict[str, Any]], state: str, result: str, reason: str
) -> None:
    job = project_job(_with_status(_multi_node(), conditions, jobs))
    assert (job.state, job.result, job.reason) == (state, result, reason)
    if result:
        assert job.terminal_time == 1748772600.0
        assert rules.lifetime_seconds(job.created, job.terminal_time) == 600.0


def test_typed_path_skips_what_it_does_not_need() -> None:
    obj = _multi_node()
    obj["metadata"]["annotations"] = {"big": "x" * 1_000_000}
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    obj["status"] = {
        "trainerStatus": {"progressPercentage": 50, "metrics": [{"name": "loss", "value": "0.1"}]}
    }
    assert project_job(obj).num_nodes == 3


# --- tolerant path: objects the typed decoder rejects --------------------------------------------


def _mutated(path: list[str], value: Any) -> Any:
    obj = copy.deepcopy(_multi_node())
    target = obj
    for step in path[:-1]:
        target = target.setdefault(step, {})
    target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "check"),
    [
        (["spec", "trainer", "numNodes"], "3", lambda j: j.num_nodes == 3),
        (["spec", "trainer", "numNodes"], 2.5, lambda j: j.num_nodes is None),
        (["spec", "trainer", "numNodes"], [], lambda j: j.num_nodes is None),
        (
            ["spec", "trainer", "resourcesPerNode"],
            {"requests": {"nvidia.com/gpu": None, "cpu": "2"}},
            lambda j: j.resources == ((("cpu", 2),), ()),
        ),
        (["spec", "trainer", "resourcesPerNode"], "4 GPUs", lambda j: j.resources == rules.NO_RESOURCES),
        (
            ["spec", "trainer", "resourcesPerNode"],
            {"limits": {"nvidia.com/gpu": "2", "Bad Name": "1", "google.com/tpu": "four"}},
            lambda j: j.resources == ((), (("nvidia.com/gpu", 2),)),
        ),
        (["spec", "runtimeRef"], "torch", lambda j: j.runtime_ref == "unknown"),
        (["spec", "runtimeRef", "kind"], 7, lambda j: j.runtime_ref == f"{CTR}/torch-distributed"),
        (["spec", "suspend"], "yes", lambda j: not j.suspend),
        (["spec"], None, lambda j: j.runtime_ref == "unknown" and j.num_nodes is None),
        (["status"], "broken", lambda j: j.state == "pending"),
        (["status", "conditions"], {"type": "Failed"}, lambda j: j.state == "pending"),
        (
            ["status", "conditions"],
            ["junk", {"type": "Failed", "status": "True", "reason": 5}],
            lambda j: (j.result, j.reason) == ("failed", ""),
        ),
        (
            ["status", "conditions"],
            [{"type": "Complete", "status": "True", "lastTransitionTime": "soon"}],
            lambda j: j.result == "succeeded" and j.terminal_time is None,
        ),
        # a count that is not a number, or an entry with no (or a non-string) name, is not the training step
        (["status", "jobsStatus"], [{"name": "node", "ready": "3"}, {"ready": 2}], lambda j: not j.ready),
        (["status", "jobsStatus"], [{"name": ["node"], "ready": 1}], lambda j: not j.ready and j.malformed),
        (
            ["status", "jobsStatus"],
            [{"name": "x", "ready": "3"}, {"name": "node", "ready": 2}],
            lambda j: j.ready and j.malformed,
        ),
        (["metadata", "creationTimestamp"], 12, lambda j: j.created is None),
        (
            ["metadata", "namespace"],
            None,
            lambda j: j.key == "multi-node-example" and j.name == "multi-node-example",
        ),
        (["metadata", "resourceVersion"], 17, lambda j: j.resource_version == ""),
    ],
)
def test_tolerant_path(path: list[str], value: Any, check: Any) -> None:
    obj = _mutated(path, value)
    job = TRAINJOB_PROJECTOR.from_json(obj)
    assert job is not None
    try:
        wire = typed(obj, TRAINJOB_PROJECTOR.wire_type)
    except msgspec.ValidationError:
        pass  # the informer falls back to from_json
    else:  # the typed path accepted it: both paths must still agree
        assert TRAINJOB_PROJECTOR.from_wire(wire) == job
    assert check(job)
    assert job.malformed
    assert job.uid == obj["metadata"]["uid"]


@pytest.mark.parametrize(
    "obj",
    [
        None,
        3,
        "x",
        [],
        {},
        {"metadata": None},
        {"metadata": {"name": "a"}},
        {"metadata": {"uid": "u"}},
        {"metadata": {"name": "", "uid": "u"}},
        {"metadata": {"name": 5, "uid": "u"}},
    ],
)
def test_unusable_objects_are_dropped(obj: Any) -> None:
    assert TRAINJOB_PROJECTOR.from_json(obj) is None
    assert CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj) is None


def test_typed_path_requires_name_and_uid() -> None:
    with pytest.raises(msgspec.ValidationError):
        typed({"metadata": {"name": "a"}}, TRAINJOB_PROJECTOR.wire_type)


def _runtime(name: str) -> dict[str, Any]:
    return next(o for _, o, _ in RUNTIMES if o["metadata"]["name"] == name)


def test_runtime_without_ml_policy() -> None:
    obj = copy.deepcopy(_runtime("torch-distributed"))
    del obj["spec"]["mlPolicy"]
    rt = project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR)
    assert (rt.ml_policy, rt.num_nodes, rt.default_nodes) == ("none", None, 1)
    # no mlPolicy: the controller does not merge resourcesPerNode (newRuntimeInfo's isTrainerAncestor)
    assert not rt.merges_job_resources


def test_runtime_without_ml_policy_runs_the_template_parallelism() -> None:
    """Finding 3: kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go newRuntimeInfo starts every
    PodSet at ``ptr.Deref(template.spec.parallelism, 1)`` and replaces it with mlPolicy.numNodes only for
    the ancestor-``trainer`` job of a runtime that has an mlPolicy."""
    obj = copy.deepcopy(_runtime("torch-distributed"))
    del obj["spec"]["mlPolicy"]
    obj["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 3
    rt = project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR)
    assert (rt.num_nodes, rt.default_nodes) == (None, 3)
    assert rules.requested_nodes(None, rt.nodes) == 3
    assert rules.requested_nodes(5, rt.nodes) == 5  # plainml.go EnforceMLPolicy: numNodes wins
    # with an mlPolicy, the policy's numNodes (default 1) replaces the parallelism of the trainer job
    obj["spec"]["mlPolicy"] = {"torch": {}}
    assert project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR).default_nodes == 1
    obj["spec"]["mlPolicy"] = {"numNodes": 4, "torch": {}}
    assert project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR).default_nodes == 4
    # ... but only for the job labelled ancestor trainer: without the label, parallelism again, and no
    # plugin finds a trainer PodSet to size with the TrainJob's numNodes (FindPodSetByAncestor is nil)
    del obj["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["metadata"]
    rt = project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR)
    assert (rt.default_nodes, rt.merges_job_resources) == (3, False)
    assert rules.requested_nodes(5, rt.nodes) == 3
    # parallelism 0: WithPodSet keeps every PodSet at `max(count, 1)` pods (pkg/runtime/runtime.go)
    obj["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 0
    assert project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR).default_nodes == 1


def test_runtime_framework_missing() -> None:
    obj = copy.deepcopy(_runtime("torch-distributed"))
    del obj["metadata"]["labels"]
    assert project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR).framework == "unknown"


def test_runtime_gpu_from_requests_of_ancestor_trainer_job() -> None:
    """The trainer job is found by name `node` or by the ancestor label; its `node` container counts."""
    obj = copy.deepcopy(_runtime("torch-distributed"))
    rj = obj["spec"]["template"]["spec"]["replicatedJobs"][0]
    rj["name"] = "trainer-job"  # only the ancestor label identifies it now
    rj["template"]["spec"]["template"]["spec"]["containers"] = [
        {"name": "sidecar", "resources": {"requests": {"nvidia.com/gpu": "8"}}},
        {
            "name": "node",
            "resources": {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}},
        },
    ]
    rt = project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR)
    assert rt.node_resources == ((("nvidia.com/gpu", 4),), (("nvidia.com/gpu", 4),))
    assert rt.merges_job_resources


def test_runtime_tolerant_path() -> None:
    obj = copy.deepcopy(_runtime("torchtune-llama3.2-1b"))
    obj["spec"]["mlPolicy"]["numNodes"] = "2"
    obj["spec"]["template"]["spec"]["replicatedJobs"].insert(0, "junk")
    with pytest.raises(msgspec.ValidationError):
        typed(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR.wire_type)
    rt = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    assert rt is not None and rt.malformed
    assert (rt.num_nodes, rt.ml_policy, rt.default_nodes, rt.node_resources) == (
        2,
        "torch",
        2,
        ((), (("nvidia.com/gpu", 2),)),
    )


def test_cluster_runtime_ignores_a_namespace() -> None:
    obj = stored(_runtime("torch-distributed"))
    obj["metadata"]["namespace"] = "stray"
    rt = project_runtime(obj, CLUSTER_TRAINING_RUNTIME_PROJECTOR)
    assert (rt.namespace, rt.key) == ("", "torch-distributed")


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        RuntimeProjector("JobSet")


def test_repeated_strings_are_shared() -> None:
    a = project_job(stored(_multi_node(), uid="u-1"))
    b = project_job(stored(_multi_node(), uid="u-2"))
    assert a.runtime_ref is b.runtime_ref and a.namespace is b.namespace
    doc = next(o for n, o in JOBS if n.endswith(":runtime-patches-example"))
    c, d = project_job(stored(doc, uid="u-3")), project_job(stored(doc, uid="u-4"))
    assert c.resources is not None and c.resources is d.resources  # one interned value per template


# --- incremental projection and compact storage -------------------------------------------------

UID = "6f1c2a7e-8d4b-4c1a-9e2f-0123456789ab"


def _job_doc(
    *, generation: int | None = 1, uid: str = UID, rv: str = "100", gpus: str = "8", status: Any = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "j",
        "namespace": "team-a",
        "uid": uid,
        "resourceVersion": rv,
        "creationTimestamp": "2025-06-01T10:00:00Z",
    }
    if generation is not None:
        meta["generation"] = generation
    return {
        "metadata": meta,
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": {"nvidia.com/gpu": gpus}}},
        },
        "status": status or {},
    }


def _wire(doc: dict[str, Any]) -> Any:
    return typed(doc, TRAINJOB_PROJECTOR.wire_type)


STATUSES = [
    {},
    {"jobsStatus": [{"name": "node", "active": 2}]},
    {"jobsStatus": [{"name": "node", "active": 2, "ready": 1}]},
    {"conditions": [_cond("Suspended", "True", "Suspended")]},
    {"conditions": [_cond("Complete", "True", "AllJobsCompleted")]},
    {"conditions": [_cond("Complete", "True", "Done"), _cond("Failed", "True", "DeadlineExceeded")]},
    {"conditions": [_cond("Failed", "True", "FailedJobs", t="later")]},  # malformed time
    {"conditions": [_cond("Suspended", "False", "Resumed")], "jobsStatus": [{"ready": 0}, {"ready": 1}]},
    {
        "conditions": [
            _cond("Failed", "True", "FailedJobs"),
            _cond("Failed", "True", "DeadlineExceeded"),
            _cond("Suspended", "True", "Suspended"),
        ]
    },
]


@pytest.mark.parametrize("status", STATUSES)
def test_incremental_projection_equals_a_full_one(status: Any) -> None:
    previous = TRAINJOB_PROJECTOR.from_wire(_wire(_job_doc()))
    doc = _job_doc(rv="101", status=status)
    incremental = TRAINJOB_PROJECTOR.from_wire(_wire(doc), previous)
    assert incremental == TRAINJOB_PROJECTOR.from_wire(_wire(doc)) == TRAINJOB_PROJECTOR.from_json(doc)
    assert incremental.created is previous.created and incremental.uid_key is previous.uid_key  # reused


@pytest.mark.parametrize(
    "doc",
    [
        _job_doc(generation=2, gpus="4"),  # spec changed: generation bumped
        _job_doc(generation=None, gpus="4"),  # no generation: nothing is reused
        _job_doc(uid="0f1c2a7e-8d4b-4c1a-9e2f-0123456789ab", gpus="4"),  # another object, same name
        _job_doc(uid=UID.upper(), gpus="4"),  # not the same uid string
    ],
)
def test_incremental_projection_recomputes_the_spec_when_it_may_have_changed(doc: Any) -> None:
    generation = 1 if "generation" in doc["metadata"] else None
    previous = TRAINJOB_PROJECTOR.from_wire(_wire(_job_doc(generation=generation)))
    new = TRAINJOB_PROJECTOR.from_wire(_wire(doc), previous)
    assert new == TRAINJOB_PROJECTOR.from_wire(_wire(doc))
    assert new.resources == ((("nvidia.com/gpu", 4),), ())


@pytest.mark.parametrize("trainer_status", [False, True])
@pytest.mark.parametrize("status", STATUSES)
def test_status_wire_projection_equals_a_full_one(status: Any, trainer_status: bool) -> None:
    """A watch update of a cached job is decoded without its spec (TrainJobStatusWire) and projected from its
    status alone: the same projection as the whole object's, trainer progress included when it is read."""
    projector = TrainJobProjector(trainer_status=trainer_status)
    previous = projector.from_wire(typed(_job_doc(), projector.wire_type))
    progress = {"progressPercentage": 40, "lastUpdatedTime": "2025-06-01T11:00:00Z"}
    doc = _job_doc(rv="101", status={**status, "trainerStatus": progress})
    updated = projector.from_status_wire(typed(doc, projector.status_wire_type), previous)
    assert updated is not None
    assert updated == projector.from_wire(typed(doc, projector.wire_type)) == projector.from_json(doc)
    assert (updated.progress is not None) == trainer_status


def test_status_wire_keeps_a_suspended_spec() -> None:
    # spec.suspend is part of the spec: an update with the same generation keeps it (the API server bumps
    # the generation when it is flipped, test_status_wire_needs_the_spec_when_it_may_have_changed).
    suspended = _job_doc()
    suspended["spec"]["suspend"] = True
    previous = TRAINJOB_PROJECTOR.from_wire(_wire(suspended))
    doc = copy.deepcopy(suspended) | {"status": {"conditions": [_cond("Suspended", "True", "Suspended")]}}
    updated = TRAINJOB_PROJECTOR.from_status_wire(typed(doc, TRAINJOB_PROJECTOR.status_wire_type), previous)
    assert updated is not None and updated.flags & SUSPEND
    assert updated == TRAINJOB_PROJECTOR.from_wire(_wire(doc))


@pytest.mark.parametrize(
    "doc",
    [
        _job_doc(generation=2),  # spec written: generation bumped
        _job_doc(generation=None),  # no generation to compare
        _job_doc(uid="0f1c2a7e-8d4b-4c1a-9e2f-0123456789ab"),  # another object, same name
        _job_doc() | {"metadata": _job_doc()["metadata"] | {"name": "k"}},  # another key
    ],
)
def test_status_wire_needs_the_spec_when_it_may_have_changed(doc: Any) -> None:
    previous = TRAINJOB_PROJECTOR.from_wire(_wire(_job_doc()))
    wire = typed(doc, TRAINJOB_PROJECTOR.status_wire_type)
    assert TRAINJOB_PROJECTOR.from_status_wire(wire, previous) is None


def test_incremental_projection_never_reuses_a_malformed_previous() -> None:
    bad = _job_doc()
    bad["spec"]["trainer"]["numNodes"] = -1
    previous = TRAINJOB_PROJECTOR.from_wire(_wire(bad))
    assert previous.malformed
    new = TRAINJOB_PROJECTOR.from_wire(_wire(_job_doc(rv="101")), previous)
    assert not new.malformed and new.num_nodes == 2
    # nor does the status wire: the informer decodes the whole object instead
    wire = typed(_job_doc(rv="101"), TRAINJOB_PROJECTOR.status_wire_type)
    assert TRAINJOB_PROJECTOR.from_status_wire(wire, previous) is None


def test_uid_and_resource_version_are_stored_compactly_and_read_as_strings() -> None:
    p = TRAINJOB_PROJECTOR.from_wire(_wire(_job_doc(rv="12345")))
    assert (p.uid, p.resource_version) == (UID, "12345")
    assert (p.uid_key, p.rv) == (bytes.fromhex(UID.replace("-", "")), 12345)
    # anything that would not round-trip stays a string
    for uid, rv in (("u1", "007"), (UID.upper(), "abc"), (UID[:-1] + "g", ""), (" " + UID[1:], "1" * 19)):
        q = TRAINJOB_PROJECTOR.from_wire(_wire(_job_doc(uid=uid, rv=rv)))
        assert (q.uid, q.resource_version) == (uid, rv)
        assert q.uid_key == uid and q.rv == rv
    # built by hand from the string fields: the same stored values, equal projections
    fields = {f: getattr(p, f) for f in p.__struct_fields__}
    assert TrainJobProjection(**fields) == p


def test_namespace_that_is_not_a_dns_label_is_malformed_and_labelled_unknown() -> None:
    for ns in ("Team-A", "a" * 64, "a/b", ""):
        doc = _job_doc()
        doc["metadata"]["namespace"] = ns
        p = TRAINJOB_PROJECTOR.from_wire(_wire(doc))
        assert p.malformed and p.namespace_label == "unknown" and p.namespace == ns
    assert project_job(_job_doc()).namespace_label == "team-a"


def test_training_runtime_ref_needs_a_dns_label_namespace() -> None:
    doc = _job_doc()
    doc["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    doc["metadata"]["namespace"] = "x" * 64
    assert TRAINJOB_PROJECTOR.from_wire(_wire(doc)).runtime_ref == "unknown"
    rt = TRAINING_RUNTIME_PROJECTOR.from_json({"metadata": {"name": "r", "uid": "u", "namespace": "A_B"}})
    assert rt is not None and rt.ref == "unknown"


@pytest.mark.parametrize("result", ["", "succeeded", "failed"])
@pytest.mark.parametrize("flags", range(32))
def test_state_lookup_agrees_with_the_rule(result: str, flags: int) -> None:
    """``state`` reads a table instead of calling rules.job_state on every event: same answers."""
    job = msgspec.structs.replace(project_job(_job_doc()), result=result, flags=flags)
    bits = bool(flags & SUSPEND), bool(flags & SUSPENDED_CONDITION), bool(flags & READY)
    assert job.state == rules.job_state(result, *bits)
