"""What a TrainJob requests per node and how many nodes: the node count (the job's numNodes, else its
runtime's default) and the per-node resources (a container's requests and limits kept as canonical,
interned lists, and a TrainJob's resourcesPerNode merged into its runtime's container as the controller
merges them).

Its own module because these are the quantities behind the requested-nodes and requested-accelerators
histograms, read by both the TrainJob and the runtime projections; the memo and intern tables here are
what keeps one template's thousands of TrainJobs sharing one value.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple, cast

from app.trainer.quantity import device_count
from app.trainer.rules.labels import _MAX_MEMO_KEY, _MEMO_MAX, is_resource_name

MAX_NUM_NODES: Final = 2**31 - 1  # numNodes is an int32
# kubeflow/trainer v2.3.0 pkg/constants/constants.go: Node, the trainer's replicated job and container;
# Launcher, the MPI launcher's replicated job.
NODE: Final = "node"
LAUNCHER: Final = "launcher"


class NodeRule(NamedTuple):
    """How the controller counts a runtime's training nodes, for ``requested_nodes`` (built by ``node_rule``
    once per runtime version)."""

    default: int  # training nodes when the TrainJob sets no numNodes
    takes_job_nodes: bool  # spec.trainer.numNodes sets the count: a plugin finds the PodSet it sizes
    # MPI runLauncherAsNode: numNodes n gives `node` max(n-1, 1) pods, beside the launcher
    launcher_as_node: bool
    launcher_nodes: int  # the launcher's pods, training nodes too (launcher_as_node only, else 0)


def requested_nodes(job_num_nodes: int | None, rule: NodeRule | None) -> int:
    """The training nodes the controller runs for a TrainJob: the pods of its training PodSets once
    ``spec.trainer.numNodes`` is applied (kubeflow/trainer v2.3.0, the EnforceMLPolicy plugins over
    ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo's PodSet counts; see ``node_rule``).

    - ``rule`` None (the runtime is not known): ``numNodes``, else 1.
    - ``numNodes`` unset, or a runtime whose plugins find no PodSet to size (``takes_job_nodes`` False: no
      replicated job labelled ancestor ``trainer``, or MPI without a ``node`` job): the runtime's count,
      ``numNodes`` ignored as the controller ignores it.
    - MPI with runLauncherAsNode: the launcher's pods plus ``max(numNodes-1, 1)`` ``node`` pods
      (``plugins/mpi/mpi.go`` EnforceMLPolicy; buildHostFileConfigMap lists both as hosts), so ``numNodes: 1``
      trains on 2 nodes (the launcher and one worker), and so does ``numNodes: 0``.
    - Otherwise ``numNodes``: the torch, jax, xgboost and plainml (also flux and no mlPolicy) plugins set the
      trainer PodSet's count to it, the MPI plugin the ``node`` PodSet's. 0 is a legal request and stays 0.
    """
    if rule is None:
        return 1 if job_num_nodes is None else job_num_nodes
    if job_num_nodes is None or not rule.takes_job_nodes:
        return rule.default
    if rule.launcher_as_node:
        return rule.launcher_nodes + max(job_num_nodes - 1, 1)
    return job_num_nodes


def pod_set_count(
    has_ml_policy: bool, ml_policy_num_nodes: int | None, trainer_ancestor: bool, parallelism: int | None
) -> int:
    """The pod count the controller gives one replicated job before the TrainJob's own ``numNodes``
    (kubeflow/trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo):
    ``ptr.Deref(template.spec.parallelism, 1)``, replaced by ``ptr.Deref(mlPolicy.numNodes, 1)`` for a job
    labelled ancestor-step ``trainer`` when the runtime has an mlPolicy; at least 1
    (``pkg/runtime/runtime.go`` WithPodSet: ``Count: ptr.To(max(count, 1))``, which the JobSet plugin's
    SyncParallelCount writes back as the Job's parallelism). So a runtime without an mlPolicy (or whose
    trainer job lacks the ancestor label) runs ``parallelism`` nodes, not 1.
    """
    if has_ml_policy and trainer_ancestor:
        count = 1 if ml_policy_num_nodes is None else ml_policy_num_nodes
    else:
        count = 1 if parallelism is None else parallelism
    return max(count, 1)


# (name, labelled ancestor `trainer`, parallelism as coerce_count read it) of a runtime's replicated job
PodSetParts = tuple[object, bool, int | None]


def node_rule(
    jobs: Sequence[PodSetParts],
    *,
    has_ml_policy: bool,
    ml_policy_num_nodes: int | None,
    mpi: bool,
    launcher_as_node: bool,
) -> NodeRule:
    """How the controller counts the training nodes of a runtime whose replicated jobs are ``jobs`` (in
    template order), with ``pod_set_count`` giving each job's count before the TrainJob's ``numNodes``:

    - MPI (``plugins/mpi/mpi.go``): the hosts are the ``node`` pods, plus the launcher's with
      runLauncherAsNode (isNode); ``numNodes`` sizes the first PodSet named ``node`` (FindPodSetByName), so
      it is ignored without one.
    - Otherwise the first job labelled ancestor ``trainer`` (FindPodSetByAncestor, which every other plugin
      sizes with ``numNodes``). A runtime without one: the job named ``node`` (constants.Node, whose ``node``
      container ExtractResourcePerNodeFromRuntime reads), else 1, and no plugin applies ``numNodes``.
    """

    def count(job: PodSetParts) -> int:
        return pod_set_count(has_ml_policy, ml_policy_num_nodes, job[1], job[2])

    if mpi:
        node = next((j for j in jobs if j[0] == NODE), None)
        launcher = next((j for j in jobs if j[0] == LAUNCHER), None) if launcher_as_node else None
        if node is not None or launcher is not None:
            launcher_nodes = count(launcher) if launcher is not None else 0
            default = (count(node) if node is not None else 0) + launcher_nodes
            return NodeRule(default, node is not None, launcher_as_node, launcher_nodes)
    trainer = next((j for j in jobs if j[1]), None)
    if trainer is not None:
        return NodeRule(count(trainer), True, False, 0)
    node = next((j for j in jobs if j[0] == NODE), None)
    return NodeRule(count(node) if node is not None else 1, False, False, 0)


def coerce_count(value: object) -> tuple[int | None, bool]:
    """(count, malformed) for an int32 count such as numNodes; tolerant of what the schema forbids.

    An integral float or a decimal string is accepted but flagged malformed; negatives, values beyond
    int32 (which the schema refuses: clamped, they would be logged and counted as a request nobody
    made), non-numbers and fractions become ``None`` (so the next fallback applies) and are flagged.
    """
    if value is None:
        return None, False
    if isinstance(value, bool):
        return None, True
    if isinstance(value, int):
        if not 0 <= value <= MAX_NUM_NODES:
            return None, True
        return value, False
    integral = isinstance(value, float) and value.is_integer() and value >= 0
    decimal = isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12
    if integral or decimal:
        count = int(cast("float | str", value))
        return (count if count <= MAX_NUM_NODES else None), True
    return None, True


# --- per-node resources ---------------------------------------------------------------------------

# A container's resource list as the rules keep it: (resource name, device count) pairs sorted by name; only
# valid resource names with parsable quantities. A quantity that is not a whole count ("8G", "500m") is kept
# as quantity.NOT_A_COUNT, never a number of devices, but still there to override the runtime's value of that
# name when merged. Requests and limits of one container.
ResourceList = tuple[tuple[str, int], ...]
NodeResources = tuple[ResourceList, ResourceList]  # (requests, limits)
NO_RESOURCES: Final[NodeResources] = ((), ())

# A real container names a handful of resources; beyond this a list is hostile and the rest is dropped.
MAX_RESOURCE_ENTRIES: Final = 64


def merge_resources(base: NodeResources, override: NodeResources) -> NodeResources:
    """``override`` (a TrainJob's ``resourcesPerNode``) merged into ``base`` (the runtime's container).

    kubeflow/trainer v2.3.0 ``pkg/util/trainingruntime/trainingruntime.go`` MergeResourceRequirements
    (since trainer #3602): a strategic merge patch, so requests merge with requests and limits with limits,
    per resource name, the override winning; a resource the override does not name keeps the runtime's
    value (a CPU-only ``resourcesPerNode`` keeps the runtime's GPUs). Memoised: one entry per (runtime
    version, distinct override) pair.
    """
    if not override[0] and not override[1]:
        return base
    key = (base, override)
    hit = _MERGE_MEMO.get(key)
    if hit is None:
        hit = _intern_resources((_merge_list(base[0], override[0]), _merge_list(base[1], override[1])))
        if len(_MERGE_MEMO) >= _MEMO_MAX:
            _MERGE_MEMO.clear()
        _MERGE_MEMO[key] = hit
    return hit


_MERGE_MEMO: dict[tuple[NodeResources, NodeResources], NodeResources] = {}


def _merge_list(base: ResourceList, override: ResourceList) -> ResourceList:
    if not override:
        return base
    if not base:
        return override
    merged = dict(base)
    merged.update(override)
    return tuple(sorted(merged.items()))


def node_resources(requests: object, limits: object) -> tuple[NodeResources, bool]:
    """(canonical resources, malformed) of a container's or ``resourcesPerNode``'s requests and limits.

    Entries whose name is not a Kubernetes resource name (``is_resource_name``: it could never be a label
    value) or whose quantity does not parse are dropped and flag ``malformed``, as do a non-mapping list
    and entries beyond MAX_RESOURCE_ENTRIES; the API server accepts none of these. Interned and memoised:
    TrainJobs of one template share one value, so a projection holds a pointer, not a copy.
    """
    req, bad_req = _resource_list(requests)
    lim, bad_lim = _resource_list(limits)
    return _intern_resources((req, lim)), bad_req or bad_lim


def _intern_resources(resources: NodeResources) -> NodeResources:
    shared = _RESOURCES_INTERN.get(resources)
    if shared is None:
        if len(_RESOURCES_INTERN) >= _MEMO_MAX:
            _RESOURCES_INTERN.clear()
        _RESOURCES_INTERN[resources] = shared = resources
    return shared


_RESOURCES_INTERN: dict[NodeResources, NodeResources] = {NO_RESOURCES: NO_RESOURCES}


def _resource_list(source: object) -> tuple[ResourceList, bool]:
    items = _memo_items(source)
    if items is None:
        return _parse_resource_list(source)
    hit = _LIST_MEMO.get(items)
    if hit is None:
        hit = _parse_resource_list(source)
        if len(_LIST_MEMO) >= _MEMO_MAX:
            _LIST_MEMO.clear()
        _LIST_MEMO[items] = hit
    return hit


_LIST_MEMO: dict[tuple[tuple[str, object], ...], tuple[ResourceList, bool]] = {}
_NO_ITEMS: Final[tuple[tuple[str, object], ...]] = ()


def _memo_items(source: object) -> tuple[tuple[str, object], ...] | None:
    """A memo key for a resource list: its items when all names are short strings and all quantities
    short strings or ints (type-exact, so "1" and 1 or true never share an entry), else None (not
    memoised)."""
    if source is None:
        return _NO_ITEMS
    if type(source) is not dict or len(source) > 16:
        return None
    items = tuple(source.items())
    for name, quantity in items:
        if type(name) is not str or len(name) > _MAX_MEMO_KEY:
            return None
        # int too (YAML-written objects carry `nvidia.com/gpu: 2`); never bool or float, which compare
        # equal to ints (True == 1, 2.0 == 2) while they are not the same quantity to the parser.
        if type(quantity) is int:
            continue
        if type(quantity) is not str or len(quantity) > _MAX_MEMO_KEY:
            return None
    return items


def _parse_resource_list(source: object) -> tuple[ResourceList, bool]:
    if source is None:
        return (), False
    if not isinstance(source, Mapping):
        return (), True
    malformed = False
    entries: dict[str, int] = {}
    for name, quantity in source.items():
        if len(entries) >= MAX_RESOURCE_ENTRIES:
            malformed = True
            break
        if not isinstance(name, str) or not is_resource_name(name):
            malformed = True
            continue
        count = device_count(quantity)
        if count is None:
            malformed = True
            continue
        entries[sys.intern(name)] = count
    return tuple(sorted(entries.items())), malformed
