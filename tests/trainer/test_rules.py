"""Table-driven tests of the pure rules (app/trainer/rules/)."""

from __future__ import annotations

import pytest

from app.trainer import rules
from app.trainer.quantity import NOT_A_COUNT
from app.trainer.wire import Condition

G = "trainer.kubeflow.org"
CTR = "ClusterTrainingRuntime"
TR = "TrainingRuntime"


@pytest.mark.parametrize(
    ("group", "kind", "name", "ns", "label"),
    [
        (G, CTR, "torch-distributed", "team-a", f"{G}/{CTR}//torch-distributed"),
        (G, TR, "torch-with-dataset-init", "team-a", f"{G}/{TR}/team-a/torch-with-dataset-init"),
        (None, None, "flux-distributed", "team-a", f"{G}/{CTR}//flux-distributed"),  # CRD defaults
        ("", "", "flux-distributed", "team-a", f"{G}/{CTR}//flux-distributed"),
        (None, TR, "rt", "ns1", f"{G}/{TR}/ns1/rt"),
        ("example.com", CTR, "torch", "ns", "unknown"),  # not a Trainer group
        (G, "JobSet", "torch", "ns", "unknown"),  # not a Trainer runtime kind
        (G, "OptimizationJob", "torch", "ns", "unknown"),
        (G, CTR, "", "ns", "unknown"),
        (G, CTR, None, "ns", "unknown"),
        (G, CTR, "Bad Name!", "ns", "unknown"),  # cannot name a runtime
        (G, CTR, "a" * 254, "ns", "unknown"),
        (G, CTR, "torchtune-llama3.2-1b", "ns", f"{G}/{CTR}//torchtune-llama3.2-1b"),
    ],
)
def test_runtime_ref_label(
    group: str | None, kind: str | None, name: str | None, ns: str, label: str
) -> None:
    assert rules.runtime_ref_label(group, kind, name, ns) == label


TORCH = rules.NodeRule(1, True, False, 0)


@pytest.mark.parametrize(
    ("job", "rule", "nodes"),
    [
        (3, TORCH, 3),  # the job's value wins (every ML-policy plugin's EnforceMLPolicy)
        (None, rules.NodeRule(2, True, False, 0), 2),  # else the runtime's count
        (None, None, 1),  # else 1: runtime missing
        (5, None, 5),  # runtime missing: the job's own value
        (0, rules.NodeRule(4, True, False, 0), 0),  # 0 is legal and stays 0
        # no PodSet the plugins size (no ancestor-trainer job): numNodes is ignored, the runtime's count stays
        (8, rules.NodeRule(3, False, False, 0), 3),
        # MPI runLauncherAsNode, the launcher one pod: `node` gets max(n-1, 1) pods, the launcher trains too
        (1, rules.NodeRule(2, True, True, 1), 2),
        (0, rules.NodeRule(2, True, True, 1), 2),
        (2, rules.NodeRule(2, True, True, 1), 2),
        (4, rules.NodeRule(2, True, True, 1), 4),
        (None, rules.NodeRule(2, True, True, 1), 2),
        (4, rules.NodeRule(1, True, False, 0), 4),  # MPI without it: numNodes `node` pods
    ],
)
def test_requested_nodes(job: int | None, rule: rules.NodeRule | None, nodes: int) -> None:
    """kubeflow/trainer v2.3.0: plugins/{torch,jax,xgboost,plainml} EnforceMLPolicy set the ancestor-trainer
    PodSet's count to numNodes; plugins/mpi/mpi.go EnforceMLPolicy sets the `node` PodSet's to numNodes, or to
    max(numNodes-1, 1) with runLauncherAsNode, and buildHostFileConfigMap lists the launcher as a host too."""
    assert rules.requested_nodes(job, rule) == nodes


