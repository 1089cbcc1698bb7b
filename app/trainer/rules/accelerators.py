"""Accelerator rules: which resource names are accelerators (glob patterns), the accelerators a node's
resources amount to, and the ceilings above which a request is not believed.

Its own module because the patterns are a setting (app/config.py checks them with
``accelerator_pattern_error``) and the matcher is the one stateful helper of the rules: a memo per instance.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from app.trainer.rules.labels import _MEMO_MAX, MAX_RESOURCE_NAME, NONE
from app.trainer.rules.nodes import NodeResources

# Per accelerator class: (class, count). A job requesting none is observed once as ("none", 0).
Accelerators = tuple[tuple[str, int], ...]
NO_ACCELERATORS: Final[Accelerators] = ((NONE, 0),)


# Accelerator resource names, as glob patterns (`*` matches any run of characters, case-sensitive as
# Kubernetes resource names are). Upstream #4190 counts any name containing "gpu"; that misses TPUs,
# Gaudi, Neuron and MIG slices, and would take e.g. a "gpu-memory" resource for accelerators. This default
# names the *devices* of the device plugins in wide use, and nothing else they advertise: Intel's GPU plugin
# also offers gpu.intel.com/millicores, memory.max, tiles, i915_monitoring and xe_monitoring, which are
# shares, sizes or monitoring handles, not devices (so no `gpu.intel.com/*`). The setting
# accelerator_resource_patterns replaces it.
DEFAULT_ACCELERATOR_PATTERNS: Final = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",  # time-slicing or MPS with renameByDefault: a replica of a GPU
    "nvidia.com/mig-*",  # MIG slices under the mixed strategy, e.g. nvidia.com/mig-1g.10gb
    "amd.com/gpu",
    "gpu.intel.com/i915",  # Intel GPUs on the i915 driver
    "gpu.intel.com/xe",  # Intel GPUs on the xe driver
    "google.com/tpu",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron",  # Neuron devices (aws-neuron device plugin)
    "aws.amazon.com/neuroncore",
    "aws.amazon.com/neurondevice",
)
MAX_ACCELERATOR_PATTERNS: Final = 64
# What a pattern may contain: the characters of a resource name, and `*`.
_PATTERN: Final = re.compile(r"[-A-Za-z0-9_.*/]+")


def accelerator_pattern_error(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable accelerator pattern, or None when it is."""
    if not pattern:
        return "empty pattern"
    if len(pattern) > MAX_RESOURCE_NAME:
        return f"longer than a resource name ({MAX_RESOURCE_NAME} characters)"
    if _PATTERN.fullmatch(pattern) is None:
        return "a resource name pattern has only letters, digits, '-', '_', '.', '/' and '*'"
    if pattern.count("/") > 1:
        return "a resource name has at most one '/'"
    return None


class AcceleratorMatcher:
    """Which resource names are accelerators (``accelerator_resource_patterns``), and the accelerators a
    node container's resources amount to. Both are memoised: the names and resource lists of a cluster
    repeat across thousands of TrainJobs, so a created TrainJob costs two dict lookups here."""

    __slots__ = ("_memo", "_per_node", "_regex", "patterns")

    def __init__(self, patterns: Iterable[str] = DEFAULT_ACCELERATOR_PATTERNS) -> None:
        self.patterns = tuple(dict.fromkeys(patterns))
        for pattern in self.patterns:
            error = accelerator_pattern_error(pattern)
            if error is not None:
                raise ValueError(f"accelerator pattern {pattern[:80]!r}: {error}")
        alternatives = ("".join(".*" if p == "*" else re.escape(p) for p in re.split(r"(\*)", pattern))
                        for pattern in self.patterns)  # fmt: skip
        self._regex = re.compile("|".join(alternatives)) if self.patterns else None
        self._memo: dict[str, bool] = {}
        self._per_node: dict[NodeResources, tuple[tuple[str, int], ...]] = {}

    def __call__(self, resource_name: str) -> bool:
        """``resource_name`` matches one of the patterns."""
        hit = self._memo.get(resource_name)
        if hit is None:
            hit = self._regex is not None and self._regex.fullmatch(resource_name) is not None
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[resource_name] = hit
        return hit

    def per_node(self, resources: NodeResources) -> tuple[tuple[str, int], ...]:
        """(class, count) for each accelerator a container with ``resources`` requests, sorted by name.

        A container's request for a resource is its ``requests`` entry, else its ``limits`` entry: the API
        server defaults each missing request to its limit (kubernetes ``pkg/apis/core/v1/defaults.go``
        SetDefaults_Pod), and the scheduler and device plugins allocate by request. Per resource, not per
        list: #4190 read limits only when requests named no GPU at all, which is the same for every valid
        pod. A count of 0 requests nothing (a TrainJob overriding a GPU runtime with ``gpu: 0``), and neither
        does a quantity that is not a whole count (``8G``, ``500m``: quantity.NOT_A_COUNT), whatever its name.
        """
        hit = self._per_node.get(resources)
        if hit is None:
            requests, limits = resources
            effective = dict(limits)
            effective.update(requests)
            hit = tuple(sorted((n, count) for n, count in effective.items() if count > 0 and self(n)))
            if len(self._per_node) >= _MEMO_MAX:
                self._per_node.clear()
            self._per_node[resources] = hit
        return hit


DEFAULT_ACCELERATORS: Final = AcceleratorMatcher()


def requested_accelerators(per_node: tuple[tuple[str, int], ...], nodes: int) -> Accelerators:
    """Per accelerator class, its per-node count x nodes; ``NO_ACCELERATORS`` when none is requested.

    Every class is observed, as upstream observes each (a job asking for GPUs and MIG slices counts both).
    With 0 nodes the classes are kept, with count 0.
    """
    if not per_node:
        return NO_ACCELERATORS
    n = max(nodes, 0)
    return tuple((cls, count * n) for cls, count in per_node)


# Ceilings on what one TrainJob may request, above which its request is not believed: the job is still
# counted (created, current state) but left out of the requested-nodes and requested-accelerators
# histograms, and counted as a limit hit. A single job asking for "1e300" GPUs on 1,000 nodes would
# otherwise add 9.2e21 to requested_accelerators_sum, and so to every mean computed from it. The numbers
# are far above any real job: the largest Kubernetes clusters have ~65,000 nodes, the largest nodes a few
# dozen accelerators (devices, MIG slices or NeuronCores), the largest training runs ~100,000 GPUs.
MAX_REQUESTED_NODES: Final = 100_000
MAX_ACCELERATORS_PER_NODE: Final = 1_024
MAX_ACCELERATORS_PER_JOB: Final = 1_048_576


def requests_within_ceilings(per_node: tuple[tuple[str, int], ...], nodes: int) -> tuple[bool, bool]:
    """(nodes believable, accelerators believable) against the ceilings above.

    The accelerators are believable only if the nodes are (the per-job count is per-node x nodes) and,
    for every class, the per-node count and the per-job count are within their ceilings.
    """
    if nodes > MAX_REQUESTED_NODES:
        return False, False
    n = max(nodes, 0)
    return True, all(
        count <= MAX_ACCELERATORS_PER_NODE and count * n <= MAX_ACCELERATORS_PER_JOB for _, count in per_node
    )
