"""The edges a new leader's journal cannot replay because it began above the take-over floor, rebuilt from
two LISTs (docs/leadership.md, "A successor whose journal starts above the floor").

A replica remembers the countable events its watch delivered after its first list (``remembered_from``,
app/handover/coverage.py). One that started shortly before the leader stopped, after the leader's last
published watermark, takes over from that floor with nothing between the floor and its first list: those
edges came to it as objects of the list, not as events. The old leader counted them above what it
published, so they are the crash bound's to count again; a scrape may have shown them (then PromQL has
them), or not (then nobody else will count them). So the new leader reads the TrainJobs as they were at
the floor and as they were where its journal begins (each one paginated LIST with
``resourceVersionMatch=Exact``, app/kube/exact_list.py): a job present at the start and absent at the
floor was created in between, one terminal at the start and not at the floor finished in between
(``counted_before``, the rule the held edges are settled by). Each such edge is counted, tagged
``since = floor``, unless the journal holds it (its watch delivered it after the first list, before the
journal's start was taken). Meanwhile the watermark it publishes for the stream stays at the floor.

Not rebuilt, so bounded instead: a job created (or finished) and deleted in between, which neither LIST
shows; the started and admitted edges in between (when a job began to run is in no object); the pod
failures of a pods stream's gap (app/handover/streams.py: a failure is in no TrainJob); and everything
in between when a LIST fails (the floor's revision compacted away, the API down). Every such take-over is
counted in ``trainer_metrics_limit_hits_total{limit="handover_uncovered"}`` and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from app.handover.journal import CountJournal
from app.handover.settle import counted_before, terminal_at
from app.handover.streams import is_pod_stream
from app.kube.client import KubeClient
from app.kube.exact_list import list_at
from app.trainer.events import CountableEvent
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR, TrainJobProjector
from app.trainer.kinds import TRAINJOBS
from app.trainer.projection_types import TrainJobProjection

__all__ = ["UNCOVERED_LIMIT", "GapRebuilder", "rebuilt_edges"]

log = logging.getLogger(__name__)

UNCOVERED_LIMIT = "handover_uncovered"  # app/metrics/telemetry.py Limit.HANDOVER_UNCOVERED
_PAGE_TIMEOUT = 30.0  # seconds per page of each LIST

Edges = Callable[[TrainJobProjection, int], list[CountableEvent]]  # TrainerState.listed_edges


async def rebuilt_edges(
    client: KubeClient,
    namespace: str | None,
    start: int,
    floor: int,
    *,
    edges: Edges,
    page_size: int,
    projector: TrainJobProjector = TRAINJOB_PROJECTOR,
) -> list[CountableEvent]:
    """The created and finished edges of the TrainJobs as they were at ``start`` that happened above
    ``floor``, each tagged ``since = floor``. Raises what a LIST raises."""
    at_floor = await terminal_at(client, namespace, floor, page_size=page_size, projector=projector)
    out: list[CountableEvent] = []
    items = list_at(client, TRAINJOBS, namespace, start, page_size=page_size, timeout=_PAGE_TIMEOUT)
    async for item in items:
        job = projector.from_json(item)
        if job is None:
            continue
        out.extend(edge for edge in edges(job, floor) if not counted_before(edge, at_floor))
    return out


class GapRebuilder:
    """Rebuilds a new term's uncovered streams in a background task (``schedule`` at the term's start,
    ``cancel`` at its end); ``holding`` is what the journal's watermarks must stay at or below meanwhile."""

    def __init__(
        self,
        journal: CountJournal,
        client: Callable[[], KubeClient | None],
        edges: Edges,
        *,
        page_size: int,
        projector: TrainJobProjector = TRAINJOB_PROJECTOR,
        on_limit: Callable[[str], None] | None = None,
    ) -> None:
        self._journal = journal
        self._client = client
        self._edges = edges
        self._page_size = page_size
        self.projector = projector  # the TrainJob informers' (HandOver sets the same one as the settler's)
        self._on_limit = on_limit
        self._task: asyncio.Task[None] | None = None
        # stream -> floor + 1 while its gap is being rebuilt: a waiting rv (CountJournal ``waiting``)
        self.holding: dict[str, int] = {}
        self.rebuilt = 0  # edges counted by rebuilds, since the process started

    def schedule(self, gaps: Mapping[str, tuple[int | None, int]]) -> None:
        """A term started with ``gaps`` ({stream: (journal start, floor)}, ``uncovered_streams``; start
        None: not listed yet, which only a pods stream can be, as leading waits for the TrainJob lists)."""
        self.cancel()
        trainjob_gaps: dict[str, tuple[int, int]] = {}
        for stream, (start, floor) in gaps.items():
            if is_pod_stream(stream) or start is None:
                # A pod's failure is in no TrainJob, and the pods are not listed at the floor: bounded,
                # not rebuilt. Those of pods still there when this replica lists them are settled at the
                # floor (app/handover/settle.py); those of pods deleted before are not replayed.
                log.warning(
                    "taking over from the hand-over watermark %s while this replica's journal begins at "
                    "%s (stream %s): failures of pods deleted before it are not replayed",
                    floor,
                    start if start is not None else "its first list (not come yet)",
                    stream,
                )
                if self._on_limit is not None:
                    self._on_limit(UNCOVERED_LIMIT)
                continue
            trainjob_gaps[stream] = (start, floor)
            log.warning(
                "taking over from the hand-over watermark %s while this replica's journal begins at %s "
                "(stream %s): rebuilding the created and finished edges in between from the TrainJobs "
                "listed at both; started and admitted edges in between are not replayed",
                floor,
                start,
                stream or "(all namespaces)",
            )
            if self._on_limit is not None:
                self._on_limit(UNCOVERED_LIMIT)
            self.holding[stream] = floor + 1
        if trainjob_gaps:
            self._task = asyncio.get_running_loop().create_task(self._run(trainjob_gaps), name="rebuild gap")

    def cancel(self) -> None:
        """The term ended: nothing more is counted for it."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.holding.clear()

    async def stop(self) -> None:
        task, self._task = self._task, None
        self.holding.clear()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, gaps: dict[str, tuple[int, int]]) -> None:
        journal = self._journal
        for stream, (start, floor) in gaps.items():
            try:
                client = self._client()
                if client is None:
                    raise RuntimeError("not connected to the Kubernetes API")
                edges = await rebuilt_edges(
                    client,
                    stream or None,
                    start,
                    floor,
                    edges=self._edges,
                    page_size=self._page_size,
                    projector=self.projector,
                )
            except Exception as exc:
                log.warning(
                    "could not list the TrainJobs at %s and %s (%s): the edges between the hand-over "
                    "watermark and this replica's journal are not replayed; those no scrape of the "
                    "previous leader showed are lost",
                    floor,
                    start,
                    str(exc),  # the text: a record holding the exception holds its frames, this term's state
                )
                self.holding.pop(stream, None)
                continue
            if not journal.leading or journal.paused:
                # Counting stopped (a graceful stop): the watermark stays at the floor for the next leader.
                continue
            counted = 0
            known = journal.remembered_edges()  # no await from here on: the journal cannot move
            for edge in edges:
                if (type(edge), edge.uid) not in known:
                    journal.on_countable(edge)  # above the floor, since = floor: counted
                    counted += 1
            self.rebuilt += counted
            self.holding.pop(stream, None)
            log.info(
                "rebuilt %d edges between the hand-over watermark %s and this replica's journal (%s): "
                "%d counted, the others in its journal already",
                len(edges),
                floor,
                start,
                counted,
            )
