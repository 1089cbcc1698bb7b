"""Issue 22, finding 2: accelerators are device resources only, counted in whole numbers.

Intel's GPU device plugin advertises its devices as ``gpu.intel.com/i915`` and ``gpu.intel.com/xe``, with
``i915_monitoring`` / ``xe_monitoring`` handles that give a monitoring pod every GPU; its NFD hook labels
nodes with ``gpu.intel.com/millicores`` (GPU count x 1000, a share of a GPU), ``gpu.intel.com/memory.max``
(bytes of GPU memory) and ``gpu.intel.com/tiles``, which NFD promotes to extended resources for GPU Aware
Scheduling (intel/intel-device-plugins-for-kubernetes, cmd/gpu_plugin and cmd/gpu_nfdhook). The default
pattern ``gpu.intel.com/*`` counted all of them: ``memory.max: 8G`` as 8e9 accelerators per node (refused by
the quantity ceiling, a limit hit), ``millicores: 500`` as 500. NVIDIA's time-slicing with ``renameByDefault``
advertises ``nvidia.com/gpu.shared`` instead of ``nvidia.com/gpu``, which was not counted. And a quantity
that is not a whole count (``8G``, ``500m``, ``1.5``) is never a number of devices, whatever its name.
"""

from __future__ import annotations

import pytest

from app.trainer import rules
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from tests.support.sinks import RecordingSink
from tests.trainer.manifests import Clock, runtime, trainjob

# (resource name, is a device the default patterns count)
RESOURCES: list[tuple[str, bool]] = [
    ("gpu.intel.com/i915", True),
    ("gpu.intel.com/xe", True),
    ("gpu.intel.com/millicores", False),
    ("gpu.intel.com/memory.max", False),
    ("gpu.intel.com/tiles", False),
    ("gpu.intel.com/i915_monitoring", False),
    ("gpu.intel.com/xe_monitoring", False),
    ("nvidia.com/gpu", True),
    ("nvidia.com/gpu.shared", True),
    ("nvidia.com/mig-1g.10gb", True),
    ("amd.com/gpu", True),
    ("google.com/tpu", True),
    ("habana.ai/gaudi", True),
    ("aws.amazon.com/neuron", True),
    ("aws.amazon.com/neuroncore", True),
    ("aws.amazon.com/neurondevice", True),
]
NOT_COUNTS = ["8G", "16Gi", "500m", "1.5", "1k"]


@pytest.mark.parametrize(("name", "device"), RESOURCES, ids=[n for n, _ in RESOURCES])
def test_default_patterns_name_devices_only(name: str, device: bool) -> None:
    assert rules.DEFAULT_ACCELERATORS(name) is device


@pytest.mark.parametrize(("name", "device"), RESOURCES, ids=[n for n, _ in RESOURCES])
def test_a_created_job_counts_each_resource_both_ways(name: str, device: bool) -> None:
    """Through TrainerState, as a TrainJob's resourcesPerNode on torch-distributed with 2 nodes: a device
    asked in whole numbers is counted (2 per node, 4 in all); anything else is not, and is no limit hit."""
    hits: list[str] = []
    sink = RecordingSink()
    state = TrainerState(sink, clock=Clock(), on_limit=hits.append, runtime_wait_seconds=0)
    state.runtime_handler.on_added(runtime(), True)
    state.job_handler.on_added(_job("whole", {name: "2"}), False)
    for i, quantity in enumerate(NOT_COUNTS):
        state.job_handler.on_added(_job(f"size{i}", {name: quantity}), False)
    whole, *sizes = sink.created
    assert whole.accelerators == (((name, 4),) if device else (("none", 0),))
    assert [e.accelerators for e in sizes] == [(("none", 0),)] * len(NOT_COUNTS)
    assert all(e.accelerators_observed for e in sink.created)
    assert hits == []


@pytest.mark.parametrize(
    ("name", "quantity", "counted"),
    [
        ("gpu.intel.com/memory.max", "8G", None),  # bytes: never devices, even matched
        ("gpu.intel.com/memory.max", "8589934592", 8589934592),  # a plain number is a count, if one asks
        ("gpu.intel.com/millicores", "500", 500),
        ("gpu.intel.com/millicores", "500m", None),
        ("gpu.intel.com/tiles", "2", 2),
        ("gpu.intel.com/i915", "1", 1),
    ],
)
def test_a_broad_pattern_still_counts_only_whole_numbers(
    name: str, quantity: str, counted: int | None
) -> None:
    """Who sets ``gpu.intel.com/*`` (accelerator_resource_patterns) asks for Intel's other resources: a plain
    number of them is counted as asked, a size or share never is."""
    broad = rules.AcceleratorMatcher(["gpu.intel.com/*"])
    resources, malformed = rules.node_resources({name: quantity}, None)
    assert not malformed
    assert broad.per_node(resources) == (() if counted is None else ((name, counted),))


@pytest.mark.parametrize("quantity", NOT_COUNTS)
def test_a_size_overrides_the_runtime_device_count(quantity: str) -> None:
    """The runtime's ``nvidia.com/gpu: 2`` (torchtune) merged with a TrainJob's ``nvidia.com/gpu: <size>``:
    the TrainJob's value wins the merge (MergeResourceRequirements), and it is no count of devices (the pod
    would be refused: extended resources must be integers)."""
    base, _ = rules.node_resources(None, {"nvidia.com/gpu": 2})
    override, _ = rules.node_resources(None, {"nvidia.com/gpu": quantity})
    assert rules.DEFAULT_ACCELERATORS.per_node(rules.merge_resources(base, override)) == ()


def _job(name: str, requests: dict[str, str]) -> TrainJobProjection:
    return trainjob(
        name,
        {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": requests}},
        },
    )