@pytest.mark.parametrize(
    ("args", "nodes"),
    [
        ((True, 4, True, None), 4),  # mlPolicy.numNodes for the ancestor-trainer job
        ((True, None, True, 3), 1),  # mlPolicy without numNodes: ptr.Deref(numNodes, 1), parallelism ignored
        ((False, None, True, 3), 3),  # no mlPolicy: the template's parallelism
        ((False, None, True, None), 1),  # ... ptr.Deref(parallelism, 1)
        ((True, 4, False, 2), 2),  # trainer job without the ancestor label: parallelism
        ((False, None, False, 0), 1),  # at least 1: WithPodSet's max(count, 1)
        ((True, 0, True, None), 1),
    ],
)
def test_pod_set_count(args: tuple[bool, int | None, bool, int | None], nodes: int) -> None:
    """kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go newRuntimeInfo: ``count :=
    ptr.Deref(rJob.Template.Spec.Parallelism, 1)``, then ``ptr.Deref(mlPolicy.NumNodes, 1)`` for the
    ancestor-``trainer`` job when ``mlPolicy != nil``; pkg/runtime/runtime.go WithPodSet keeps
    ``max(count, 1)``."""
    assert rules.pod_set_count(*args) == nodes


def _node_rule(jobs: list[rules.PodSetParts], policy: dict[str, object] | None) -> rules.NodeRule:
    return rules.node_rule(
        jobs,
        has_ml_policy=policy is not None,
        ml_policy_num_nodes=rules.runtime_num_nodes(policy)[0],
        mpi=rules.is_mpi(policy),
        launcher_as_node=rules.run_launcher_as_node(policy),
    )


INIT = ("dataset-initializer", False, None)


