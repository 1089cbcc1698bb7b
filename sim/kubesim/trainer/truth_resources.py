"""The truth's reading of what one TrainJob requests and runs: node count, accelerators (devices in whole
counts), with the runtime's trainer container merged in as the controller merges it, and which replicated
jobs are its training step.

Split from ``sim/kubesim/trainer/truth.py``: resource arithmetic (docs/design/trainer-domain.md §1-§3,
docs/design/product.md §3 accelerators) is its own concern, apart from job states and the running tally.
Independent of ``app/trainer`` on purpose, like the rest of the truth, and of the generator's controller
model (``controller.py``, ``shapes_runtimes.py``): two readings of the same documents.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from fractions import Fraction
from typing import Any, Final

from kubesim.trainer.truth_rules import FALLBACK_TRAINING, as_dict, as_list

NO_ACCELERATOR: Final = "none"
# The service's default cap on distinct accelerator classes; not modelled, like MAX_REASON_NAMES in
# truth_rules: the generator writes fewer distinct classes (a test checks).
MAX_ACCELERATOR_CLASSES: Final = 32
# docs/design/product.md §3: accelerators are *device* resources matching these patterns (the default of
# the service's setting): NVIDIA GPUs, shared GPUs (time-slicing's gpu.shared) and MIG slices, AMD, Intel
# GPUs (i915, xe: not the plugin's millicores, memory.max, tiles, *_monitoring), Google TPU, Habana Gaudi,
# AWS Neuron.
ACCELERATOR_PATTERNS: Final = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-*",
    "amd.com/gpu",
    "gpu.intel.com/i915",
    "gpu.intel.com/xe",
    "google.com/tpu",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron",
    "aws.amazon.com/neuroncore",
    "aws.amazon.com/neurondevice",
)
# A valid quantity that is not a number of devices (a size, a share, a fraction):
# docs/design/trainer-domain.md §1, "a quantity that is not a whole count (8G, 500m) is never a device
# count". Kept in a resource map so that it still replaces the runtime's value of that name when resources
# merge.
NOT_A_COUNT: Final = -1
TRAINER_STEP: Final = "trainer"
INITIALIZER_STEPS: Final = frozenset({"dataset-initializer", "model-initializer"})

Quantities = tuple[tuple[str, int], ...]  # (resource name, device count or NOT_A_COUNT), sorted by name


@dataclass(frozen=True, slots=True)
class RuntimeFacts:
    """What the rules need from one runtime: the node count of a TrainJob that sets no numNodes (and
    whether numNodes changes it), the trainer ``node`` container's resources, which a TrainJob's
    resourcesPerNode is merged into, and the replicated jobs of its training step."""

    default_nodes: int
    requests: Quantities = ()
    limits: Quantities = ()
    merges_job_resources: bool = True  # False: the controller ignores the job's resourcesPerNode
    num_nodes_applies: bool = True  # False: no PodSet for numNodes to set (no job labelled trainer)
    launcher_as_node: bool = False  # MPI runLauncherAsNode: the launcher is a node beside max(n-1, 1) workers
    training: frozenset[str] = FALLBACK_TRAINING

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


_UNIT: Final = re.compile(r"[A-Za-z]+$")
_EXPONENT: Final = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def device_count(value: Any) -> int | None:
    """The number of devices a quantity asks for: a whole number written without a unit (8, "8", "4e0",
    negatives count 0); NOT_A_COUNT for a valid quantity that is a size, a share or a fraction ("8G",
    "16Gi", "500m", "1.5"); None when it is not a quantity at all."""
    if type(value) is int:
        return max(value, 0)
    if isinstance(value, str) and value.isdigit():  # the common case, without Fraction
        return int(value)
    parsed = parse_quantity(value)
    if parsed is None:
        return None
    if isinstance(value, str) and _UNIT.search(value.strip()) and not _EXPONENT.fullmatch(value.strip()):
        return NOT_A_COUNT
    if parsed.denominator != 1:
        return NOT_A_COUNT
    return max(int(parsed), 0)


def is_accelerator(name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in ACCELERATOR_PATTERNS)


def quantities(section: Any) -> dict[str, int]:
    """A requests or limits map as device counts (NOT_A_COUNT for sizes, shares and fractions); entries
    that are no quantity are left out."""
    out: dict[str, int] = {}
    if isinstance(section, dict):
        for name, value in section.items():
            count = device_count(value)
            if isinstance(name, str) and count is not None:
                out[name] = count
    return out


def _accelerators(requests: Mapping[str, int], limits: Mapping[str, int]) -> list[tuple[str, int]]:
    """(class, per-node count) of every accelerator a container requests: per resource, its request, or
    its limit when it has no request (the API server copies a missing request from the limit); 0, and a
    quantity that is not a count, is none."""
    found = []
    for name in sorted(set(requests) | set(limits)):
        count = requests[name] if name in requests else limits[name]
        if count > 0 and is_accelerator(name):
            found.append((name, count))
    return found


def runtime_facts(runtime: Mapping[str, Any]) -> RuntimeFacts:
    """Node count, trainer container and training step of a (Cluster)TrainingRuntime object, read as the
    documents say the Trainer controller reads them (docs/design/trainer-domain.md §1-§3):

    - training step: the replicated jobs labelled ancestor ``trainer``; under MPI the ``launcher`` alone (the
      ``node`` workers serve sshd to its mpirun); a runtime labelling none (not MPI) trains on ``node`` and
      ``launcher`` by name; a job labelled as an initializer step never;
    - nodes: the PodSet numNodes sets is the first job labelled ``trainer`` (MPI: the job named ``node``); its
      count without numNodes is mlPolicy.numNodes (default 1) when it carries the label and the runtime has
      an mlPolicy, else its template's parallelism (default 1), at least 1. A runtime with no such PodSet
      keeps its ``node`` job's count whatever numNodes says. MPI with runLauncherAsNode runs numNodes-1 (at
      least 1) workers plus the launcher as a node;
    - resources: the ``node`` container of the first replicated job named ``node`` or labelled ``trainer``;
      a job's resourcesPerNode is merged into it only for a runtime with an mlPolicy, when that job carries
      the label or (MPI with runLauncherAsNode) is named ``node``.
    """
    spec = as_dict(runtime.get("spec"))
    ml_policy = spec.get("mlPolicy")
    mpi_policy = as_dict(ml_policy).get("mpi")
    mpi = isinstance(mpi_policy, dict)
    jobs = [
        as_dict(job)
        for job in as_list(as_dict(as_dict(spec.get("template")).get("spec")).get("replicatedJobs"))
    ]
    labelled = [job for job in jobs if _ancestor(job) == TRAINER_STEP]
    named = [job for job in jobs if job.get("name") == "node"]
    launcher_as_node = mpi and as_dict(mpi_policy).get("runLauncherAsNode") is True
    launcher_as_node = launcher_as_node and any(job.get("name") == "launcher" for job in jobs)
    scaled = (named[0] if named else None) if mpi else (labelled[0] if labelled else None)
    counted = scaled if scaled is not None else (named[0] if named else None)
    default_nodes = 1
    if counted is not None:
        if ml_policy is not None and counted in labelled:
            value = as_dict(ml_policy).get("numNodes", 1)
        else:
            value = as_dict(as_dict(counted.get("template")).get("spec")).get("parallelism", 1)
        if isinstance(value, int) and not isinstance(value, bool):
            default_nodes = max(value, 1)
    container_job = next((job for job in jobs if job in labelled or job in named), None)
    merges = (
        container_job is not None
        and ml_policy is not None
        and (
            container_job in labelled
            or (container_job in named and as_dict(mpi_policy).get("runLauncherAsNode") is True)
        )
    )
    requests: Quantities = ()
    limits: Quantities = ()
    for container in as_list(_pod_spec(container_job).get("containers")):
        if as_dict(container).get("name") == "node":
            resources = as_dict(as_dict(container).get("resources"))
            requests = tuple(sorted(quantities(resources.get("requests")).items()))
            limits = tuple(sorted(quantities(resources.get("limits")).items()))
            break
    return RuntimeFacts(
        default_nodes,
        requests,
        limits,
        merges_job_resources=merges,
        num_nodes_applies=scaled is not None,
        launcher_as_node=launcher_as_node,
        training=_training_step(jobs, mpi),
    )


def _pod_spec(job: Mapping[str, Any] | None) -> dict[str, Any]:
    template = as_dict(as_dict(job).get("template")) if job is not None else {}
    return as_dict(as_dict(as_dict(template.get("spec")).get("template")).get("spec"))


def _training_step(jobs: list[dict[str, Any]], mpi: bool) -> frozenset[str]:
    names = {str(job.get("name")) for job in jobs if _ancestor(job) == TRAINER_STEP}
    initializers = {str(job.get("name")) for job in jobs if _ancestor(job) in INITIALIZER_STEPS}
    if mpi:
        return frozenset({"launcher"})
    if not names:
        names = set(FALLBACK_TRAINING)
    return frozenset(names - initializers)


def _ancestor(job: Mapping[str, Any]) -> Any:
    labels = as_dict(as_dict(as_dict(job.get("template")).get("metadata")).get("labels"))
    return labels.get("trainer.kubeflow.org/trainjob-ancestor-step")


def requested_nodes(job: Mapping[str, Any], runtime: RuntimeFacts | None) -> int:
    """The training nodes: spec.trainer.numNodes where the runtime lets it set a PodSet (an explicit 0
    stays 0; MPI with runLauncherAsNode: numNodes-1 workers, at least 1, plus the launcher), else the
    runtime's own count; 1 when the runtime is not known."""
    value = as_dict(as_dict(job.get("spec")).get("trainer")).get("numNodes")
    num_nodes = value if isinstance(value, int) and not isinstance(value, bool) else None
    if runtime is None:
        return 1 if num_nodes is None else num_nodes
    count = runtime.default_nodes
    if num_nodes is not None and runtime.num_nodes_applies:
        count = max(num_nodes - 1, 1) if runtime.launcher_as_node else num_nodes
    return count + 1 if runtime.launcher_as_node else count


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
