"""LeasePayload: everything a replica writes into the Lease besides the election record, and what it does
with what it reads there (docs/leadership.md): the served hand-over watermarks (app/handover/watermarks.py),
the jobs that ran, or were admitted, before, and the training steps of jobs whose runtime changed since
(app/handover/history.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from app.handover.candidacy import read_record
from app.handover.history import format_history, format_training_steps, parse_history, parse_training_steps
from app.handover.watermarks import LeaseWatermarks
from app.kube.lease import KubeLeaseClient, LeaseRecord
from app.trainer.state import TrainerState

__all__ = ["LeasePayload"]

log = logging.getLogger(__name__)


class LeasePayload:
    def __init__(
        self,
        watermarks: LeaseWatermarks,
        state: TrainerState,
        *,
        on_limit: Callable[[str], None] | None = None,
    ) -> None:
        self._watermarks = watermarks
        self._state = state
        self._on_limit = on_limit

    def annotations(self, served: dict[str, int]) -> dict[str, str]:
        """Written with every Lease renewal. ``served``: the watermarks a scrape has shown (not what was
        counted: app/handover/served.py)."""
        ran, admitted = self._state.published_history()
        return {
            **self._watermarks.annotations(served),
            **format_history(ran, admitted, on_limit=self._on_limit),
            **format_training_steps(self._state.published_snapshots(), on_limit=self._on_limit),
        }

    def observe(self, record: LeaseRecord) -> None:
        """Every Lease record read (the elector's ``on_observed``, and the reads before it runs). Facts
        are merged whoever wrote them: a replica restarted under the same identity inherits its own."""
        self._watermarks.observe(record)
        ran, admitted = parse_history(record.annotations)
        if ran or admitted:
            self._state.inherit_history(ran, admitted)
        steps = parse_training_steps(record.annotations)
        if steps:
            self._state.inherit_snapshots(steps)

    async def read(self, leases: KubeLeaseClient, namespace: str, name: str) -> None:
        """Read the Lease once before the first list: a job preempted now must be known to have run
        before its next run is seen, or this replica would take that run for its first."""
        record = await read_record(leases, namespace, name)
        if record is not None:
            self.observe(record)

    def forget_absent_jobs(self, present_uid_keys: Iterable[bytes | str]) -> None:
        """Once the caches hold every live job: inherited facts about jobs deleted before this replica
        listed them would be republished for ever."""
        dropped = self._state.forget_inherited_except(present_uid_keys)
        if dropped:
            log.info("forgot %d inherited facts about TrainJobs that no longer exist", dropped)
