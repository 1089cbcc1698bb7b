"""Which runtimes the workload generator installs, and how a new TrainJob picks one.

Split from ``sim/kubesim/trainer/generator.py``: the runtime mix (real manifests weighted over plain and
synthetic ones) is a policy of its own, and the per-namespace pickers are the only place that knows which
runtimes a namespace can reference.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from kubesim.apiserver.resources import ResourceKind
from kubesim.trainer import shapes_runtimes
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES
from kubesim.trainer.shapes import WeightedPicker
from kubesim.trainer.shapes_runtimes import RuntimeChoice

RuntimeDocument = tuple[ResourceKind, str | None, dict[str, Any], float]  # resource, namespace, doc, weight


def runtime_documents(namespaces: Sequence[str], extra: int) -> Iterator[RuntimeDocument]:
    """The real ClusterTrainingRuntimes, two TrainingRuntimes per job namespace and ``extra`` synthetic
    runtimes (a quarter cluster-scoped, the rest spread over the namespaces) for benchmarks, in the
    order the generator creates them."""
    for doc in shapes_runtimes.cluster_runtimes():
        yield CLUSTER_TRAINING_RUNTIMES, None, doc, 6.0
    for doc in shapes_runtimes.plain_runtimes():  # no mlPolicy: parallelism nodes, resourcesPerNode ignored
        yield CLUSTER_TRAINING_RUNTIMES, None, doc, 3.0
    for doc in shapes_runtimes.operator_runtimes():  # failure policy, no trainer label, MPI workers only
        yield CLUSTER_TRAINING_RUNTIMES, None, doc, 4.0
    for namespace in namespaces:
        for doc in shapes_runtimes.namespaced_runtimes(namespace):
            yield TRAINING_RUNTIMES, namespace, doc, 4.0
    for index in range(extra):
        # A quarter cluster-scoped; synthetic runtimes share a small total weight, so jobs mostly
        # keep using the real ones.
        extra_ns = None if index % 4 == 0 else namespaces[index % len(namespaces)]
        resource = CLUSTER_TRAINING_RUNTIMES if extra_ns is None else TRAINING_RUNTIMES
        yield resource, extra_ns, shapes_runtimes.synthetic_runtime(index, extra_ns), 20.0 / extra


class RuntimeCatalog:
    """The runtimes TrainJobs may reference, with one weighted picker per namespace (built on first use)."""

    def __init__(self) -> None:
        self.runtimes: list[RuntimeChoice] = []
        self._pickers: dict[str, WeightedPicker[RuntimeChoice]] = {}

    def __bool__(self) -> bool:
        return bool(self.runtimes)

    def adopt(self, choice: RuntimeChoice) -> None:
        """Add ``choice``, replacing a runtime of the same key (a runtime loaded twice is adopted)."""
        self.runtimes = [rt for rt in self.runtimes if rt.key != choice.key] + [choice]

    def remove(self, key: tuple[str, str, str]) -> None:
        """Drop the runtime of ``key`` (deleted): no new TrainJob picks it."""
        self.runtimes = [rt for rt in self.runtimes if rt.key != key]

    def reset_pickers(self) -> None:
        self._pickers.clear()

    def picker(self, namespace: str) -> WeightedPicker[RuntimeChoice]:
        picker = self._pickers.get(namespace)
        if picker is None:
            usable = [rt for rt in self.runtimes if rt.namespace in ("", namespace)]
            picker = WeightedPicker(usable, [rt.weight for rt in usable])
            self._pickers[namespace] = picker
        return picker
