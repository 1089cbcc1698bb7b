"""The runtimes the simulated cluster offers: the vendored upstream ClusterTrainingRuntimes, per-namespace
TrainingRuntimes, runtimes a cluster's operators write themselves ("plain" ones without an mlPolicy, one with
a JobSet failure policy, one whose trainer job lacks the ancestor label, an MPI one whose launcher is not a
node) and synthetic benchmark runtimes, plus the ``RuntimeChoice`` a TrainJob is pointed at: what the
workload generator needs to know of a runtime to play its controller.

Split from ``sim/kubesim/trainer/shapes.py`` because reading manifests from disk and describing a runtime is a
different job from building TrainJobs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

import yaml

from kubesim.trainer.jobset import JobSetSpec, jobset_spec
from kubesim.trainer.kinds import TRAINER_GROUP, TRAINER_VERSION
from kubesim.trainer.manifests import EXAMPLES_DIR, RUNTIMES_DIR

API_VERSION: Final = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
CLUSTER_KIND: Final = "ClusterTrainingRuntime"
NAMESPACED_KIND: Final = "TrainingRuntime"
ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL: Final = "trainer.kubeflow.org/framework"
# kubeflow/trainer v2.3.0 pkg/constants/constants.go: ancestor step values and the MPI job names.
TRAINER_STEP: Final = "trainer"
INITIALIZER_STEPS: Final = ("dataset-initializer", "model-initializer")
NODE: Final = "node"
LAUNCHER: Final = "launcher"
# Device resources a runtime's trainer container may ask for by itself (has_gpu: a job may then override
# them with 0).
_DEVICE_PREFIXES: Final = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe")
# How often a job of a runtime fails once its JobSet runs: most runtimes are sound, a few are flaky.
FAILURE_RATE: Final = 0.1
_FLAKY: Final = {"sim-torch-restartable": 0.55, "sim-unlabelled-node": 0.25}
IMAGES: Final = (
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
    "python:3.11-slim",
    "ghcr.io/flux-framework/tutorials:gpu-lammps-hwloc",
    "nvcr.io/nvidia/jax:25.10-py3",
)


@dataclass(frozen=True, slots=True)
class RuntimeChoice:
    """A runtime TrainJobs may reference, with what the generator needs to play the controller for them."""

    kind: str
    namespace: str  # "" for ClusterTrainingRuntime
    name: str
    replicated_jobs: tuple[str, ...]  # names, in template order
    initializers: tuple[str, ...]  # replicated jobs labelled as an initializer step
    training: frozenset[str]  # the training step: ancestor ``trainer``; MPI: ``launcher`` alone
    template: JobSetSpec  # the JobSet its template makes
    scaled_job: str | None  # the replicated job spec.trainer.numNodes sets (None: numNodes is ignored)
    launcher_as_node: bool  # MPI runLauncherAsNode: the launcher is a node, ``node`` gets numNodes-1
    max_nodes: int | None  # the webhook refuses more (torchtune: 1)
    pod_failure_policy: (
        bool  # its trainer Job fails fast on a non-retryable exit code (reason PodFailurePolicy)
    )
    has_gpu: bool  # the trainer container requests devices itself
    failure_rate: float  # share of its jobs that fail once running (a simulation choice, not upstream's)
    weight: float

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.namespace, self.name

    @property
    def ref_label(self) -> str:
        """The runtime_ref label of a TrainJob that references this runtime."""
        return f"{TRAINER_GROUP}/{self.kind}/{self.namespace}/{self.name}"


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.load_all(handle, Loader=loader) if isinstance(doc, dict)]


@lru_cache(maxsize=1)
def _cluster_runtime_docs() -> tuple[dict[str, Any], ...]:
    paths = sorted(p for p in RUNTIMES_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")
    paths += [
        EXAMPLES_DIR / "flux" / "flux-runtime.yaml",
        EXAMPLES_DIR / "yaml" / "04-volcano-integration.yaml",
    ]
    docs = [doc for path in paths for doc in _yaml_docs(path)]
    return tuple(doc for doc in docs if doc.get("kind") == CLUSTER_KIND)


@lru_cache(maxsize=1)
def _namespaced_runtime_docs() -> tuple[dict[str, Any], ...]:
    """Per-namespace TrainingRuntimes: the multi-step example's runtime and a copy of torch-distributed."""
    docs = [
        doc
        for doc in _yaml_docs(EXAMPLES_DIR / "yaml" / "05-multi-step.yaml")
        if doc["kind"] == NAMESPACED_KIND
    ]
    torch = next(doc for doc in _cluster_runtime_docs() if doc["metadata"]["name"] == "torch-distributed")
    docs.append({**copy.deepcopy(torch), "kind": NAMESPACED_KIND})
    return tuple(docs)


