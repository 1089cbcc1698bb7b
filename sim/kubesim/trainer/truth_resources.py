"""The truth's reading of what one TrainJob requests: node count and accelerators, with the runtime's
trainer container merged in as the controller merges it, and Kubernetes quantities parsed exactly.

Split from ``sim/kubesim/trainer/truth.py``: resource arithmetic (docs/design/trainer-domain.md §2-§3,
docs/design/product.md §3 accelerators) is its own concern, apart from job states and the running tally.
Independent of ``app/trainer`` on purpose, like the rest of the truth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from fractions import Fraction
from typing import Any, Final

from kubesim.trainer.truth_rules import as_dict, as_list

NO_ACCELERATOR: Final = "none"
# The service's default cap on distinct accelerator classes; not modelled, like MAX_REASON_NAMES in
# truth_rules: the generator writes fewer distinct classes (a test checks).
MAX_ACCELERATOR_CLASSES: Final = 32
# docs/design/product.md §3: accelerators are resource names matching these patterns (the default of the
# service's setting): NVIDIA GPUs and MIG slices, AMD, Intel GPUs, Google TPU, Habana Gaudi, AWS Neuron.
ACCELERATOR_PATTERNS: Final = (
    "nvidia.com/gpu",
    "nvidia.com/mig-*",
    "amd.com/gpu",
    "gpu.intel.com/*",
    "google.com/tpu",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron*",
)

Quantities = tuple[tuple[str, int], ...]  # (resource name, whole units rounded up), sorted by name


@dataclass(frozen=True, slots=True)
class RuntimeFacts:
    """What the rules need from one runtime: the node count a TrainJob without numNodes gets, and the
    trainer ``node`` container's resources, which a TrainJob's resourcesPerNode is merged into."""

    default_nodes: int
    requests: Quantities = ()
    limits: Quantities = ()
    merges_job_resources: bool = True  # False: the controller ignores the job's resourcesPerNode

    def accelerators(self) -> list[tuple[str, int]]:
        """The accelerators the runtime's trainer container requests by itself."""
        return _accelerators(dict(self.requests), dict(self.limits))


_BINARY_SUFFIXES: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes resource.Quantity as an exact fraction; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value) if math.isfinite(value) else None
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    for suffix, factor in _BINARY_SUFFIXES.items():
        if text.endswith(suffix):
            number = _parse_decimal(text[: -len(suffix)])
            return None if number is None else number * factor
    if text[-1] in _DECIMAL_SUFFIXES:
        number = _parse_decimal(text[:-1])
        return None if number is None else number * _DECIMAL_SUFFIXES[text[-1]]
    return _parse_decimal(text)  # plain number, possibly with an e/E exponent


def _parse_decimal(text: str) -> Fraction | None:
    if not text or text[-1] in "eE+-":
        return None
    try:
        return Fraction(text)  # accepts "1.5", "1e3", "+2", ".5"
    except (ValueError, ZeroDivisionError):
        return None