@pytest.mark.parametrize(
    ("jobs", "policy", "rule"),
    [
        # torch-distributed, torchtune (initializers first): the ancestor-trainer job
        ([("node", True, None)], {"numNodes": 1, "torch": {}}, TORCH),
        ([INIT, ("node", True, 5)], {"numNodes": 3, "torch": {}}, rules.NodeRule(3, True, False, 0)),
        # no mlPolicy (plainml): the trainer's parallelism, sized by numNodes
        ([("node", True, 4)], None, rules.NodeRule(4, True, False, 0)),
        # no job labelled trainer: FindPodSetByAncestor is nil, no plugin applies numNodes; the `node` job's
        # parallelism, else 1
        ([INIT, ("node", False, 3)], {"numNodes": 2, "torch": {}}, rules.NodeRule(3, False, False, 0)),
        ([("worker", False, 3)], None, rules.NodeRule(1, False, False, 0)),
        # deepspeed/mlx: `node` workers unlabelled (parallelism 1), the launcher labelled trainer
        # (mlPolicy.numNodes 1), runLauncherAsNode: both are hosts
        (
            [("node", False, None), ("launcher", True, None)],
            {"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
            rules.NodeRule(2, True, True, 1),
        ),
        # MPI without runLauncherAsNode: the `node` pods only
        (
            [("launcher", False, None), ("node", True, None)],
            {"numNodes": 3, "mpi": {}},
            rules.NodeRule(3, True, False, 0),
        ),
        # MPI without a `node` job: numNodes sizes nothing (FindPodSetByName(constants.Node) is nil)
        (
            [("launcher", True, None)],
            {"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
            rules.NodeRule(1, False, True, 1),
        ),
    ],
)
def test_node_rule(jobs: list[rules.PodSetParts], policy: dict[str, object] | None, rule: object) -> None:
    assert _node_rule(jobs, policy) == rule


GPU = "nvidia.com/gpu"


def res(requests: dict[str, int] | None = None, limits: dict[str, int] | None = None) -> rules.NodeResources:
    return (tuple(sorted((requests or {}).items())), tuple(sorted((limits or {}).items())))


@pytest.mark.parametrize(
    ("requests", "limits", "expected", "malformed"),
    [
        # a share or a size is kept (it overrides when merged) but is never a count of devices
        ({"nvidia.com/gpu": "1", "cpu": "500m"}, None, res({GPU: 1, "cpu": NOT_A_COUNT}), False),
        (None, {"nvidia.com/gpu": 2}, res(limits={GPU: 2}), False),  # YAML int
        ({"memory": "4Gi"}, {}, res({"memory": NOT_A_COUNT}), False),
        ({"nvidia.com/gpu": "0"}, None, res({GPU: 0}), False),  # kept: a 0 overrides the runtime's GPUs
        # not a Kubernetes resource name or not a quantity: dropped and flagged (never a label value)
        ({"NVIDIA.COM/GPU": "1", "amd.com/gpu": "1"}, None, res({"amd.com/gpu": 1}), True),
        ({'gpu"} 1\n': "1"}, None, res(), True),
        ({"example.com/" + "g" * 62 + "pu": "1"}, None, res(), True),  # name part of 64
        ({"nvidia.com/gpu": "lots"}, None, res(), True),
        ({"nvidia.com/gpu": None}, {"nvidia.com/gpu": "1"}, res(limits={GPU: 1}), True),
        (["nvidia.com/gpu"], None, res(), True),
        ({f"example.com/r{i}": "1" for i in range(100)}, None, None, True),  # capped at 64 entries
        (None, None, rules.NO_RESOURCES, False),
    ],
)
def test_node_resources(requests: object, limits: object, expected: object, malformed: bool) -> None:
    got, bad = rules.node_resources(requests, limits)
    assert bad is malformed
    if expected is None:
        assert len(got[0]) == rules.MAX_RESOURCE_ENTRIES
    else:
        assert got == expected
    assert rules.node_resources(requests, limits)[0] is got  # interned: equal lists share one value


# kubeflow/trainer v2.3.0 pkg/util/trainingruntime/trainingruntime_test.go TestMergeResourceRequirements,
# the cases about requests and limits (claims are not read here), plus the finding-1 case.
@pytest.mark.parametrize(
    ("base", "override", "merged"),
    [
        # "gpu only overlays runtime cpu and memory"
        (
            res(limits={"cpu": 8, "memory": 32}),
            res(limits={GPU: 4}),
            res(limits={"cpu": 8, "memory": 32, GPU: 4}),
        ),
        # "trainjob cpu overrides runtime cpu"
        (res(limits={"cpu": 8}), res(limits={"cpu": 4}), res(limits={"cpu": 4})),
        # "partial override keeps other runtime keys"
        (
            res(limits={"cpu": 5, "memory": 32}),
            res(limits={GPU: 2, "memory": 1}),
            res(limits={"cpu": 5, "memory": 1, GPU: 2}),
        ),
        # "empty override returns base"
        (res({"cpu": 1}), res(), res({"cpu": 1})),
        # "trainjob requests override runtime requests"
        (res({"cpu": 8, "memory": 32}), res({"cpu": 4}), res({"cpu": 4, "memory": 32})),
        # finding 1: torchtune's `limits: {nvidia.com/gpu: 2}` survives a CPU-only resourcesPerNode
        (res(limits={GPU: 2}), res({"cpu": 4}), res({"cpu": 4}, {GPU: 2})),
        (res(limits={GPU: 2}), res({GPU: 0}, {GPU: 0}), res({GPU: 0}, {GPU: 0})),  # an explicit 0 overrides
    ],
)
def test_merge_resources(base: rules.NodeResources, override: rules.NodeResources, merged: object) -> None:
    assert rules.merge_resources(base, override) == merged


@pytest.mark.parametrize(
    ("resources", "per_node"),
    [
        (res({GPU: 1, "cpu": 2}), ((GPU, 1),)),
        (res(limits={GPU: 2}), ((GPU, 2),)),  # the API server defaults the request to the limit
        (res({"cpu": 4}, {GPU: 2}), ((GPU, 2),)),  # per resource: requests name no GPU, the limit counts
        (res({GPU: 1}, {GPU: 4}), ((GPU, 1),)),  # the request, not the limit
        (res({"cpu": 2, "memory": 4}, {"cpu": 4}), ()),
        (res({GPU: 0}, {GPU: 0}), ()),  # zero requests nothing
        # every class, sorted by name
        (res({GPU: 2, "nvidia.com/mig-1g.10gb": 4}), ((GPU, 2), ("nvidia.com/mig-1g.10gb", 4))),
        (res(limits={"google.com/tpu": 4}), (("google.com/tpu", 4),)),
        (res({"habana.ai/gaudi": 8}), (("habana.ai/gaudi", 8),)),
        (
            res({"aws.amazon.com/neuroncore": 2, "aws.amazon.com/neuron": 1}),
            (
                ("aws.amazon.com/neuron", 1),
                ("aws.amazon.com/neuroncore", 2),
            ),
        ),
        (res({"amd.com/gpu": 1, "gpu.intel.com/i915": 1}), (("amd.com/gpu", 1), ("gpu.intel.com/i915", 1))),
        # names that merely contain "gpu" are not accelerators by default (#4190 counted them)
        (res({"example.com/gpu-memory": 16, "nvidia.com/GPU": 1}), ()),
    ],
)
def test_accelerators_per_node(resources: rules.NodeResources, per_node: object) -> None:
    assert rules.DEFAULT_ACCELERATORS.per_node(resources) == per_node


@pytest.mark.parametrize(
    ("per_node", "nodes", "expected"),
    [
        (((GPU, 2),), 2, ((GPU, 4),)),
        (((GPU, 2), ("nvidia.com/mig-1g.10gb", 1)), 3, ((GPU, 6), ("nvidia.com/mig-1g.10gb", 3))),
        ((), 3, (("none", 0),)),
        (((GPU, 4),), 0, ((GPU, 0),)),  # numNodes 0: the class is kept, count 0
    ],
)
def test_requested_accelerators(per_node: tuple[tuple[str, int], ...], nodes: int, expected: object) -> None:
    assert rules.requested_accelerators(per_node, nodes) == expected


def test_accelerator_patterns() -> None:
    default = rules.DEFAULT_ACCELERATORS
    for name in (
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb",
        "amd.com/gpu",
        "gpu.intel.com/i915",
        "gpu.intel.com/xe",
        "google.com/tpu",
        "habana.ai/gaudi",
        "aws.amazon.com/neuron",
        "aws.amazon.com/neuroncore",
        "aws.amazon.com/neurondevice",
    ):
        assert default(name), name
    for name in (
        "cpu",
        "memory",
        "gpu.intel.com/millicores",  # the device resources only (tests/trainer/test_device_resources.py)
        "example.com/gpu",
        "google.com/tpu-v5",
        "nvidia.com/mig",
    ):
        assert not default(name), name
    custom = rules.AcceleratorMatcher(["*gpu*", "example.com/fpga"])  # #4190's rule, plus an FPGA
    assert custom("gpu.intel.com/tiles") and custom("example.com/fpga") and not custom("google.com/tpu")
    assert not rules.AcceleratorMatcher([])("nvidia.com/gpu")
    assert rules.AcceleratorMatcher(["a.io/x.y"])("a.io/x.y") and not rules.AcceleratorMatcher(["a.io/x.y"])(
        "a.io/xzy"
    )
    for bad in ("", "a b", "a/b/c", "nvidia.com/gpu\n", "x" * 400):
        assert rules.accelerator_pattern_error(bad) is not None, bad
        with pytest.raises(ValueError):
            rules.AcceleratorMatcher([bad])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (None, False)),
        (3, (3, False)),
        (0, (0, False)),
        (-1, (None, True)),
        (2.0, (2, True)),
        (2.5, (None, True)),
        ("3", (3, True)),
        ("three", (None, True)),
        (True, (None, True)),
        (2**31 - 1, (2**31 - 1, False)),
        # Beyond int32 the schema refuses it: unusable, not clamped to a request nobody made.
        (2**40, (None, True)),
        (float(2**40), (None, True)),
        ("1099511627776", (None, True)),
        ({}, (None, True)),
    ],
)
def test_coerce_count(value: object, expected: tuple[int | None, bool]) -> None:
    assert rules.coerce_count(value) == expected


