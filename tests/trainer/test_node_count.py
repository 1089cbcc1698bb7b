"""Issue 22, finding 3: the requested training nodes are the pods the controller runs for the training step.

kubeflow/trainer v2.3.0: pkg/runtime/core/trainingruntime.go newRuntimeInfo gives every replicated job a
PodSet of ``max(parallelism ?? 1, 1)`` pods, ``mlPolicy.numNodes ?? 1`` for the one labelled ancestor
``trainer`` in a runtime with an mlPolicy (pkg/runtime/runtime.go WithPodSet); then the EnforceMLPolicy
plugins apply ``spec.trainer.numNodes``: torch, jax, xgboost and plainml to the PodSet found by
``FindPodSetByAncestor(constants.AncestorTrainer)`` (nothing when there is none), MPI to the one found by
``FindPodSetByName(constants.Node)``, as ``max(numNodes-1, 1)`` with runLauncherAsNode, whose hostfile
(plugins/mpi/mpi.go buildHostFileConfigMap, isNode) lists the launcher as a host beside the ``node`` pods.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.trainer.events import JobCreated
from app.trainer.informer_projectors import CLUSTER_TRAINING_RUNTIME_PROJECTOR
from app.trainer.projection_types import RuntimeProjection, TrainJobProjection
from app.trainer.state import TrainerState
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import Clock, runtime, runtime_doc, trainjob


def _job(name: str, runtime_name: str, num_nodes: int | None, gpus: str = "1") -> TrainJobProjection:
    trainer: dict[str, Any] = {"resourcesPerNode": {"requests": {"nvidia.com/gpu": gpus}}}
    if num_nodes is not None:
        trainer["numNodes"] = num_nodes
    return trainjob(name, {"runtimeRef": {"name": runtime_name}, "trainer": trainer})


def _created(rt: RuntimeProjection, num_nodes: list[int | None]) -> list[JobCreated]:
    sink = RecordingSink()
    state = TrainerState(sink, clock=Clock(), runtime_wait_seconds=0)
    state.runtime_handler.on_added(rt, True)
    for i, n in enumerate(num_nodes):
        state.job_handler.on_added(_job(f"j{i}", rt.name, n), False)
    return sink.created


def _unlabelled(name: str, parallelism: int | None) -> RuntimeProjection:
    """``name`` with no replicated job labelled ancestor ``trainer`` (the label is optional: the webhook
    checks containers only for labelled jobs, pkg/webhooks/trainingruntime_webhook.go
    validateReplicatedJobs)."""
    obj = copy.deepcopy(runtime_doc(name))
    for rj in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        labels = rj["template"].get("metadata", {}).get("labels", {})
        if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer":
            del labels["trainer.kubeflow.org/trainjob-ancestor-step"]
            if parallelism is not None:
                rj["template"]["spec"]["parallelism"] = parallelism
    p = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    assert p is not None
    return p


@pytest.mark.parametrize("name", ["torch-distributed", "torchtune-llama3.2-1b", "jax-distributed"])
def test_without_an_ancestor_trainer_job_num_nodes_is_ignored(name: str) -> None:
    """No trainer PodSet for the plugins to size: the `node` job keeps its template's parallelism (2), a
    TrainJob's numNodes 8 changes nothing (before: 8 nodes, 8 GPUs)."""
    created = _created(_unlabelled(name, 2), [8, None, 1])
    assert [e.requested_nodes for e in created] == [2, 2, 2]
    # the resourcesPerNode is not merged either (newRuntimeInfo merges only into the ancestor-trainer job):
    # torchtune's own `limits: {nvidia.com/gpu: 2}` stay, x 2 pods
    gpus = 2 if name.startswith("torchtune") else 0
    assert [e.accelerators for e in created] == [
        (("nvidia.com/gpu", 2 * gpus),) if gpus else (("none", 0),)
    ] * 3


@pytest.mark.parametrize("name", ["deepspeed-distributed", "mlx-distributed"])
@pytest.mark.parametrize(
    ("num_nodes", "nodes"),
    [
        (1, 2),  # node: max(1-1, 1) = 1 pod, and the launcher: 2 hosts (before: 1)
        (0, 2),  # the CRD allows 0: max(-1, 1) = 1 pod, and the launcher
        (None, 2),  # no numNodes: the launcher (mlPolicy.numNodes 1) and `node` (parallelism 1)
        (2, 2),
        (4, 4),  # 3 `node` pods and the launcher
    ],
)
def test_mpi_run_launcher_as_node_counts_the_launcher(name: str, num_nodes: int | None, nodes: int) -> None:
    """manifests/base/runtimes/{deepspeed,mlx}_distributed.yaml: mpi.runLauncherAsNode true, numNodes 1, the
    launcher labelled ancestor ``trainer``, the ``node`` workers unlabelled. Both get the TrainJob's
    resourcesPerNode (newRuntimeInfo: isTrainerAncestor for the launcher, isMPILauncherAsNode for
    ``node``), so every training node requests the GPU."""
    (created,) = _created(runtime(name), [num_nodes])
    assert (created.requested_nodes, created.accelerators) == (nodes, (("nvidia.com/gpu", nodes),))


def test_mpi_without_run_launcher_as_node_counts_the_workers() -> None:
    """runLauncherAsNode false: the launcher only runs mpirun (not a host); numNodes sizes ``node``."""
    obj = copy.deepcopy(runtime_doc("deepspeed-distributed"))
    obj["metadata"]["name"] = "deepspeed-workers"
    obj["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    rt = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(obj)
    assert rt is not None
    assert [e.requested_nodes for e in _created(rt, [1, 3, None])] == [1, 3, 1]


def test_runtime_num_nodes_below_one_runs_one_pod() -> None:
    """mlPolicy.numNodes has no CRD minimum; WithPodSet keeps ``max(count, 1)`` pods."""
    rt = runtime("torch-distributed", num_nodes=0)
    assert [e.requested_nodes for e in _created(rt, [None, 3])] == [1, 3]
