"""Generic list+watch cache, ``Informer[T]``: client-go's Reflector + store + handler dispatch, in asyncio.

The composition of app/kube's pieces (docs/design/k8s-protocol.md §2 and §6):

- ``Reflector`` (reflector.py): the LIST/WATCH requests (or, with ``streaming_list``, a watch that lists:
  ``sendInitialEvents``), error handling, backoff, inactivity and staleness; it splits watch bodies
  into bounded lines (``LineSplitter``, lines.py);
- ``Ingest`` (ingest.py): lists and watch lines applied to the cache, the resourceVersion tracked;
- ``Decoder`` (decode.py): msgspec typed fast path, orjson tolerant fallback, per the ``Projector``;
- ``Cache`` (cache.py): the keyed store, event semantics and relist diffs, told to the ``InformerHandler``.

The informer knows nothing of what it caches: ``T`` only needs ``key``, ``uid`` and ``resource_version``
(``KubeObject``). Time is read from ``clock`` only, so tests can drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.kube.backoff import Backoff
from app.kube.cache import Cache, InformerHandler, KubeObject
from app.kube.decode import Decoder, Projector
from app.kube.informer_telemetry import InformerCounters, InformerTelemetry
from app.kube.ingest import Ingest
from app.kube.priority import LoopPriority
from app.kube.reflector import Reflector, StreamClient
from app.kube.resources import ResourceKind

T = TypeVar("T", bound=KubeObject)


@dataclass(frozen=True, slots=True)
class InformerOptions:
    page_size: int = 500
    watch_timeout_range: tuple[int, int] = (300, 600)  # server-side timeoutSeconds, drawn per watch
    inactivity_timeout: float = 90.0  # no byte for this long = dead watch (bookmarks come ~every 60 s)
    max_object_bytes: int = 4 * 1024 * 1024  # a longer watch line is skipped (then relist)
    backoff_base: float = 0.8
    backoff_cap: float = 30.0
    backoff_reset: float = 120.0  # failure-free time after which backoff starts small again
    list_timeout: float = 60.0  # per LIST page, end to end (servers cut non-watch requests at 60 s)
    connect_timeout: float = 10.0
    short_watch: float = 1.0  # a watch ending this fast with nothing received is a failure (no hot loop)
    # Sync by streaming list (watch with sendInitialEvents) instead of paginated LIST: True, False, or
    # None = try it and fall back to LIST for good if the server refuses it (reflector.py).
    streaming_list: bool | None = False
    # A streaming list whose initial-events-end bookmark has not come by then is given up (None: then
    # LIST for good). Generous: the whole collection streams within it.
    initial_events_timeout: float = 300.0


def cache_and_ingest(
    projector: Projector[T],
    handler: InformerHandler[T],
    counters: InformerCounters,
    *,
    name: str,
    clock: Callable[[], float],
) -> tuple[Cache[T], Ingest[T]]:
    """An informer's I/O-free half: the cache ``handler`` hears from, and the ingest that applies lists
    and watch lines to it (bench P1 drives it without a socket)."""
    decoder = Decoder(projector)
    cache = Cache(handler, counters, name=name, same_uid=decoder.same_uid, unchanged=decoder.unchanged)
    return cache, Ingest(decoder, cache, counters, name=name, clock=clock)


class Informer(Generic[T]):
    def __init__(
        self,
        client: StreamClient,
        resource: ResourceKind,
        namespace: str | None,
        projector: Projector[T],
        handler: InformerHandler[T],
        *,
        options: InformerOptions | None = None,
        telemetry: InformerTelemetry | None = None,
        name: str | None = None,
        on_limit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        priority: LoopPriority | None = None,
        label_selector: str | None = None,
    ) -> None:
        """``priority``: work that ingestion defers to when it yields (app/kube/priority.py).
        ``label_selector``: only objects matching it are listed, watched and cached (client-go's
        ``ListOptions.LabelSelector``, e.g. ``"app"`` for the objects that have the label ``app``)."""
        self.resource = resource
        self.namespace = namespace if resource.namespaced else None
        self.name = name or (f"{resource.plural}/{self.namespace}" if self.namespace else resource.plural)
        opts = options or InformerOptions()
        self.counters: InformerCounters = (
            telemetry.register(self) if telemetry is not None else InformerCounters()
        )
        self._cache, self._ingest = cache_and_ingest(
            projector, handler, self.counters, name=self.name, clock=clock
        )
        self._reflector = Reflector(
            client,
            resource.collection_path(self.namespace),
            self._ingest,
            self.counters,
            name=self.name,
            page_size=opts.page_size,
            watch_timeout_range=opts.watch_timeout_range,
            inactivity_timeout=opts.inactivity_timeout,
            max_object_bytes=opts.max_object_bytes,
            list_timeout=opts.list_timeout,
            connect_timeout=opts.connect_timeout,
            short_watch=opts.short_watch,
            backoff=Backoff(opts.backoff_base, opts.backoff_cap, reset_after=opts.backoff_reset, clock=clock),
            clock=clock,
            on_limit=on_limit,
            streaming_list=opts.streaming_list,
            initial_events_timeout=opts.initial_events_timeout,
            priority=priority,
            label_selector=label_selector,
        )

    async def run(self) -> None:
        """List and watch until cancelled. Never raises otherwise."""
        await self._reflector.run()

    # --- read-only state ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """The first LIST has been applied (or the resource does not exist)."""
        return self._ingest.synced

    @property
    def resource_version(self) -> str:
        """Of the last list, event or bookmark applied: where the next watch resumes."""
        return self._ingest.resource_version

    @property
    def watching(self) -> bool:
        return self._reflector.watching

    @property
    def streaming_list(self) -> bool:
        """Syncs use the streaming list (asked for, and not fallen back to the paginated LIST)."""
        return self._reflector.streaming

    @property
    def stale(self) -> bool:
        """Nothing received for longer than the inactivity timeout (watching or not)."""
        return self._reflector.stale

    @property
    def last_event(self) -> float:
        """``clock()`` at the last event, bookmark or completed list."""
        return self._ingest.last_event

    @property
    def last_activity(self) -> float:
        """``clock()`` at the last byte received, list completed or watch established."""
        return self._ingest.last_activity

    def __len__(self) -> int:
        return len(self._cache.store)

    def get(self, key: str) -> T | None:
        return self._cache.store.get(key)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._cache.store.items()))

    def keys(self) -> list[str]:
        return list(self._cache.store)