T1, T2 = "2025-06-01T10:05:00Z", "2025-06-01T10:07:00Z"


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], None),
        ([("Complete", "True", "AllJobsCompleted", T1)], ("succeeded", "AllJobsCompleted", T1)),
        ([("Failed", "True", "FailedJobs", T2)], ("failed", "FailedJobs", T2)),
        # Failed True beats Complete True, whatever the order
        (
            [("Complete", "True", "AllJobsCompleted", T1), ("Failed", "True", "DeadlineExceeded", T2)],
            ("failed", "DeadlineExceeded", T2),
        ),
        (
            [("Failed", "True", "FailedJobs", T2), ("Complete", "True", "AllJobsCompleted", T1)],
            ("failed", "FailedJobs", T2),
        ),
        ([("Complete", "False", "", T1), ("Failed", "False", "", T2)], None),
        ([("Suspended", "True", "Suspended", T1)], None),
        ([("Created", "True", "JobsCreationSucceeded", T1)], None),  # removed condition type, still seen
        ([("Failed", "True", "", None)], ("failed", "", None)),
        # of several conditions of one type, the first counts
        (
            [("Failed", "True", "FailedJobs", T1), ("Failed", "True", "DeadlineExceeded", T2)],
            ("failed", "FailedJobs", T1),
        ),
        (
            [("Complete", "False", "", T1), ("Complete", "True", "AllJobsCompleted", T2)],
            ("succeeded", "AllJobsCompleted", T2),
        ),
    ],
)
def test_terminal_condition(conditions: list[tuple[str, str, str, str | None]], expected: object) -> None:
    result, terminal, _, _ = rules.job_conditions([Condition(*c) for c in conditions])
    if terminal is None:
        assert result == "" and expected is None
    else:
        assert (result, terminal.reason, terminal.lastTransitionTime) == expected


