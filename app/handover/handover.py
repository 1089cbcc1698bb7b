"""HandOver: one replica's counting pipeline and leader hand-over, built in one call (docs/leadership.md).

A replica counts through TrainerState → CountJournal → ServedLedger → TrainerMetricState. ``HandOver(...)``
builds that pipeline with the parts of the hand-over beside it:

* ``journal`` (app/handover/journal.py): leader-gated counting, the remembered events a take-over replays;
* ``ledger`` (app/handover/served.py): what the scrapes have shown, hence the served watermarks;
* ``settler`` (app/handover/settle.py): the held edges, settled from the TrainJobs as they were at the floor;
* ``gap`` (app/handover/gap.py): a take-over whose journal begins above the floor rebuilds the edges between;
* ``watermarks`` and ``payload`` (app/handover/watermarks.py, lease_payload.py): what the Lease carries;
* ``trainjob_projector``: the one TrainJob projector of the informers and of the settler's LIST at a floor
  (a job runs when its training step is ready: the step resolved from its runtime when first known, or
  inherited from the Lease, app/trainer/snapshots.py).

The parts need each other both ways: the state sends its edges to the journal and its gauges to the
metric state; the metric state reads the runtimes from the state at render time; the journal asks the
state which creations still wait for their runtime (they hold the watermark down) and hands the edges it
cannot place to the settler. So ``HandOver`` builds the two ends from the caller's factories
(``metric_state``, ``trainer_state``) and answers those three questions itself, once everything is built.
The zero hold is the metric state's, so the ledger and the born-at-zero hold always agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.handover import streams
from app.handover.candidacy import warm_head_start
from app.handover.coverage import uncovered_streams
from app.handover.gap import GapRebuilder
from app.handover.journal import CountJournal, JournalTelemetry
from app.handover.lease_payload import LeasePayload
from app.handover.scrape_wait import wait_until_scraped
from app.handover.served import ServedLedger
from app.handover.settle import HeldEdgeSettler
from app.handover.watermarks import LeaseWatermarks, Watermarks
from app.kube.client import KubeClient
from app.kube.lease import KubeLeaseClient, LeaseRecord
from app.metrics.trainer_metrics import RuntimeProvider, TrainerMetricState
from app.trainer.events import RuntimeInfo, TrainerSink
from app.trainer.informer_projectors import TrainJobProjector
from app.trainer.state import TrainerState

__all__ = ["HandOver", "HandOverConfig"]


@dataclass(frozen=True, slots=True)
class HandOverConfig:
    identity: str  # this replica's, as in the Lease
    journal_size: int  # countable events remembered (0: none)
    per_namespace: bool  # one TrainJob watch stream per configured namespace, else one for all
    list_page_size: int  # of the LIST at a floor
    retry_period: float  # the elector's, for the warm candidates' head start
    trainer_status: bool = False  # project status.trainerStatus (the per-TrainJob series)
    max_trainer_metrics: int = 0


class HandOver:
    def __init__(
        self,
        config: HandOverConfig,
        *,
        metric_state: Callable[[RuntimeProvider], TrainerMetricState],
        trainer_state: Callable[[TrainerSink, TrainerSink], TrainerState],
        client: Callable[[], KubeClient | None],
        telemetry: JournalTelemetry | None = None,
        on_limit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``metric_state(runtimes)``: the metric state, reading the runtimes from ``runtimes`` at render
        time. ``trainer_state(sink, gauge_sink)``: the Trainer state, its edges to ``sink`` and its gauges
        to ``gauge_sink``. ``client``: the connected client, looked up when a floor is read. ``clock``:
        the served ledger's (the metric state's own clock must be the same one)."""
        self.config = config
        stream_of = streams.stream_of(config.per_namespace)
        self.metric_state = metric_state(self._runtime_info)
        hold = self.metric_state.zero_hold
        self.ledger = ServedLedger(
            self.metric_state,
            hold=hold if hold is not None else 0.0,
            stream_of=stream_of,
            max_tracked=max(1, config.journal_size),
            clock=clock,
        )
        self.journal = CountJournal(
            self.ledger,
            journal_size=config.journal_size,
            telemetry=telemetry,
            stream_of=stream_of,
            on_uncertain=self._settle_held_edges,
            waiting=self._waiting_rvs,
        )
        self.state = trainer_state(self.journal, self.metric_state)
        self.trainjob_projector = TrainJobProjector(
            runtimes=self.state.runtimes_by_ref,
            steps=self.state.inherited_steps,
            trainer_status=config.trainer_status,
            max_trainer_metrics=config.max_trainer_metrics,
        )
        self.settler = HeldEdgeSettler(
            self.journal, client, page_size=config.list_page_size, projector=self.trainjob_projector
        )
        self.gap = GapRebuilder(
            self.journal,
            client,
            self.state.listed_edges,
            page_size=config.list_page_size,
            projector=self.trainjob_projector,
            on_limit=on_limit,
        )
        self.watermarks = LeaseWatermarks(config.identity)
        self.payload = LeasePayload(self.watermarks, self.state, on_limit=on_limit)

    # --- what the parts ask of each other ------------------------------------------------------------

    def _runtime_info(self) -> list[RuntimeInfo]:
        return self.state.runtime_info()

    def _waiting_rvs(self) -> dict[str, int]:
        waiting = self.state.waiting_rvs(per_namespace=self.config.per_namespace)
        for stream, rv in self.gap.holding.items():  # a gap being rebuilt: stay at its floor
            waiting[stream] = min(rv, waiting.get(stream, rv))
        return waiting

    def _settle_held_edges(self) -> None:
        self.settler.schedule()  # called only while leading, long after construction

    # --- terms ---------------------------------------------------------------------------------------

    def start_term(self, previous: LeaseRecord | None) -> tuple[Watermarks | int | None, int]:
        """A leader term starts, taking over from ``previous``: each term counts from zero (its series are
        new to Prometheus, born at zero), replaying what was remembered above the floor, and rebuilding
        what lies between the floor and where the journal begins, if it begins above (app/handover/gap.py).
        Returns the floor and how many events were replayed."""
        floor = self.watermarks.takeover_floor(previous)
        journal = self.journal
        gaps = (
            uncovered_streams(journal.remembered_from, floor, journal.unlisted)
            if journal.journal_size
            else {}
        )
        self.metric_state.reset_counts()
        self.ledger.start_term()
        replayed = self.journal.start_leading(floor)
        if gaps:
            self.gap.schedule(gaps)
        return floor, replayed

    def stop_term(self) -> dict[str, int]:
        """The term ends: stop counting, marking what the scrapes have shown. Returns the served
        watermarks it ended at."""
        served = self.served_watermarks()
        self.gap.cancel()
        self.journal.stop_leading(seen=served)
        return served

    def served_watermarks(self) -> dict[str, int]:
        """The watermarks to publish: what this replica counted and every scraper has seen
        (app/handover/served.py), per stream."""
        return self.ledger.watermarks(self.journal.watermarks)

    def takeover_delay(self, record: LeaseRecord, deferred_to: LeaseRecord | None) -> float:
        """How long after ``record`` became free to wait before taking it: the warm candidates' head
        start (``warm_head_start``, as at start-up) when this replica's journal starts above the floor
        it would take over from, so that it could not replay what the holder counted and no scrape
        showed, and a replica that remembers those events should win; else 0. ``deferred_to``: the
        record start-up already deferred on (its warm replicas had their chance)."""
        if not self.journal.journal_size:
            return 0.0  # nobody remembers anything: no replica is better placed than another
        if (
            deferred_to is not None
            and deferred_to.holder_identity == record.holder_identity
            and deferred_to.renew_time == record.renew_time
        ):
            return 0.0
        floor = self.watermarks.takeover_floor(record)
        if not uncovered_streams(self.journal.remembered_from, floor, self.journal.unlisted):
            return 0.0
        return warm_head_start(self.config.retry_period)

    async def wait_until_scraped(self, wait: float) -> tuple[bool, str | None, float]:
        """A graceful stop's wait (app/handover/scrape_wait.py)."""
        return await wait_until_scraped(self.ledger, self.journal, wait)

    async def stop(self) -> None:
        await self.settler.stop()
        await self.gap.stop()

    # --- the Lease -----------------------------------------------------------------------------------

    def annotations(self) -> dict[str, str]:
        """Written with every Lease renewal: what a scrape has shown, not what was counted."""
        return self.payload.annotations(self.served_watermarks())

    def observe(self, record: LeaseRecord) -> None:
        """Every Lease record read (the leader's own renewals included): besides the payload, the journal
        forgets what no take-over of this replica can replay any more (``CountJournal.forget_through``)."""
        self.payload.observe(record)
        self.journal.forget_through(self.watermarks.seen)

    async def read_lease(self, leases: KubeLeaseClient, namespace: str, name: str) -> None:
        await self.payload.read(leases, namespace, name)

    def listed(self, streams: Iterable[tuple[str, str]], present_uid_keys: Iterable[bytes | str]) -> None:
        """Every TrainJob informer has synced: ``streams`` (stream, rv of its first list), the jobs it
        holds. Edges before each first list were never seen as edges here (the journal covers what comes
        after), and inherited facts about jobs deleted before the list are dropped."""
        self.payload.forget_absent_jobs(present_uid_keys)
        for stream, rv in streams:
            self.stream_listed(stream, rv)

    def stream_listed(self, stream: str, rv: str) -> None:
        """A watch stream's first list was at ``rv``: the journal remembers its events from there."""
        if rv.isdigit():
            self.journal.remember_from(stream, int(rv))

    def expect_streams(self, streams: Iterable[str]) -> None:
        """Watches this replica runs that leading does not wait for (the pods'): until ``stream_listed``,
        it covers no floor of theirs (app/handover/coverage.py)."""
        for stream in streams:
            self.journal.expect(stream)
