"""`SimulatedCluster`: the simulated API server with the Kubeflow Trainer installed, as a cluster has it after
the Trainer's manifests are applied: its CRDs served and, on request, its ClusterTrainingRuntimes created."""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.cluster import SimulatedAPIServer
from kubesim.apiserver.core import BUILTIN_RESOURCES
from kubesim.apiserver.schema.validation import WriteOptions
from kubesim.apiserver.storage.store import Store
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINER_RESOURCES
from kubesim.trainer.manifests import cluster_training_runtimes, trainer_crds

# The upstream manifests are applied as kubectl would: validated.
MANIFESTS = WriteOptions(validate=True, field_validation="Strict", require_namespace=False)


def trainer_store(**options: Any) -> Store:
    """A store with the Trainer CRDs installed (``options``: the Store's)."""
    return Store(crds=trainer_crds(), resources=(*TRAINER_RESOURCES, *BUILTIN_RESOURCES), **options)


class SimulatedCluster(SimulatedAPIServer):
    def __init__(self, *args: Any, load_runtimes: bool = False, **options: Any) -> None:
        """``load_runtimes``: create upstream's ClusterTrainingRuntimes when the cluster starts. The other
        arguments are :class:`~kubesim.apiserver.cluster.SimulatedAPIServer`'s."""
        options.setdefault("crds", trainer_crds())
        options.setdefault("resources", (*TRAINER_RESOURCES, *BUILTIN_RESOURCES))
        super().__init__(*args, **options)
        self._load_runtimes = load_runtimes

    async def start(self) -> None:
        if self._load_runtimes:
            load_cluster_training_runtimes(self.store)
        await super().start()


def load_cluster_training_runtimes(store: Store) -> int:
    """Create the upstream ClusterTrainingRuntimes that are not in the store yet; returns how many."""
    created = 0
    existing = {e.key[1] for e in store.entries(CLUSTER_TRAINING_RUNTIMES, None)}
    for obj in cluster_training_runtimes():
        if obj["metadata"]["name"] not in existing:
            store.create(CLUSTER_TRAINING_RUNTIMES, None, obj, field_manager="kubectl", opts=MANIFESTS)
            created += 1
    return created
