"""RuntimeInventory: the TrainingRuntimes and ClusterTrainingRuntimes the informers hold, as the runtime
snapshot shows them (kubeflow_trainer_runtime_info, /debug/snapshot). TrainerState owns one and decides what
a runtime change means for the TrainJobs; this module only keeps the set.
"""

from __future__ import annotations

import logging

from app.kube.logthrottle import short
from app.trainer import rules
from app.trainer.event_builder import LoggedOnce
from app.trainer.events import RuntimeInfo
from app.trainer.kinds import TRAINER_GROUP
from app.trainer.projection_types import RuntimeProjection

__all__ = ["RuntimeInventory"]

# Warnings about one runtime come from the state's logger, where operators look for them.
log = logging.getLogger("app.trainer.state")

_Key = tuple[str, str, str]  # (kind, namespace, name)


def _key(r: RuntimeProjection) -> _Key:
    return (r.kind, r.namespace, r.name)


class RuntimeInventory:
    def __init__(self, logged: LoggedOnce) -> None:
        self._items: dict[_Key, RuntimeProjection] = {}
        self._logged = logged

    def put(self, old: RuntimeProjection | None, new: RuntimeProjection) -> RuntimeProjection | None:
        """Store ``new``; returns the runtime it replaces under another identity (renamed: gone), if any."""
        if new.malformed and new.uid not in self._logged:
            # docs/design/product.md §6 invariant 6: a malformed runtime is used as best it can be, and
            # logged once (per uid).
            self._logged.add(new.uid)
            log.warning(
                "%s %s (uid %s, resourceVersion %s) has unusable fields; used with defaults",
                new.kind,
                short(new.key),
                short(new.uid),
                short(new.resource_version),
            )
        gone = None
        if old is not None and _key(old) != _key(new):
            self.delete(old)
            gone = old
        self._items[_key(new)] = new
        return gone

    def delete(self, last: RuntimeProjection) -> None:
        self._items.pop(_key(last), None)
        self._logged.discard(last.uid)

    def runtime_info(self) -> list[RuntimeInfo]:
        """One entry per current runtime (labels of kubeflow_trainer_runtime_info), sorted.

        A runtime whose name or namespace is not a valid Kubernetes name (its ``ref`` is "unknown": no
        TrainJob can reference it) is left out, so such a name never becomes a label value."""
        return [
            RuntimeInfo(
                namespace=r.namespace,
                name=r.name,
                api_group=TRAINER_GROUP,
                kind=r.kind,
                ml_policy=r.ml_policy,
                pod_group_policy=r.pod_group_policy,
                framework=r.framework,
            )
            for _, r in sorted(self._items.items())
            if r.ref != rules.UNKNOWN
        ]

    def runtimes(self) -> list[RuntimeProjection]:
        """The runtime inventory for /debug/snapshot (``ref``, policies, framework, ``num_nodes``,
        accelerator, ``resource_version``), sorted by (kind, namespace, name)."""
        return [r for _, r in sorted(self._items.items())]
