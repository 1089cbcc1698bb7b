"""Table-driven tests of the pure rules (app/trainer/rules.py)."""

from __future__ import annotations

import pytest

from app.trainer import rules

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


@pytest.mark.parametrize(
    ("job", "runtime", "nodes"),
    [
        (3, 1, 3),  # the job's value wins
        (None, 2, 2),  # else the runtime's mlPolicy.numNodes
        (None, None, 1),  # else 1 (also: runtime missing, or runtime without mlPolicy)
        (0, 4, 0),  # 0 is legal and stays 0
        (None, 0, 0),
    ],
)
def test_requested_nodes(job: int | None, runtime: int | None, nodes: int) -> None:
    assert rules.requested_nodes(job, runtime) == nodes


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("nvidia.com/gpu", 1, None, 0, 2), ("nvidia.com/gpu", 2)),  # resourcesPerNode x nodes
        ((None, 0, "nvidia.com/gpu", 2, 3), ("nvidia.com/gpu", 6)),  # from the runtime's container
        (("none", 0, "nvidia.com/gpu", 2, 3), ("none", 0)),  # resourcesPerNode replaces the container's
        ((None, 0, None, 0, 3), ("none", 0)),  # no runtime known
        ((None, 0, "none", 0, 3), ("none", 0)),
        (("nvidia.com/gpu", 4, None, 0, 0), ("nvidia.com/gpu", 0)),  # numNodes 0
        (("amd.com/gpu", 0, None, 0, 2), ("amd.com/gpu", 0)),  # asked for zero GPUs explicitly
    ],
)
def test_requested_accelerators(args: tuple[str | None, int, str | None, int, int], expected: object) -> None:
    """(job class, job per node, runtime class, runtime per node, nodes) -> (class, total)."""
    assert rules.requested_accelerators(*args) == expected


@pytest.mark.parametrize(
    ("requests", "limits", "expected"),
    [
        ({"nvidia.com/gpu": "1", "cpu": "2"}, None, ("nvidia.com/gpu", 1, False)),
        (None, {"nvidia.com/gpu": 2}, ("nvidia.com/gpu", 2, False)),  # limits when requests name none
        ({"cpu": "2"}, {"nvidia.com/gpu": "2"}, ("nvidia.com/gpu", 2, False)),
        ({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "4"}, ("nvidia.com/gpu", 1, False)),  # requests first
        ({"cpu": "2", "memory": "4Gi"}, {"cpu": "4"}, ("none", 0, False)),
        ({"google.com/tpu": "4"}, None, ("none", 0, False)),  # only names containing "gpu"
        ({"nvidia.com/GPU": "1"}, None, ("nvidia.com/GPU", 1, False)),  # case-insensitive match
        # not a Kubernetes resource name (upper-case prefix, spaces, newline, too long): skipped, flagged
        ({"NVIDIA.COM/GPU": "1"}, None, ("none", 0, True)),
        ({"gpu with spaces": "1", "amd.com/gpu": "1"}, None, ("amd.com/gpu", 1, True)),
        ({'gpu"} 1\n': "1"}, None, ("none", 0, True)),
        ({"example.com/" + "g" * 62 + "pu": "1"}, None, ("none", 0, True)),  # name part of 64
        ({"amd.com/gpu": "2", "nvidia.com/gpu": "4"}, None, ("nvidia.com/gpu", 4, False)),  # largest wins
        ({"b.io/gpu": "2", "a.io/gpu": "2"}, None, ("a.io/gpu", 2, False)),  # tie: smallest name
        ({"nvidia.com/gpu": "500m"}, None, ("nvidia.com/gpu", 1, False)),  # rounded up
        ({"nvidia.com/gpu": "lots"}, None, ("none", 0, True)),  # unparsable: skipped, flagged
        ({"nvidia.com/gpu": None}, {"nvidia.com/gpu": "1"}, ("nvidia.com/gpu", 1, True)),
        (["nvidia.com/gpu"], None, ("none", 0, True)),
        (None, None, ("none", 0, False)),
    ],
)
def test_select_accelerator(requests: object, limits: object, expected: tuple[str, int, bool]) -> None:
    assert rules.select_accelerator(requests, limits) == expected


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
        (2**40, (2**31 - 1, False)),
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
        ([("Failed", "True", None, None)], ("failed", "", None)),
    ],
)
def test_terminal_condition(conditions: list[rules.Condition], expected: object) -> None:
    assert rules.terminal_condition(conditions) == expected


@pytest.mark.parametrize(
    ("conditions", "suspended"),
    [
        ([("Suspended", "True", "Suspended", T1)], True),
        ([("Suspended", "False", "Resumed", T1)], False),  # Suspended(False) = resumed
        ([], False),
    ],
)
def test_suspended_condition(conditions: list[rules.Condition], suspended: bool) -> None:
    assert rules.suspended_condition(conditions) is suspended


@pytest.mark.parametrize(
    ("result", "suspend", "cond", "active", "state"),
    [
        ("", False, False, False, "pending"),
        ("", False, False, True, "running"),
        ("", True, False, False, "suspended"),  # spec.suspend before the controller acts (Kueue)
        ("", False, True, True, "suspended"),  # resume not effective yet
        ("succeeded", True, True, True, "succeeded"),  # terminal wins
        ("failed", False, False, True, "failed"),
    ],
)
def test_job_state(result: str, suspend: bool, cond: bool, active: bool, state: str) -> None:
    assert rules.job_state(result, suspend, cond, active) == state
    assert state in rules.JOB_STATES


@pytest.mark.parametrize(
    ("result", "reason", "bucket"),
    [
        ("succeeded", "AllJobsCompleted", "none"),
        ("succeeded", "FailedJobs", "none"),
        *[("failed", r, r) for r in rules.FAILURE_REASONS],
        ("failed", "BackoffLimitExceeded", "other"),
        ("failed", "", "other"),
        ("failed", "failedjobs", "other"),
    ],
)
def test_reason_bucket(result: str, reason: str, bucket: str) -> None:
    assert rules.reason_bucket(result, reason) == bucket
    assert bucket in rules.REASONS


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
