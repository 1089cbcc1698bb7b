"""The pods of one TrainJob's JobSet, per replicated job: how many each child Job runs and their containers,
as the Trainer controller builds the JobSet from the runtime and the TrainJob (pure).

Follows kubeflow/trainer v2.3.0 (tag commit 658725bd):

- ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo: a replicated job runs its template's
  ``parallelism`` pods (default 1), or ``mlPolicy.numNodes`` (default 1) when it is labelled
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` and the runtime has an mlPolicy; the TrainJob's
  ``spec.trainer.resourcesPerNode`` is merged (MergeResourceRequirements: name by name, the TrainJob's value
  winning) into the ``node`` container of that labelled job, or, MPI with runLauncherAsNode, of the job
  named ``node``;
- the ML plugins' EnforceMLPolicy (plugins/torch, plugins/mpi, ...): ``spec.trainer.numNodes`` sets the
  PodSet the runtime scales (``RuntimeChoice.scaled_job``); MPI with runLauncherAsNode runs numNodes-1 (at
  least 1) ``node`` workers beside the launcher.

A child Job's pod count is capped (``pods.MAX_PODS_PER_JOB``). Containers keep only their name, image and
resources: what the pods' readers (the exporter, the simulated dcgm-exporter) use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubesim.trainer import pods
from kubesim.trainer.shapes_runtimes import RuntimeChoice

ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_STEP: Final = "trainer"
NODE: Final = "node"


@dataclass(frozen=True, slots=True, eq=False)
class PodTemplate:
    """The pods of one replicated job's child Jobs."""

    replicated_job: str
    replicas: int  # child Jobs (``spec.replicatedJobs[].replicas``)
    pods: int  # pods per child Job (capped)
    containers: tuple[Mapping[str, Any], ...]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def merge_resources(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """trainingruntimeutil.MergeResourceRequirements: requests into requests and limits into limits, name by
    name, the override's value winning; an empty section left out."""
    out: dict[str, Any] = {}
    for section in ("requests", "limits"):
        merged = {**_dict(base.get(section)), **_dict(override.get(section))}
        if merged:
            out[section] = merged
    return out


def _container(container: Mapping[str, Any], resources: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": str(container.get("name", "")), "image": str(container.get("image", ""))}
    res = resources if resources is not None else _dict(container.get("resources"))
    if res:
        out["resources"] = {k: dict(v) for k, v in res.items() if k in ("requests", "limits") and v}
    return out


def pod_templates(
    runtime: Mapping[str, Any], trainjob: Mapping[str, Any], choice: RuntimeChoice
) -> tuple[PodTemplate, ...]:
    """The pods of every replicated job of ``runtime``'s JobSet template for ``trainjob`` (both as stored);
    ``choice`` is the generator's reading of the runtime (which job numNodes scales)."""
    spec = _dict(runtime.get("spec"))
    ml_policy = spec.get("mlPolicy")
    mpi = _dict(ml_policy).get("mpi")
    launcher_as_node = isinstance(mpi, dict) and mpi.get("runLauncherAsNode") is True
    trainer = _dict(_dict(trainjob.get("spec")).get("trainer"))
    num_nodes = trainer.get("numNodes")
    override = _dict(trainer.get("resourcesPerNode"))
    out = []
    for job in _list(_dict(_dict(spec.get("template")).get("spec")).get("replicatedJobs")):
        if not isinstance(job, dict) or not isinstance(job.get("name"), str):
            continue
        name = job["name"]
        template = _dict(job.get("template"))
        job_spec = _dict(template.get("spec"))
        ancestor = _dict(_dict(template.get("metadata")).get("labels")).get(ANCESTOR_LABEL)
        labelled = ancestor == TRAINER_STEP and isinstance(ml_policy, dict)
        count = _int(job_spec.get("parallelism"), 1)
        if labelled:
            count = _int(_dict(ml_policy).get("numNodes"), 1)
        if name == choice.scaled_job and isinstance(num_nodes, int) and not isinstance(num_nodes, bool):
            count = max(num_nodes - 1, 1) if launcher_as_node and name == NODE else num_nodes
        merges = bool(override) and (labelled or (launcher_as_node and name == NODE))
        containers = []
        for container in _list(_dict(_dict(job_spec.get("template")).get("spec")).get("containers")):
            if not isinstance(container, dict):
                continue
            resources = None
            if merges and container.get("name") == NODE:
                resources = merge_resources(_dict(container.get("resources")), override)
            containers.append(_container(container, resources))
        out.append(
            PodTemplate(
                name,
                max(_int(job.get("replicas"), 1), 0),
                pods.pod_count(count),
                tuple(containers) or ({"name": NODE, "image": ""},),
            )
        )
    return tuple(out)
