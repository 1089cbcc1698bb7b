"""The ground truth's own reading of the Trainer rules (docs/design/product.md §3,
docs/design/trainer-domain.md §1-§3), on the real runtimes, and the shapes the generator writes.

Upstream sources, for the rules these tests pin down: kubeflow/trainer v2.3.0
pkg/runtime/core/trainingruntime.go newRuntimeInfo (node count, resourcesPerNode merge),
pkg/util/trainingruntime/trainingruntime.go MergeResourceRequirements, kubernetes pkg/apis/core/v1/defaults.go
SetDefaults_Pod (requests default to limits), kubernetes-sigs/jobset v0.12.0
pkg/controllers/jobset_controller.go calculateReplicatedJobStatuses (active vs ready)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from kubesim.trainer import shapes
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import OUTCOMES, WorkloadGenerator
from kubesim.trainer.truth import (
    FAILURE_REASONS,
    MAX_ACCELERATOR_CLASSES,
    MAX_REASON_NAMES,
    RuntimeFacts,
    Truth,
    classify,
    parse_quantity,
    quantity_value,
    reason_label,
    requested_accelerators,
    requested_nodes,
    runtime_facts,
    runtime_ref_of,
)


def job(
    *,
    ref: dict[str, Any] | None = None,
    namespace: str = "team-a",
    trainer: dict[str, Any] | None = None,
    suspend: bool | None = None,
    status: dict[str, Any] | None = None,
    uid: str = "u1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtimeRef": ref or {"name": "torch-distributed"}, "trainer": trainer or {}}
    if suspend is not None:
        spec["suspend"] = suspend
    obj: dict[str, Any] = {
        "metadata": {
            "name": "j",
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "5",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def cond(
    cond_type: str, status: str = "True", reason: str = "R", when: str = "2026-01-01T00:10:00Z"
) -> dict[str, Any]:
    return shapes.condition(cond_type, status, reason, "", when)


def cluster_runtime(name: str) -> dict[str, Any]:
    return next(doc for doc in shapes.cluster_runtimes() if doc["metadata"]["name"] == name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", Fraction(2)),
        (4, Fraction(4)),
        ("500m", Fraction(1, 2)),
        ("1k", Fraction(1000)),
        ("1Ki", Fraction(1024)),
        ("2e0", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        ("", None),
        ("abc", None),
        ("1e", None),
        (True, None),
    ],
)
def test_parse_quantity(text: object, expected: Fraction | None) -> None:
    assert parse_quantity(text) == expected


def test_quantity_value_rounds_up_like_go() -> None:
    assert quantity_value("500m") == 1
    assert quantity_value("1500m") == 2
    assert quantity_value("8") == 8


def test_runtime_ref_defaults_and_namespacing() -> None:
    assert runtime_ref_of(job())[0] == "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"
    namespaced = job(ref={"kind": "TrainingRuntime", "name": "mine"}, namespace="ns1")
    assert runtime_ref_of(namespaced) == (
        "trainer.kubeflow.org/TrainingRuntime/ns1/mine",
        ("TrainingRuntime", "ns1", "mine"),
    )
    assert runtime_ref_of(job(ref={"kind": "PyTorchJob", "name": "x"}))[0] == "unknown"
    assert runtime_ref_of(job(ref={"apiGroup": "kubeflow.org", "name": "x"}))[0] == "unknown"


def test_requested_nodes_fallbacks() -> None:
    two = RuntimeFacts(default_nodes=2)
    assert requested_nodes(job(trainer={"numNodes": 3}), two) == 3
    assert requested_nodes(job(trainer={"numNodes": 0}), two) == 0  # 0 stays 0
    assert requested_nodes(job(), two) == 2
    assert requested_nodes(job(), None) == 1  # runtime not found


GPU2 = (("nvidia.com/gpu", 2),)


def test_runtime_facts_of_the_real_runtimes() -> None:
    assert runtime_facts(cluster_runtime("torch-distributed")) == RuntimeFacts(1)
    # MPI, runLauncherAsNode: resources from the `node` worker job, merged into as into the launcher
    assert runtime_facts(cluster_runtime("deepspeed-distributed")) == RuntimeFacts(1)
    assert runtime_facts(cluster_runtime("torchtune-llama3.2-1b")) == RuntimeFacts(1, (), GPU2)
    assert runtime_facts(cluster_runtime("torchtune-llama3.2-1b")).accelerators() == list(GPU2)


def test_runtime_without_ml_policy_runs_its_parallelism_and_ignores_resources_per_node() -> None:
    tpu, cpu = shapes.plain_runtimes()
    assert runtime_facts(tpu) == RuntimeFacts(4, (), (("google.com/tpu", 4),), merges_job_resources=False)
    assert runtime_facts(cpu) == RuntimeFacts(1, (("cpu", 2),), (), merges_job_resources=False)
    facts = runtime_facts(tpu)
    gpus = {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}}
    assert requested_nodes(job(trainer=gpus), facts) == 4
    assert requested_accelerators(job(trainer=gpus), facts, 4) == (("google.com/tpu", 16),)


def test_accelerators_merge_job_resources_into_the_runtime_container() -> None:
    torchtune = runtime_facts(cluster_runtime("torchtune-qwen2.5-1.5b"))
    assert requested_accelerators(job(), torchtune, 4) == (("nvidia.com/gpu", 8),)
    # finding 1: a CPU-only override keeps the runtime's GPUs
    cpu = {"resourcesPerNode": {"requests": {"cpu": "4"}}}
    assert requested_accelerators(job(trainer=cpu), torchtune, 2) == (("nvidia.com/gpu", 4),)
    zero = {"resourcesPerNode": {"requests": {"nvidia.com/gpu": 0}, "limits": {"nvidia.com/gpu": 0}}}
    assert requested_accelerators(job(trainer=zero), torchtune, 2) == (("none", 0),)
    amd = {"resourcesPerNode": {"requests": {"cpu": "8", "amd.com/gpu": "4"}, "limits": {"amd.com/gpu": "4"}}}
    assert requested_accelerators(job(trainer=amd), torchtune, 2) == (
        ("amd.com/gpu", 8),
        ("nvidia.com/gpu", 4),
    )
    limits_only = {"resourcesPerNode": {"limits": {"nvidia.com/gpu": 1}}}
    assert requested_accelerators(job(trainer=limits_only), torchtune, 3) == (("nvidia.com/gpu", 3),)
    assert requested_accelerators(job(trainer=limits_only), None, 3) == (("nvidia.com/gpu", 3),)
    assert requested_accelerators(job(), None, 3) == (("none", 0),)


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, (("nvidia.com/mig-1g.10gb", 4),)),
        (1, (("nvidia.com/mig-3g.40gb", 2),)),
        (2, (("google.com/tpu", 8),)),
        (3, (("habana.ai/gaudi", 16),)),
        (4, (("aws.amazon.com/neuron", 2), ("aws.amazon.com/neuroncore", 4))),
        (5, (("nvidia.com/gpu", 2), ("nvidia.com/mig-2g.20gb", 4))),
        (6, (("gpu.intel.com/i915", 2),)),
        (7, (("none", 0),)),  # example.com/gpu-memory is not an accelerator
    ],
)
def test_other_accelerator_shapes(index: int, expected: tuple[tuple[str, int], ...]) -> None:
    torch = runtime_facts(cluster_runtime("torch-distributed"))
    resources = shapes.OTHER_ACCELERATORS[index]
    assert requested_accelerators(job(trainer={"resourcesPerNode": resources}), torch, 2) == expected


def test_every_other_accelerator_shape_is_checked() -> None:
    assert len(shapes.OTHER_ACCELERATORS) == 8


def test_reason_labels() -> None:
    for reason in (
        "FailedJobs",
        "DeadlineExceeded",
        "PodFailurePolicyRuleMatched",
        "InPlaceRestartBudgetExhausted",
    ):
        assert reason_label(reason) == reason
    for odd in ("evicted_by_descheduler", "Preempted:HigherPriority", "X" * 65, "", None, "none", "other"):
        assert reason_label(odd) == "other"


def test_generator_stays_below_the_service_caps() -> None:
    """The truth does not model the caps on distinct reasons and accelerator classes: the generator must
    not reach them (well-formed new reasons and accelerator classes are few)."""
    written = {o for o, _ in OUTCOMES if o not in ("Complete", "CompleteAndFailed")} | set(
        shapes.FAILURE_MESSAGES
    )
    named = {reason_label(r) for r in written} - FAILURE_REASONS - {"other"}
    assert named == {"PodFailurePolicyRuleMatched", "InPlaceRestartBudgetExhausted"}
    assert len(named) < MAX_REASON_NAMES
    gen = WorkloadGenerator(trainer_store(), seed=3)
    gen.populate(2000)
    classes = {cls for r in gen.snapshot().requests.values() for cls, _ in r.accelerators}
    assert len(classes) < MAX_ACCELERATOR_CLASSES
    assert {
        "nvidia.com/mig-1g.10gb",
        "google.com/tpu",
        "habana.ai/gaudi",
        "aws.amazon.com/neuroncore",
    } <= classes


def test_classify_states_and_terminal_precedence() -> None:
    assert classify(job()) == ("pending", None)
    assert classify(job(suspend=True, status={"conditions": [cond("Suspended", reason="Suspended")]}))[0] == (
        "suspended"
    )
    resumed = {
        "conditions": [cond("Suspended", "False", "Resumed")],
        "jobsStatus": [{"name": "node", "active": 1, "ready": 1}],
    }
    assert classify(job(suspend=False, status=resumed))[0] == "running"
    # finding 4: active but not ready (pods waiting for capacity) is pending
    waiting = {"jobsStatus": [{"name": "node", "active": 1, "ready": 0}]}
    assert classify(job(status=waiting))[0] == "pending"
    both = {"conditions": [cond("Complete", reason="AllJobsCompleted"), cond("Failed", reason="FailedJobs")]}
    state, terminal = classify(job(status=both))
    assert state == "failed"
    assert terminal is not None and terminal[:2] == ("failed", "FailedJobs")
    assert classify(job(status={"conditions": [cond("Failed", reason="Mystery")]}))[1][:2] == (  # type: ignore[index]
        "failed",
        "Mystery",
    )
    assert classify(job(status={"conditions": [cond("Failed", reason="mystery_x")]}))[1][:2] == (  # type: ignore[index]
        "failed",
        "other",
    )
    assert classify(job(status={"conditions": [cond("Failed", "Unknown")]}))[0] == "pending"
    # terminal wins over spec.suspend
    assert classify(job(suspend=True, status={"conditions": [cond("Complete")]}))[0] == "succeeded"


def test_truth_counts_first_terminal_write_once() -> None:
    truth = Truth()
    truth.runtime_written(cluster_runtime("torch-distributed"))
    truth.job_created(job())
    done = job(status={"conditions": [cond("Complete", reason="AllJobsCompleted")]})
    truth.job_written(done)
    truth.job_written(done)  # duplicate terminal update
    ref = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"
    snap = truth.snapshot()
    assert snap.finished == {("succeeded", "none", ref): 1}
    assert snap.jobs == {("team-a", ref, "succeeded"): 1}
    assert snap.terminal["u1"].lifetime_seconds == 600.0
    truth.job_deleted("u1")
    after = truth.snapshot()
    assert after.jobs == {}
    assert after.created_since(snap) == {} and after.finished_since(snap) == {}
    assert snap.jobs == {("team-a", ref, "succeeded"): 1}  # snapshots are immutable copies