def quantity_value(value: Any) -> int | None:
    """Integer value of a quantity, rounded up like Go's ``Quantity.Value()``; None when unparsable."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit():  # the common case, without Fraction
        return int(value)
    parsed = parse_quantity(value)
    return None if parsed is None else math.ceil(parsed)


def is_accelerator(name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in ACCELERATOR_PATTERNS)


def quantities(section: Any) -> dict[str, int]:
    """A requests or limits map as whole units (rounded up); entries that do not parse are left out."""
    out: dict[str, int] = {}
    if isinstance(section, dict):
        for name, value in section.items():
            count = quantity_value(value)
            if isinstance(name, str) and count is not None:
                out[name] = count
    return out


def _accelerators(requests: Mapping[str, int], limits: Mapping[str, int]) -> list[tuple[str, int]]:
    """(class, per-node count) of every accelerator a container requests: per resource, its request, or
    its limit when it has no request (the API server copies a missing request from the limit); 0 is none."""
    found = []
    for name in sorted(set(requests) | set(limits)):
        count = requests[name] if name in requests else limits[name]
        if count > 0 and is_accelerator(name):
            found.append((name, count))
    return found


def runtime_facts(runtime: Mapping[str, Any]) -> RuntimeFacts:
    """Default node count and trainer container of a (Cluster)TrainingRuntime object, read as the Trainer
    controller reads them (docs/design/trainer-domain.md §2 numNodes resolution, §3 resources):

    - nodes: the trainer job (labelled ancestor ``trainer``, else named ``node``) runs mlPolicy.numNodes
      (default 1) when it carries the label and the runtime has an mlPolicy, else its template's
      parallelism (default 1);
    - resources: the ``node`` container of the first replicated job named ``node`` or labelled ``trainer``;
      a job's resourcesPerNode is merged into it only for a runtime with an mlPolicy, when that job carries
      the label or (MPI with runLauncherAsNode) is named ``node``.
    """
    spec = as_dict(runtime.get("spec"))
    ml_policy = spec.get("mlPolicy")
    jobs = [
        as_dict(job)
        for job in as_list(as_dict(as_dict(spec.get("template")).get("spec")).get("replicatedJobs"))
    ]
    labelled = [job for job in jobs if _ancestor(job) == "trainer"]
    named = [job for job in jobs if job.get("name") == "node"]
    default_nodes = 1
    trainer = labelled[0] if labelled else named[0] if named else None
    if trainer is not None:
        if ml_policy is not None and trainer in labelled:
            value = as_dict(ml_policy).get("numNodes")
        else:
            value = as_dict(as_dict(trainer.get("template")).get("spec")).get("parallelism")
        if isinstance(value, int) and not isinstance(value, bool):
            default_nodes = value
    container_job = next((job for job in jobs if job in labelled or job in named), None)
    if container_job is None:
        return RuntimeFacts(default_nodes, merges_job_resources=False)
    mpi = as_dict(as_dict(ml_policy).get("mpi"))
    merges = ml_policy is not None and (
        container_job in labelled or (container_job in named and mpi.get("runLauncherAsNode") is True)
    )
    pod_spec = as_dict(
        as_dict(as_dict(as_dict(container_job.get("template")).get("spec")).get("template")).get("spec")
    )
    for container in as_list(pod_spec.get("containers")):
        if as_dict(container).get("name") == "node":
            resources = as_dict(as_dict(container).get("resources"))
            return RuntimeFacts(
                default_nodes,
                tuple(sorted(quantities(resources.get("requests")).items())),
                tuple(sorted(quantities(resources.get("limits")).items())),
                merges,
            )
    return RuntimeFacts(default_nodes, merges_job_resources=merges)


def _ancestor(job: Mapping[str, Any]) -> Any:
    labels = as_dict(as_dict(as_dict(job.get("template")).get("metadata")).get("labels"))
    return labels.get("trainer.kubeflow.org/trainjob-ancestor-step")


def requested_nodes(job: Mapping[str, Any], runtime: RuntimeFacts | None) -> int:
    """spec.trainer.numNodes, else the runtime's default node count, else 1; an explicit 0 stays 0."""
    num_nodes = as_dict(as_dict(job.get("spec")).get("trainer")).get("numNodes")
    if isinstance(num_nodes, int) and not isinstance(num_nodes, bool):
        return num_nodes
    if runtime is not None:
        return runtime.default_nodes
    return 1


def requested_accelerators(
    job: Mapping[str, Any], runtime: RuntimeFacts | None, nodes: int
) -> tuple[tuple[str, int], ...]:
    """(accelerator class, per-node count * nodes) for every class the job's trainer nodes request, or
    (("none", 0),). Per-node resources: the runtime's trainer container with the job's resourcesPerNode
    merged in (requests into requests, limits into limits, name by name, the job's value winning), when
    the runtime takes it; the job's resourcesPerNode alone when the runtime is not known."""
    override = as_dict(as_dict(as_dict(job.get("spec")).get("trainer")).get("resourcesPerNode"))
    if runtime is None:
        requests, limits = quantities(override.get("requests")), quantities(override.get("limits"))
    else:
        requests, limits = dict(runtime.requests), dict(runtime.limits)
        if runtime.merges_job_resources:
            requests.update(quantities(override.get("requests")))
            limits.update(quantities(override.get("limits")))
    found = _accelerators(requests, limits)
    if not found:
        return ((NO_ACCELERATOR, 0),)
    return tuple((name, count * nodes) for name, count in found)
