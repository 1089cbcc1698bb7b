"""The ground truth's own reading of the Trainer rules (docs/design/product.md §3,
docs/design/trainer-domain.md §1-§3), on the real runtimes, and the shapes the generator writes.

Upstream sources, for the rules these tests pin down: kubeflow/trainer v2.3.0
pkg/runtime/core/trainingruntime.go newRuntimeInfo (node count, resourcesPerNode merge),
pkg/runtime/framework/plugins/{torch,jax,xgboost,plainml}/*.go EnforceMLPolicy (numNodes sets the PodSet
labelled ancestor trainer; none: numNodes ignored), plugins/mpi/mpi.go EnforceMLPolicy (the ``node`` PodSet,
max(numNodes-1, 1) with runLauncherAsNode), pkg/util/trainingruntime/trainingruntime.go
MergeResourceRequirements, kubernetes pkg/apis/core/v1/defaults.go SetDefaults_Pod (requests default to
limits), kubernetes-sigs/jobset v0.12.0 pkg/controllers/jobset_controller.go calculateReplicatedJobStatuses
(active vs ready: an initializer is ready while it downloads)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from kubesim.trainer import controller, shapes
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.gen_cluster import FOREIGN_FAILURES
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.jobset import FAIL_JOBSET_ACTION, FAILED_JOBS, REACHED_MAX_RESTARTS
from kubesim.trainer.shapes_runtimes import cluster_runtimes, operator_runtimes, plain_runtimes
from kubesim.trainer.truth import Truth
from kubesim.trainer.truth_resources import (
    MAX_ACCELERATOR_CLASSES,
    NOT_A_COUNT,
    RuntimeFacts,
    device_count,
    parse_quantity,
    requested_accelerators,
    requested_nodes,
    runtime_facts,
)
from kubesim.trainer.truth_rules import (
    FAILURE_REASONS,
    FALLBACK_TRAINING,
    MAX_REASON_NAMES,
    classify,
    reason_label,
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
    return controller.condition(cond_type, status, reason, "", when)


def cluster_runtime(name: str) -> dict[str, Any]:
    docs = cluster_runtimes() + operator_runtimes()
    return next(doc for doc in docs if doc["metadata"]["name"] == name)


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


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("8", 8),
        (8, 8),
        ("4e0", 4),
        ("1.0", 1),
        (2.0, 2),
        (-2, 0),
        # Sizes, shares and fractions are never a number of devices (trainer-domain.md §1).
        ("8G", NOT_A_COUNT),
        ("16Gi", NOT_A_COUNT),
        ("500m", NOT_A_COUNT),
        ("1k", NOT_A_COUNT),
        ("1.5", NOT_A_COUNT),
        (1.5, NOT_A_COUNT),
        ("abc", None),
        (True, None),
    ],
)
def test_device_counts_are_whole_numbers_without_a_unit(value: object, count: int | None) -> None:
    assert device_count(value) == count


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
    assert requested_nodes(job(trainer={"numNodes": 5}), None) == 5


GPU2 = (("nvidia.com/gpu", 2),)
TRAINER = frozenset({"node"})
MPI = frozenset({"launcher"})  # mpirun runs in the launcher; the node workers serve sshd


def test_runtime_facts_of_the_real_runtimes() -> None:
    assert runtime_facts(cluster_runtime("torch-distributed")) == RuntimeFacts(1, training=TRAINER)
    # MPI, runLauncherAsNode: resources from the `node` worker job, merged into as into the launcher; the
    # launcher counts as a node beside the workers.
    assert runtime_facts(cluster_runtime("deepspeed-distributed")) == RuntimeFacts(
        1, launcher_as_node=True, training=MPI
    )
    # The initializers are never the training step.
    assert runtime_facts(cluster_runtime("torchtune-llama3.2-1b")) == RuntimeFacts(
        1, (), GPU2, training=TRAINER
    )
    assert runtime_facts(cluster_runtime("torchtune-llama3.2-1b")).accelerators() == list(GPU2)
    assert runtime_facts(cluster_runtime("torch-distributed-with-cache")).training == TRAINER


@pytest.mark.parametrize(
    ("runtime", "num_nodes", "nodes"),
    [
        ("torch-distributed", None, 1),
        ("torch-distributed", 4, 4),
        ("torch-distributed", 0, 0),
        # MPI with runLauncherAsNode: max(numNodes-1, 1) `node` workers plus the launcher.
        ("deepspeed-distributed", None, 2),
        ("deepspeed-distributed", 1, 2),
        ("deepspeed-distributed", 0, 2),
        ("deepspeed-distributed", 4, 4),
        ("mlx-distributed", 1, 2),
        # MPI without it: numNodes sets the workers alone.
        ("sim-openmpi", None, 1),
        ("sim-openmpi", 3, 3),
        # No job labelled trainer: no PodSet for numNodes to set; the `node` job's parallelism stays.
        ("sim-unlabelled-node", None, 2),
        ("sim-unlabelled-node", 8, 2),
    ],
)
def test_node_count_as_the_controller_computes_it(runtime: str, num_nodes: int | None, nodes: int) -> None:
    trainer = {} if num_nodes is None else {"numNodes": num_nodes}
    assert requested_nodes(job(trainer=trainer), runtime_facts(cluster_runtime(runtime))) == nodes


def test_training_step_of_odd_runtimes() -> None:
    assert runtime_facts(cluster_runtime("sim-unlabelled-node")).training == FALLBACK_TRAINING
    assert runtime_facts(cluster_runtime("sim-openmpi")).training == MPI
    # resourcesPerNode is not merged into an unlabelled trainer (no trainer ancestor, not MPI).
    assert not runtime_facts(cluster_runtime("sim-unlabelled-node")).merges_job_resources


def test_runtime_without_ml_policy_runs_its_parallelism_and_ignores_resources_per_node() -> None:
    tpu, cpu = plain_runtimes()
    assert runtime_facts(tpu) == RuntimeFacts(
        4, (), (("google.com/tpu", 4),), merges_job_resources=False, training=TRAINER
    )
    assert runtime_facts(cpu) == RuntimeFacts(
        1, (("cpu", 2),), (), merges_job_resources=False, training=TRAINER
    )
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
    # A fraction replaces the runtime's count and is no count at all.
    fraction = {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "1500m"}}}
    assert requested_accelerators(job(trainer=fraction), torchtune, 2) == (("none", 0),)
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
        (8, (("nvidia.com/gpu.shared", 2),)),  # time-slicing's renamed GPUs
        # Intel's plugin: millicores (500 of them), memory.max (8G) and tiles are not devices.
        (9, (("gpu.intel.com/i915", 2),)),
        (10, (("gpu.intel.com/xe", 4),)),
        (11, (("none", 0),)),
        (12, (("none", 0),)),  # i915_monitoring / xe_monitoring: a monitoring pod's handle
    ],
)
def test_other_accelerator_shapes(index: int, expected: tuple[tuple[str, int], ...]) -> None:
    torch = runtime_facts(cluster_runtime("torch-distributed"))
    resources = shapes.OTHER_ACCELERATORS[index]
    assert requested_accelerators(job(trainer={"resourcesPerNode": resources}), torch, 2) == expected


def test_every_other_accelerator_shape_is_checked() -> None:
    assert len(shapes.OTHER_ACCELERATORS) == 13


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
    written = {FAILED_JOBS, REACHED_MAX_RESTARTS, FAIL_JOBSET_ACTION, controller.DEADLINE_EXCEEDED} | set(
        FOREIGN_FAILURES
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
        "nvidia.com/gpu.shared",
        "gpu.intel.com/xe",
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
    # active but not ready (pods waiting for capacity) is pending
    waiting = {"jobsStatus": [{"name": "node", "active": 1, "ready": 0}]}
    assert classify(job(status=waiting))[0] == "pending"
    # a Suspended=True condition is honoured: the resume has not taken effect yet
    not_yet = {"conditions": [cond("Suspended", reason="Suspended")], "jobsStatus": resumed["jobsStatus"]}
    assert classify(job(suspend=False, status=not_yet))[0] == "suspended"
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


def test_only_the_training_step_makes_a_job_running() -> None:
    """Finding 1 of issue 22: initializers are ready while they download, then drop to 0 while the trainer's
    pods wait for capacity: pending all along, until a training-step Job is ready."""

    def status(**jobs: dict[str, int]) -> dict[str, Any]:
        return {"jobsStatus": [{"name": name.replace("_", "-"), **counts} for name, counts in jobs.items()]}

    downloading = status(
        node={}, model_initializer={"active": 1, "ready": 1}, dataset_initializer={"succeeded": 1}
    )
    waiting = status(
        node={"active": 1}, model_initializer={"succeeded": 1}, dataset_initializer={"succeeded": 1}
    )
    training = status(node={"active": 1, "ready": 1}, model_initializer={"succeeded": 1})
    assert classify(job(status=downloading), TRAINER)[0] == "pending"
    assert classify(job(status=waiting), TRAINER)[0] == "pending"
    assert classify(job(status=training), TRAINER)[0] == "running"
    # MPI: the `node` workers ready serve sshd; the launcher's mpirun trains, once it is ready (JobSet
    # creates it only after every worker is ready: jobset v0.12.0 depends_on.go).
    workers = status(node={"active": 1, "ready": 1}, launcher={})
    assert classify(job(status=workers), MPI)[0] == "pending"
    launcher = status(node={"active": 1, "ready": 1}, launcher={"active": 1, "ready": 1})
    assert classify(job(status=launcher), MPI)[0] == "running"
    # A runtime not known: the controller's naming, node and launcher.
    assert classify(job(status=downloading))[0] == "pending"
    assert classify(job(status=training))[0] == "running"


def test_truth_reads_the_training_step_of_the_job_s_runtime() -> None:
    truth = Truth()
    truth.runtime_written(cluster_runtime("sim-openmpi"))
    ref = {"kind": "ClusterTrainingRuntime", "name": "sim-openmpi"}
    launcher = {"jobsStatus": [{"name": "launcher", "active": 1, "ready": 1}]}
    assert truth.classify(job(ref=ref, status=launcher))[0] == "running"
    truth.runtime_written(cluster_runtime("torchtune-llama3.2-1b"))
    ref = {"kind": "ClusterTrainingRuntime", "name": "torchtune-llama3.2-1b"}
    initializing = {"jobsStatus": [{"name": "dataset-initializer", "active": 1, "ready": 1}]}
    assert truth.classify(job(ref=ref, status=initializing))[0] == "pending"


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
