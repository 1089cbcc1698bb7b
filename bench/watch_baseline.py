"""The baseline every ingest ratio is taken against: what a user of kubernetes-asyncio gets from its
``Watch`` helper (each event's object deserialized into the API's model, its dict in ``raw_object``), fed
into the same projector and handler the service uses, through a dict cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol


class Projector(Protocol):
    def from_json(self, obj: Any) -> Any: ...


class Handler(Protocol):
    def on_added(self, obj: Any, initial: bool) -> None: ...

    def on_updated(self, old: Any, new: Any) -> None: ...


async def timed_watch(
    list_call: Callable[..., Any],
    args: tuple[Any, ...],
    listing: dict[str, Any],
    projector: Projector,
    handler: Handler,
    *,
    events: int,
    unchanged: Callable[[Any, Any], bool] | None = None,
    **watch_kwargs: Any,
) -> float:
    """Events per second from the first watch event to the ``events``-th, after the LIST ``listing`` (read
    by the caller, not measured) filled the cache. ``unchanged``: updates it calls equal are not handed on,
    as the informer's projector drops them."""
    from kubernetes_asyncio import watch

    cache: dict[Any, Any] = {}
    for item in listing["items"]:
        obj = projector.from_json(item)
        if obj is not None:
            cache[obj.key] = obj
            handler.on_added(obj, True)
    count, first = 0, 0.0
    async with watch.Watch().stream(
        list_call,
        *args,
        resource_version=listing["metadata"]["resourceVersion"],
        timeout_seconds=600,
        **watch_kwargs,
    ) as stream:
        async for event in stream:
            new = projector.from_json(event["raw_object"])
            if new is None:
                continue
            old = cache.get(new.key)
            cache[new.key] = new
            if old is None:
                handler.on_added(new, False)
            elif unchanged is None or not unchanged(old, new):
                handler.on_updated(old, new)
            count += 1
            if count == 1:
                first = time.perf_counter()
            elif count == events:
                break
    return (events - 1) / (time.perf_counter() - first)