@pytest.mark.parametrize(
    ("conditions", "suspended"),
    [
        ([("Suspended", "True", "Suspended", T1)], True),
        ([("Suspended", "False", "Resumed", T1)], False),  # Suspended(False) = resumed
        ([], False),
        ([("Failed", "True", "FailedJobs", T1), ("Suspended", "True", "Suspended", T1)], True),  # both read
    ],
)
def test_suspended_condition(conditions: list[tuple[str, str, str, str | None]], suspended: bool) -> None:
    assert rules.job_conditions([Condition(*c) for c in conditions])[2] is suspended


@pytest.mark.parametrize(
    ("result", "suspend", "cond", "ready", "state"),
    [
        ("", False, False, False, "pending"),  # includes pods active but waiting for capacity
        ("", False, False, True, "running"),
        ("", True, False, False, "suspended"),  # spec.suspend before the controller acts (Kueue)
        ("", False, True, True, "suspended"),  # resume not effective yet
        ("succeeded", True, True, True, "succeeded"),  # terminal wins
        ("failed", False, False, True, "failed"),
    ],
)
def test_job_state(result: str, suspend: bool, cond: bool, ready: bool, state: str) -> None:
    """Finding 4: running needs a ready child Job (jobsStatus[].ready), not an active one, which counts pods
    pending too (kubernetes-sigs/jobset v0.12.0 pkg/controllers/jobset_controller.go
    calculateReplicatedJobStatuses; api/jobset/v1alpha2/jobset_types.go ReplicatedJobStatus)."""
    assert rules.job_state(result, suspend, cond, ready) == state
    assert state in rules.JOB_STATES


@pytest.mark.parametrize(
    ("result", "reason", "bucket"),
    [
        ("succeeded", "AllJobsCompleted", "none"),
        ("succeeded", "FailedJobs", "none"),
        *[("failed", r, r) for r in rules.FAILURE_REASONS],
        # finding 5: a reason upstream does not list yet keeps its name when it is a CamelCase identifier
        ("failed", "BackoffLimitExceeded", "BackoffLimitExceeded"),
        ("failed", "PodFailurePolicyRuleMatched", "PodFailurePolicyRuleMatched"),
        ("failed", "A" + "b" * 63, "A" + "b" * 63),  # 64 characters
        # anything else is "other": too long, not CamelCase, or our own label values
        ("failed", "A" + "b" * 64, "other"),
        ("failed", "", "other"),
        ("failed", "failedjobs", "other"),
        ("failed", "Evicted:OOMKilled", "other"),  # the CRD pattern admits ':' and ','
        ("failed", "Failed_Jobs", "other"),
        ("failed", "none", "other"),
        ("failed", "other", "other"),
        ("failed", "Über", "other"),
    ],
)
def test_reason_bucket(result: str, reason: str, bucket: str) -> None:
    assert rules.reason_bucket(result, reason) == bucket
    assert rules.is_reason_label(bucket)


