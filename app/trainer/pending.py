"""Created edges waiting for their runtime.

A JobCreated for a job whose runtime is not yet known waits up to ``runtime_wait_seconds``: the runtime
may arrive a moment later on its own watch, and the job's node count and resources depend on it (its
resourcesPerNode merges into the runtime's container, so even a job that sets both needs it). The later
edges of a still-waiting job (admitted, started, finished) wait with it, so that TrainerState emits them in
order: a hand-over watermark at one of them must never cover its created edge uncounted.
"""

from __future__ import annotations

from collections import deque

import msgspec

from app.trainer.event_builder import rv_int
from app.trainer.events import CountableEvent
from app.trainer.projection_types import TrainJobProjection


class Waiting(msgspec.Struct, gc=False):
    job: TrainJobProjection  # the state that produced the created edge (rv, spec)
    raw_ref: str
    deadline: float
    since: int = 0  # app/trainer/events.py, for the created edge
    finished: TrainJobProjection | None = None  # a terminal edge seen while waiting
    finished_since: int = 0
    # Admitted / started edges seen while waiting, built when seen (their values are times of observation).
    deferred: tuple[CountableEvent, ...] = ()


class PendingCreated(dict[bytes | str, Waiting]):
    """Waiting edges by TrainJobProjection.uid_key.

    A dict subclass with a public ``queue`` (deadlines, FIFO: the wait is constant) because
    TrainerState checks both on every watch event, and this keeps those checks C-level.
    """

    __slots__ = ("_by_ref", "queue")

    def __init__(self) -> None:
        super().__init__()
        self.queue: deque[tuple[float, bytes | str]] = deque()
        self._by_ref: dict[str, dict[bytes | str, None]] = {}  # raw ref -> uids waiting for it

    def add(self, job: TrainJobProjection, raw_ref: str, deadline: float, since: int) -> None:
        uid = job.uid_key
        self[uid] = Waiting(job=job, raw_ref=raw_ref, deadline=deadline, since=since)
        self.queue.append((deadline, uid))
        self._by_ref.setdefault(raw_ref, {})[uid] = None

    def take(self, uid: bytes | str) -> Waiting:
        """Remove and return the entry of ``uid`` (KeyError if none)."""
        entry = self.pop(uid)
        waiting = self._by_ref.get(entry.raw_ref)
        if waiting is not None:
            waiting.pop(uid, None)
            if not waiting:
                del self._by_ref[entry.raw_ref]
        return entry

    def take_expired(self, now: float) -> list[Waiting]:
        """Remove and return the entries whose deadline is at or before ``now``, oldest first."""
        expired: list[Waiting] = []
        queue = self.queue
        while queue and queue[0][0] <= now:
            _, uid = queue.popleft()
            entry = self.get(uid)
            if entry is None or entry.deadline > now:
                continue  # already taken (runtime arrived, job deleted) or re-queued
            expired.append(self.take(uid))
        return expired

    def take_for(self, raw_ref: str) -> list[Waiting]:
        """Remove and return the entries waiting for ``raw_ref``, oldest first."""
        return [self.take(uid) for uid in list(self._by_ref.get(raw_ref, ()))]

    def lowest_rvs(self, per_namespace: bool) -> dict[str, int]:
        """Per namespace label (all under "" unless ``per_namespace``), the lowest resourceVersion at which
        a waiting created edge may have happened: its job's rv, or ``since`` + 1 when a relist found it
        (app/trainer/events.py). The later edges of its job wait behind it. O(waiting)."""
        out: dict[str, int] = {}
        for entry in self.values():
            job = entry.job
            stream = job.namespace_label if per_namespace else ""
            rv = entry.since + 1 if entry.since else rv_int(job.rv)
            if rv < out.get(stream, rv + 1):
                out[stream] = rv
        return out