def cluster_runtimes() -> list[dict[str, Any]]:
    """The real ClusterTrainingRuntimes (upstream manifests plus the flux and volcano examples)."""
    return copy.deepcopy(list(_cluster_runtime_docs()))


def namespaced_runtimes(namespace: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(list(_namespaced_runtime_docs()))
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs


def synthetic_runtime(index: int, namespace: str | None) -> dict[str, Any]:
    """A benchmark runtime: torch-like, with varied mlPolicy.numNodes and trainer GPUs."""
    ml_policy: dict[str, Any] = {("torch", "jax", "xgboost")[index % 3]: {}}
    num_nodes = (None, 1, 2, 4)[index % 4]
    if num_nodes is not None:
        ml_policy["numNodes"] = num_nodes
    container: dict[str, Any] = {"name": "node", "image": IMAGES[index % 2]}
    gpus = (0, 1, 2, 8)[(index // 4) % 4]
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    metadata: dict[str, Any] = {"name": f"bench-rt-{index:05d}", "labels": {FRAMEWORK_LABEL: "torch"}}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": CLUSTER_KIND if namespace is None else NAMESPACED_KIND,
        "metadata": metadata,
        "spec": {
            "mlPolicy": ml_policy,
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {"template": {"spec": {"containers": [container]}}},
                            },
                        }
                    ]
                }
            },
        },
    }


def plain_runtimes() -> list[dict[str, Any]]:
    """ClusterTrainingRuntimes without an mlPolicy ("plain ML"), the torch-distributed template otherwise:
    the controller runs their trainer job's ``parallelism`` nodes (default 1) and does not merge a
    TrainJob's resourcesPerNode into them. One asks for TPUs in its node container, one is CPU-only with
    no parallelism set."""
    torch = next(doc for doc in _cluster_runtime_docs() if doc["metadata"]["name"] == "torch-distributed")
    docs = []
    for name, parallelism, resources in (
        ("sim-plain-tpu", 4, {"limits": {"google.com/tpu": 4}}),
        ("sim-plain-cpu", None, {"requests": {"cpu": "2"}}),
    ):
        doc = copy.deepcopy(torch)
        doc["metadata"] = {"name": name, "labels": {FRAMEWORK_LABEL: "plain"}}
        del doc["spec"]["mlPolicy"]
        job = doc["spec"]["template"]["spec"]["replicatedJobs"][0]
        if parallelism is not None:
            job["template"]["spec"]["parallelism"] = parallelism
        job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
        docs.append(doc)
    return docs


