"""The TrainJob informer's cache as the pod series and the pod-failure edges read it, for unit tests
without an informer.

``TrainJobCache`` is an ``InformerHandler[TrainJobProjection]`` that keeps the TrainJobs by key and updates
its store before telling ``handler`` (as app/kube/cache.py does), and ``get(namespace, name)`` is the
``TrainJobLookup`` (app/trainer/pods.py) that app/replica/pods.py ``TrainJobCaches`` gives in the service.
"""

from __future__ import annotations

from typing import Any

from app.trainer.field_builders import object_key
from app.trainer.projection_types import TrainJobProjection


class NullHandler:
    """An ``InformerHandler`` that ignores every notification."""

    def on_added(self, obj: Any, initial: bool) -> None:
        pass

    def on_updated(self, old: Any, new: Any) -> None:
        pass

    def on_deleted(self, last: Any) -> None:
        pass


class TrainJobCache:
    def __init__(self, handler: Any = None) -> None:
        """``handler``: told after the store changed (may be set later: the pod series need ``get`` first)."""
        self.store: dict[str, TrainJobProjection] = {}
        self.handler: Any = handler if handler is not None else NullHandler()

    def get(self, namespace: str, name: str) -> TrainJobProjection | None:
        return self.store.get(object_key(namespace, name))

    def on_added(self, obj: TrainJobProjection, initial: bool) -> None:
        self.store[obj.key] = obj
        self.handler.on_added(obj, initial)

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self.store[new.key] = new
        self.handler.on_updated(old, new)

    def on_deleted(self, last: TrainJobProjection) -> None:
        self.store.pop(last.key, None)
        self.handler.on_deleted(last)
