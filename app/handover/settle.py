"""Settling the edges a new leader's journal holds as uncertain (docs/leadership.md, "A follower that
relisted across the watermark").

An edge a relist found across the take-over floor may or may not have been counted by the previous
leader. The TrainJobs as they were at the floor decide it: one paginated LIST at exactly that revision
(app/kube/exact_list.py) per stream and floor, once per takeover that holds such edges. A pod's failure
(a pods stream, app/handover/streams.py) is decided by the pods as they were at its floor: a pod already
Failed then was counted by the previous leader (``failed_at``, a LIST with the pods watch's selector).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from app.handover.journal import CountJournal
from app.handover.streams import is_pod_stream, stream_namespace
from app.kube.client import KubeClient
from app.kube.exact_list import list_at
from app.metrics.counted import (
    AT_FLOOR_FAILED,
    AT_FLOOR_RESUMED,
    AT_FLOOR_RUNNING,
    AT_FLOOR_TERMINAL,
    edge_of,
)
from app.trainer.events import CountableEvent
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR, TrainJobProjector
from app.trainer.kinds import TRAINJOBS
from app.trainer.pods import PODS
from app.trainer.rules import FAILED_PHASE, POD_SELECTOR, RUNNING, SUSPENDED

__all__ = [
    "HeldEdgeSettler",
    "counted_before",
    "failed_at",
    "terminal_at",
]

log = logging.getLogger(__name__)

_PAGE_TIMEOUT = 30.0  # seconds per page of the LIST at the floor


def counted_before(event: CountableEvent, terminal_at_floor: Mapping[str, int]) -> bool:
    """Whether the previous leader counted an uncertain event (``CountJournal.take_uncertain``), from the
    TrainJobs as they were at the floor (uid -> AT_FLOOR_* bits): the event's row in app/metrics/counted.py
    names the bits its job had at the floor if the edge was counted (a creation: the job existed; a finish:
    terminal; a start: running; an admission: resumed). Assumes the previous leader saw every edge up to
    its watermark, as the journal's skip rule does. (A job that ran, or was resumed, before the floor and
    was not running, or was suspended again, at the floor reads as not counted: counted twice rather than
    lost.) A row with a ``subject`` (a pod's failure) reads the bits of its subject (the pod, from
    ``failed_at``) rather than of the TrainJob."""
    edge = edge_of(event)
    return edge.counted_before(terminal_at_floor.get(edge.subject_uid(event)))


async def terminal_at(
    client: KubeClient,
    namespace: str | None,
    resource_version: int,
    *,
    page_size: int,
    projector: TrainJobProjector = TRAINJOB_PROJECTOR,
) -> dict[str, int]:
    """uid -> AT_FLOOR_* bits (terminal, running, resumed), for every TrainJob as it was at
    ``resource_version``, each projected by ``projector`` (the informers' own, so that running means what
    it meant to them: the training step found through the runtimes they know)."""
    out: dict[str, int] = {}
    items = list_at(
        client, TRAINJOBS, namespace, resource_version, page_size=page_size, timeout=_PAGE_TIMEOUT
    )
    async for item in items:
        job = projector.from_json(item)
        if job is not None:
            out[job.uid] = (
                (AT_FLOOR_TERMINAL if job.result else 0)
                | (AT_FLOOR_RUNNING if job.state == RUNNING else 0)
                # admitted: out of suspended (app/trainer/state.py), or Resumed and preempted since
                | (AT_FLOOR_RESUMED if job.resumed or job.state != SUSPENDED else 0)
            )
    return out


async def failed_at(
    client: KubeClient, namespace: str | None, resource_version: int, *, page_size: int
) -> dict[str, int]:
    """pod uid -> AT_FLOOR_FAILED (phase Failed) or 0, for every pod the pods watch selects (JobSet's
    ``jobset-name`` label) as it was at ``resource_version``."""
    out: dict[str, int] = {}
    items = list_at(
        client,
        PODS,
        namespace,
        resource_version,
        page_size=page_size,
        timeout=_PAGE_TIMEOUT,
        label_selector=POD_SELECTOR,
    )
    async for item in items:
        metadata, status = item.get("metadata"), item.get("status")
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        if isinstance(uid, str) and uid:
            phase = status.get("phase") if isinstance(status, dict) else None
            out[uid] = AT_FLOOR_FAILED if phase == FAILED_PHASE else 0
    return out


class HeldEdgeSettler:
    """Settles a leading journal's uncertain edges in a background task.

    ``schedule`` is the journal's ``on_uncertain`` hook; the client is looked up when the task runs
    (the journal exists before the service connects). If the read fails (the floor's revision was
    compacted away, or the API is down), every held edge is counted: counting twice is the lesser harm
    than losing them.
    """

    def __init__(
        self,
        journal: CountJournal,
        client: Callable[[], KubeClient | None],
        *,
        page_size: int,
        projector: TrainJobProjector = TRAINJOB_PROJECTOR,
    ) -> None:
        self._journal = journal
        self._client = client
        self._page_size = page_size
        self.projector = projector  # the TrainJob informers' (Service sets it once they are built)
        self._task: asyncio.Task[None] | None = None

    def schedule(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="settle uncertain edges")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        journal = self._journal
        # Paused (a graceful stop's wait), the journal settles nothing: the edges stay held for the next
        # leader, and asking again would only repeat the reads (at once, when they fail).
        while journal.leading and not journal.paused:
            batch = journal.take_uncertain()
            if not batch:
                return
            groups: dict[tuple[str, int], list[CountableEvent]] = {}
            for event, stream, floor in batch:
                groups.setdefault((stream, floor), []).append(event)
            for (stream, floor), events in groups.items():
                at_floor = await self._read(stream, floor, len(events))
                counted = 0
                for event in events:
                    count = at_floor is None or not counted_before(event, at_floor)
                    counted += count
                    journal.settle(event, count)
                log.info(
                    "settled %d edges found by a relist across the hand-over watermark %s: %d counted, "
                    "%d already counted by the previous leader",
                    len(events),
                    floor,
                    counted,
                    len(events) - counted,
                )

    async def _read(self, stream: str, floor: int, held: int) -> dict[str, int] | None:
        pods = is_pod_stream(stream)
        try:
            client = self._client()
            if client is None:
                raise RuntimeError("not connected to the Kubernetes API")
            namespace = stream_namespace(stream)
            if pods:
                return await failed_at(client, namespace, floor, page_size=self._page_size)
            return await terminal_at(
                client, namespace, floor, page_size=self._page_size, projector=self.projector
            )
        except Exception as exc:
            log.warning(
                "could not read the %s at the hand-over watermark %s (%s): counting %d "
                "edges whose hand-over is uncertain; some may be counted twice",
                "pods" if pods else "TrainJobs",
                floor,
                str(exc),  # the text: a record holding the exception holds its frames, this term's state
                held,
            )
            return None