@pytest.mark.parametrize(
    ("created", "terminal", "lifetime"),
    [
        (1000.0, 1060.0, 60.0),
        (None, 1060.0, None),
        (1000.0, None, None),
        (1060.0, 1000.0, 0.0),  # clock skew: clamped to 0
    ],
)
def test_lifetime(created: float | None, terminal: float | None, lifetime: float | None) -> None:
    assert rules.lifetime_seconds(created, terminal) == lifetime


@pytest.mark.parametrize(
    ("value", "epoch"),
    [
        ("1970-01-01T00:01:00Z", 60.0),
        ("2025-06-01T10:00:00Z", 1748772000.0),
        ("2025-06-01T12:00:00+02:00", 1748772000.0),
        ("2025-06-01T10:00:00.5Z", 1748772000.5),
        ("2025-06-01T10:00:00", 1748772000.0),  # zone-less: UTC
        ("yesterday", None),
        ("", None),
        (None, None),
        (12345, None),
    ],
)
def test_parse_time(value: object, epoch: float | None) -> None:
    assert rules.parse_time(value) == epoch


@pytest.mark.parametrize(
    ("policy", "name"),
    [
        (None, "none"),
        ({"numNodes": 1, "torch": {}}, "torch"),
        ({"mpi": {"runLauncherAsNode": True}}, "mpi"),
        ({"flux": {}}, "flux"),
        ({"jax": {}}, "jax"),
        ({"xgboost": {}}, "xgboost"),
        ({"torch": {}, "mpi": {}}, "torch"),  # invalid per CEL; first in upstream's order wins
        ({"numNodes": 2}, "unknown"),  # set, but no policy source (upstream: unknown)
        ({"deepspeed": {}}, "unknown"),  # a policy we do not know
        ({"torch": None}, "unknown"),
        ("torch", "unknown"),
    ],
)
def test_ml_policy(policy: object, name: str) -> None:
    assert rules.ml_policy(policy) == name
    assert name in rules.ML_POLICIES


@pytest.mark.parametrize(
    ("policy", "name"),
    [
        (None, "none"),
        ({"coscheduling": {"scheduleTimeoutSeconds": 60}}, "coscheduling"),
        ({"volcano": {}}, "volcano"),
        ({"kai": {}}, "unknown"),
        ([], "unknown"),
    ],
)
def test_pod_group_policy(policy: object, name: str) -> None:
    assert rules.pod_group_policy(policy) == name
    assert name in rules.POD_GROUP_POLICIES


@pytest.mark.parametrize(
    ("labels", "framework"),
    [
        ({"trainer.kubeflow.org/framework": "deepspeed"}, "deepspeed"),
        ({}, "unknown"),
        (None, "unknown"),
        ({"trainer.kubeflow.org/framework": ""}, "unknown"),
        ({"trainer.kubeflow.org/framework": 3}, "unknown"),
        ({"trainer.kubeflow.org/framework": "x" * 500}, "x" * 63),  # capped
    ],
)
def test_framework(labels: object, framework: str) -> None:
    assert rules.framework(labels) == framework


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"numNodes": 4, "torch": {}}, (4, False)),
        ({"torch": {}}, (None, False)),  # no CRD default
        (None, (None, False)),
        ({"numNodes": "4"}, (4, True)),
        ({"numNodes": 1.5}, (None, True)),
        ("x", (None, True)),
    ],
)
def test_runtime_num_nodes(policy: object, expected: tuple[int | None, bool]) -> None:
    assert rules.runtime_num_nodes(policy) == expected


def test_run_launcher_as_node() -> None:
    assert rules.run_launcher_as_node({"mpi": {"runLauncherAsNode": True}}) is True
    assert rules.run_launcher_as_node({"mpi": {}}) is False
    assert rules.run_launcher_as_node({"torch": {}}) is False
    assert rules.run_launcher_as_node(None) is False