def operator_runtimes() -> list[dict[str, Any]]:
    """ClusterTrainingRuntimes a cluster's operators write themselves, each for a rule of the controller the
    upstream runtimes do not exercise:

    - ``sim-torch-restartable``: torch-distributed with a JobSet failure policy (restart up to twice, fail at
      once on a Job that failed by its pod failure policy) and a trainer Job whose exit code 42 is not
      retried: its failures are ``ReachedMaxRestarts`` and ``FailJobSetFailurePolicyAction``, never
      ``FailedJobs`` (jobset v0.12.0 pkg/controllers/failure_policy.go);
    - ``sim-unlabelled-node``: torch-distributed whose ``node`` job lacks the ancestor label, 2 pods: the
      controller finds no trainer PodSet, so spec.trainer.numNodes is ignored (kubeflow/trainer v2.3.0
      plugins/torch/torch.go FindPodSetByAncestor);
    - ``sim-openmpi``: deepspeed-distributed with runLauncherAsNode off and ``node`` as the labelled trainer:
      numNodes sets the ``node`` workers alone (plugins/mpi/mpi.go EnforceMLPolicy).
    """
    torch = next(doc for doc in _cluster_runtime_docs() if doc["metadata"]["name"] == "torch-distributed")
    restartable = copy.deepcopy(torch)
    restartable["metadata"] = {"name": "sim-torch-restartable", "labels": {FRAMEWORK_LABEL: "torch"}}
    template = restartable["spec"]["template"]["spec"]
    template["failurePolicy"] = {
        "maxRestarts": 2,
        "rules": [
            {"name": "fail-on-bad-exit", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
        ],
    }
    job_spec = template["replicatedJobs"][0]["template"]["spec"]
    job_spec["backoffLimit"] = 3
    job_spec["podFailurePolicy"] = {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": NODE, "operator": "In", "values": [42]}}
        ]
    }
    job_spec["template"]["spec"]["restartPolicy"] = "Never"  # a pod failure policy requires it

    unlabelled = copy.deepcopy(torch)
    unlabelled["metadata"] = {"name": "sim-unlabelled-node", "labels": {FRAMEWORK_LABEL: "torch"}}
    job = unlabelled["spec"]["template"]["spec"]["replicatedJobs"][0]
    del job["template"]["metadata"]
    job["template"]["spec"]["parallelism"] = 2

    deepspeed = next(
        doc for doc in _cluster_runtime_docs() if doc["metadata"]["name"] == "deepspeed-distributed"
    )
    openmpi = copy.deepcopy(deepspeed)
    openmpi["metadata"] = {"name": "sim-openmpi", "labels": {FRAMEWORK_LABEL: "mpi"}}
    openmpi["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    for replicated in openmpi["spec"]["template"]["spec"]["replicatedJobs"]:
        labels = {ANCESTOR_LABEL: TRAINER_STEP} if replicated["name"] == NODE else None
        if labels:
            replicated["template"]["metadata"] = {"labels": labels}
        else:
            replicated["template"].pop("metadata", None)
    return [restartable, unlabelled, openmpi]


def runtime_choice(runtime: dict[str, Any], weight: float) -> RuntimeChoice:
    """What the controller makes of ``runtime`` (kubeflow/trainer v2.3.0):

    - training step: the replicated jobs labelled ancestor ``trainer`` (pkg/runtime/runtime.go
      FindPodSetByAncestor); under MPI the ``launcher`` alone (plugins/mpi/mpi.go: it runs mpirun over the
      ``node`` hosts, which only serve sshd, and dependsOn them Ready); a runtime labelling none trains on
      ``node``/``launcher`` by name;
    - numNodes (pkg/runtime/core/trainingruntime.go newRuntimeInfo, then EnforceMLPolicy): the torch, jax,
      xgboost and plainml plugins set the ancestor-``trainer`` PodSet, MPI the PodSet named ``node`` (to
      numNodes-1, at least 1, with runLauncherAsNode); without such a PodSet numNodes changes nothing;
    - the validating webhook: torchtune runtimes take at most 1 node (plugins/torch/torchtune.go).
    """
    meta = runtime.get("metadata") or {}
    spec = runtime.get("spec") or {}
    template_spec = (spec.get("template") or {}).get("spec") or {}
    jobs = [
        job for job in template_spec.get("replicatedJobs") or [] if isinstance(job, dict) and job.get("name")
    ]
    names = tuple(str(job["name"]) for job in jobs) or (NODE,)
    steps = {str(job["name"]): _ancestor(job) for job in jobs}
    ml_policy = spec.get("mlPolicy") or {}
    mpi = ml_policy.get("mpi") if isinstance(ml_policy, dict) else None
    labelled = [name for name in names if steps.get(name) == TRAINER_STEP]
    training = {LAUNCHER} if isinstance(mpi, dict) else set(labelled)
    if not training:
        training = {name for name in names if name in (NODE, LAUNCHER)} or {names[-1]}
    # The PodSet numNodes sets: MPI's ``node`` by name, else the first job labelled as the trainer.
    mpi_node = NODE if NODE in names else None
    scaled = mpi_node if isinstance(mpi, dict) else (labelled[0] if labelled else None)
    framework = str((meta.get("labels") or {}).get(FRAMEWORK_LABEL, ""))
    return RuntimeChoice(
        kind=str(runtime.get("kind")),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name")),
        replicated_jobs=names,
        initializers=tuple(name for name in names if steps.get(name) in INITIALIZER_STEPS),
        training=frozenset(training),
        template=jobset_spec(template_spec),
        scaled_job=scaled,
        launcher_as_node=isinstance(mpi, dict) and mpi.get("runLauncherAsNode") is True,
        max_nodes=1 if framework == "torchtune" else None,
        pod_failure_policy=any(
            isinstance(job.get("template"), dict)
            and isinstance((job["template"].get("spec") or {}).get("podFailurePolicy"), dict)
            for job in jobs
        ),
        has_gpu=_requests_devices(jobs),
        failure_rate=_FLAKY.get(str(meta.get("name")), FAILURE_RATE),
        weight=weight,
    )


def _ancestor(job: dict[str, Any]) -> str | None:
    labels = ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(ANCESTOR_LABEL)
    return value if isinstance(value, str) else None


def _requests_devices(jobs: list[dict[str, Any]]) -> bool:
    for job in jobs:
        pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers") or []:
            resources = container.get("resources") or {}
            names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
            if container.get("name") == NODE and any(n.startswith(_DEVICE_PREFIXES) for n in names):
                return True
    return False
