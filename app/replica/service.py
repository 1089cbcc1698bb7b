"""The running service: builds informers, the counting pipeline with its hand-over (app/handover/handover.py,
one call) and the elector, and runs them.

Start order: Kubernetes client → runtime informers, then, once they have synced, the TrainJob informers
(every replica, warm standby) → once every informer has synced, the elector (so a new leader always exports
from a warm cache) → periodic housekeeping.
Stop order: hand over (a leader stops counting and waits, bounded, until scrapes have shown its last
counts: ``hand_over``) → stop leading (release the Lease with the served watermarks) → informers → client.

Counting pipeline: TrainerState → CountJournal (leader gate, hand-over replay) → ServedLedger (what the
scrapes have shown) → TrainerMetricState (counts, born at zero) → MetricsExposition.

The hand-over policy is app/handover/'s; the HTTP views of this state are app/api/'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
from typing import Any

from prometheus_client import CollectorRegistry

from app.config import Settings, unknown_env_vars
from app.handover.candidacy import defer_to_warm_followers
from app.handover.handover import HandOver, HandOverConfig
from app.kube.client import KubeClient
from app.kube.elector import LeaseElector
from app.kube.elector_api import ElectorConfig
from app.kube.informer import Informer
from app.kube.informer_telemetry import InformerTelemetry
from app.kube.lease import KubeLeaseClient, LeaseRecord
from app.kube.priority import LoopPriority, call_after_due_timers
from app.kube.resources import ResourceKind
from app.metrics.exposition import MetricsExposition
from app.metrics.per_job import PerJobHandler, PerJobSeries, PerJobTelemetry
from app.metrics.telemetry import SelfTelemetry
from app.metrics.trainer_metrics import RuntimeProvider, TrainerMetricState
from app.replica.heap_trim import HeapTrimmer, load_malloc_trim
from app.replica.informer_options import informer_options
from app.replica.pods import PodSeriesFeature, PodWatch
from app.trainer.events import TrainerSink
from app.trainer.informer_projectors import CLUSTER_TRAINING_RUNTIME_PROJECTOR, TRAINING_RUNTIME_PROJECTOR
from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from app.trainer.state import TrainerState

log = logging.getLogger(__name__)

_HOUSEKEEPING_INTERVAL = 1.0


class Service:
    """One replica of trainer-metrics. ``start()`` returns once background tasks run."""

    def __init__(self, settings: Settings, *, owns_process: bool = False) -> None:
        self.settings = settings
        self._owns_process = owns_process
        self.debug_endpoints = settings.debug_endpoints
        self.terminal_page_max = settings.terminal_page_max

        self.registry = CollectorRegistry()
        self.telemetry = SelfTelemetry(self.registry)
        self.informer_telemetry = InformerTelemetry(self.registry)
        # The opt-in per-TrainJob series: gauges exported with the Trainer metrics (leader only), fed by the
        # TrainJob informers after TrainerState; None when off, which costs nothing per event.
        self.per_job: PerJobSeries | None = None
        if settings.per_trainjob_series:
            self.per_job = PerJobSeries(
                namespaces=settings.per_trainjob_namespaces,
                max_jobs=settings.per_trainjob_max_jobs,
                on_change=lambda: self.metric_state.extra_changed(),  # noqa: PLW0108
            )
            self.registry.register(PerJobTelemetry(self.per_job))
        # The pod series (app/replica/pods.py): gauges exported with the Trainer metrics, like the above.
        self.pods = PodSeriesFeature(
            settings,
            self.registry,
            on_change=lambda: self.metric_state.extra_changed(),  # noqa: PLW0108
            on_limit=self.telemetry.limit_hit,
        )
        # The counting pipeline and the hand-over, built in one call (app/handover/handover.py).
        self.handover = HandOver(
            HandOverConfig(
                identity=settings.identity,
                journal_size=settings.handover_journal_size,
                # One TrainJob watch per configured namespace, else one over all namespaces.
                per_namespace=bool(settings.namespaces),
                list_page_size=settings.list_page_size,
                retry_period=settings.retry_period_seconds,
                # trainerStatus is decoded only for the per-TrainJob series (app/trainer/wire.py).
                trainer_status=self.per_job is not None,
                max_trainer_metrics=settings.per_trainjob_max_trainer_metrics,
            ),
            metric_state=self._metric_state,
            trainer_state=self._trainer_state,
            telemetry=self.telemetry,
            on_limit=self.telemetry.limit_hit,
            client=lambda: self.client,  # connected by start()
        )
        # Its parts, for the routes (app/api/views.py) and the tests.
        self.metric_state = self.handover.metric_state
        self.state = self.handover.state
        self.journal = self.handover.journal
        self.ledger = self.handover.ledger
        self.lease_watermarks = self.handover.watermarks
        # A pod's failure is a countable edge like a TrainJob's (app/trainer/pod_failures.py).
        self.pods.connect(self.journal, self.state.runtime_ref_label, self.handover.stream_listed)
        # The pods watches list after the TrainJobs, maybe after this replica leads: until each has, its
        # journal covers no pods floor (app/handover/coverage.py).
        self.handover.expect_streams(self.pods.streams())
        self.state.watch_jobs(lambda: (job for i in self._trainjob_informers for _, job in i.items()))
        self.exposition = MetricsExposition(self.registry)
        # A scrape runs ahead of watch ingestion on the loop (app/kube/priority.py).
        self.priority = LoopPriority()

        self.client: KubeClient | None = None
        self.informers: list[Informer[Any]] = []
        self._trainjob_informers: list[Informer[Any]] = []
        self._runtime_informers: list[Informer[Any]] = []
        self.elector: LeaseElector | None = None
        self._record_deferred_to: LeaseRecord | None = None  # the Lease start-up waited on, if it did
        self._tasks: list[asyncio.Task[None]] = []
        self._failed: list[str] = []
        self._handed_over: bool | None = None  # outcome of this term's hand_over(), once it ran

    def _metric_state(self, runtimes: RuntimeProvider) -> TrainerMetricState:
        return TrainerMetricState(
            runtime_provider=runtimes,
            extra_families=(
                *(self.per_job.families if self.per_job is not None else ()),
                *self.pods.families,
            ),
            zero_hold=self.settings.zero_hold_seconds,
            exemplars=self.settings.exemplars,
            defer_publish=call_after_due_timers,
        )

    def _trainer_state(self, sink: TrainerSink, gauge_sink: TrainerSink) -> TrainerState:
        s = self.settings
        return TrainerState(
            sink,
            gauge_sink=gauge_sink,
            max_unknown_runtime_refs=s.max_unknown_runtime_refs,
            on_limit=self.telemetry.limit_hit,
            accelerator_patterns=s.accelerator_resource_patterns,
            max_accelerator_classes=s.max_accelerator_classes,
            max_failure_reasons=s.max_failure_reasons,
            cluster_runtimes_watched=s.watch_cluster_runtimes,
        )

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        for name in unknown_env_vars():
            log.warning("ignoring unknown environment variable %s (no such setting)", name)
        self.client = await KubeClient.connect(s.kubeconfig, s.kube_context)
        log.info(
            "watching Kubernetes API at %s",
            self.client.host,
            extra={"namespaces": ",".join(s.namespaces) or "all"},
        )
        if s.leader_election:
            # Before the first list: a job preempted now must be known to have run before its next run is
            # seen, or this replica would take that run for its first (app/handover/history.py).
            leases = KubeLeaseClient(self.client, request_timeout=s.renew_deadline_seconds)
            await self.handover.read_lease(leases, s.lease_namespace, s.lease_name)
        self.informers = self._build_informers(self.client)
        for informer in self._runtime_informers:
            self._spawn(informer.run(), f"informer {informer.name}")
        for informer in self._trainjob_informers:
            self._spawn(self._run_after_runtimes(informer), f"informer {informer.name}")
        for watch in self.pods.watches(
            self.client, informer_options(s), self.informer_telemetry, self.priority
        ):
            self._spawn(self._run_after_trainjobs(watch), f"pods watch {watch.name}")
        self._spawn(self._housekeeping(), "housekeeping")
        if self._owns_process and s.heap_trim_interval_seconds > 0:
            trim = load_malloc_trim()
            if trim is None:
                log.info("no malloc_trim in this C library: freed heap is not given back periodically")
            else:
                observe = self.telemetry.heap_trim_duration.observe
                trimmer = HeapTrimmer(
                    s.heap_trim_interval_seconds,
                    trim,
                    observe,
                    transients=self.informer_telemetry.lists_applied,
                )
                self._spawn(trimmer.run(), "heap trim")
        self._spawn(self._lead_when_synced(), "leader election")

    async def kill(self) -> None:
        """Stop as a crashed process would: no hand-over wait, no Lease release (chaos, hand-over tests)."""
        if self.elector is not None:
            self.elector.abandon_on_cancel()
        await self.stop(graceful=False)

    async def stop(self, *, graceful: bool = True) -> None:
        if graceful:
            await self.hand_over()
        await self.handover.stop()
        # Reverse order of start: the elector's task releases the Lease when cancelled.
        for task in reversed(self._tasks):
            task.cancel()
        for task in reversed(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.journal.leading:
            self._stop_exporting()
        if self.client is not None:
            await self.client.close()
            self.client = None

    def _build_informers(self, client: KubeClient) -> list[Informer[Any]]:
        options = informer_options(self.settings)
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        runtimes = self.state.runtime_handler
        jobs: Any = self.state.job_handler

        def informer(resource: ResourceKind, ns: str | None, projector: Any, handler: Any) -> Informer[Any]:
            return Informer(
                client,
                resource,
                ns,
                projector,
                handler,
                options=options,
                telemetry=self.informer_telemetry,
                on_limit=self.telemetry.limit_hit,
                priority=self.priority,
            )

        projector = self.handover.trainjob_projector
        if self.per_job is not None:
            jobs = PerJobHandler(jobs, self.per_job)
        jobs = self.pods.job_handler(jobs)
        self._trainjob_informers = [informer(TRAINJOBS, ns, projector, jobs) for ns in scopes]
        self.pods.read_trainjobs(self._trainjob_informers)
        # ClusterTrainingRuntimes are cluster-scoped: a namespaced install (Roles only) cannot read them, and
        # an informer that is never allowed to list would never sync (never ready, never leading).
        cluster: list[Informer[Any]] = []
        if self.settings.watch_cluster_runtimes:
            cluster.append(
                informer(CLUSTER_TRAINING_RUNTIMES, None, CLUSTER_TRAINING_RUNTIME_PROJECTOR, runtimes)
            )
        self._runtime_informers = [
            *cluster,
            *(informer(TRAINING_RUNTIMES, ns, TRAINING_RUNTIME_PROJECTOR, runtimes) for ns in scopes),
        ]
        return [*self._runtime_informers, *self._trainjob_informers]

    def _spawn(self, coro: Any, what: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=what)

        def _done(t: asyncio.Task[None]) -> None:
            if t.cancelled():
                return
            exc = t.exception()
            # Background tasks run until cancelled; one that ends is a bug that liveness must report.
            self._failed.append(what)
            log.error("background task %s ended unexpectedly", what, exc_info=exc)

        task.add_done_callback(_done)
        self._tasks.append(task)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(_HOUSEKEEPING_INTERVAL)
            self.state.flush_pending()

    async def _run_after_runtimes(self, informer: Informer[Any]) -> None:
        """Run a TrainJob informer once the runtimes are listed. The controller builds a job from its
        runtime; a job listed before its runtime can only be read by the controller's naming, and its first
        write read with the runtime cannot be told from an edge (TrainerState ``_guessed``): a job that
        started between the two would not count as started. Listed after the runtimes, only the jobs whose
        runtime does not exist yet are read that way. The runtime lists are small: start-up waits a round
        trip or two."""
        await _until_synced(self._runtime_informers)
        await informer.run()

    async def _run_after_trainjobs(self, watch: PodWatch) -> None:
        """Run a pods watch once the TrainJobs are listed (client-go's WaitForCacheSync before a dependent
        informer): its first list then finds each pod's TrainJob cached, so a pod already Failed in it
        counts (app/trainer/pod_failures.py counts no failure it cannot join), it joins at once instead of
        waiting unjoined, and it shares its TrainJob's key string (app/trainer/pods.py)."""
        await _until_synced(self._trainjob_informers)
        await watch.run()

    def _runtimes_synced(self) -> bool:
        return all(i.synced for i in self._runtime_informers)

    async def _lead_when_synced(self) -> None:
        await _until_synced(self.informers)
        log.info(
            "informers synced",
            extra={"trainjobs": self.trainjob_count(), "runtimes": len(self.state.runtimes())},
        )
        self.handover.listed(
            ((informer.namespace or "", informer.resource_version) for informer in self._trainjob_informers),
            (job.uid_key for informer in self._trainjob_informers for _, job in informer.items()),
        )
        if self._owns_process:
            # The synced caches live as long as the process. Left in the collected generations, every
            # full collection walks all of them: 40-60 ms event-loop pauses under a watch firehose
            # (bench P5). Frozen, those collections only walk what was made since. Only a process that
            # runs this one replica may freeze: frozen objects are never collected as cycles, which in a
            # process hosting several replicas (tests) would keep stopped replicas alive.
            # No gc.collect() first: a full collection over a fresh 100k-job cache would delay readiness
            # by itself; what start-up left as cyclic garbage is small and stays frozen.
            gc.freeze()
        if not self.settings.leader_election:
            log.info("leader election disabled: this replica exports the Trainer metrics")
            self._start_exporting(None)
            await asyncio.Event().wait()
            return
        s = self.settings
        config = ElectorConfig(
            lease_name=s.lease_name,
            lease_namespace=s.lease_namespace,
            identity=s.identity,
            lease_duration=s.lease_duration_seconds,
            renew_deadline=s.renew_deadline_seconds,
            retry_period=s.retry_period_seconds,
        )
        assert self.client is not None
        leases = KubeLeaseClient(self.client, request_timeout=s.renew_deadline_seconds)
        self._record_deferred_to = await defer_to_warm_followers(
            leases,
            self.handover.observe,
            namespace=s.lease_namespace,
            name=s.lease_name,
            identity=s.identity,
            lease_duration=s.lease_duration_seconds,
            retry_period=s.retry_period_seconds,
        )
        self.elector = LeaseElector(
            leases,
            config,
            _Callbacks(self),
            annotations=self.handover.annotations,
            on_observed=self.handover.observe,
            takeover_delay=self.takeover_delay,
        )
        await self.elector.run()

    # --- hand-over -------------------------------------------------------------------------------

    def takeover_delay(self, record: LeaseRecord) -> float:
        """The elector's ``takeover_delay`` (``HandOver.takeover_delay``)."""
        return self.handover.takeover_delay(record, self._record_deferred_to)

    def served_watermarks(self) -> dict[str, int]:
        """The watermarks to publish (``HandOver.served_watermarks``)."""
        return self.handover.served_watermarks()

    @property
    def handover_wait_seconds(self) -> float:
        s = self.settings
        if s.handover_wait_seconds is not None:
            return s.handover_wait_seconds
        # A count in a series born just before the stop shows after the hold, one scrape, and is seen a
        # hold later: about three holds with the chart's hold of two scrape intervals.
        return 3 * s.zero_hold_seconds + 5.0

    def abandon_hand_over(self) -> None:
        """Stop waiting (a second signal): a hand-over under way or still to come releases at once."""
        if self._handed_over is None:
            self._handed_over = False

    async def hand_over(self) -> bool:
        """First half of a graceful stop, while ``/metrics`` is still served: stop counting, then wait
        until every scraper has seen what this leader counted (the served watermarks reach the counted
        ones), so that the release hands over exactly what PromQL has. Bounded by
        ``handover_wait_seconds``; gives up at once when no scrape came for the zero hold (nobody is
        scraping). Returns True when everything counted was seen (or there was nothing to hand over)."""
        if not self.journal.leading or self.elector is None:
            return True  # a follower, or a single replica without election: nobody takes over
        if self._handed_over is not None:
            return self._handed_over  # the signal handler ran it; the lifespan's stop() comes after
        if not self.journal.paused:
            # Creations still waiting for their runtime are counted now (with what is known), so that
            # the wait covers them too.
            self.state.flush_pending(math.inf)
            self.journal.pause_counting()
        seen, reason, waited = await self.handover.wait_until_scraped(self.handover_wait_seconds)
        if seen:
            log.info(
                "hand-over: every count of this leader has been scraped", extra={"waited_seconds": waited}
            )
            self._handed_over = True
            return True
        if reason is None:
            return self.ledger.all_seen()  # lost the Lease meanwhile: the elector released what it could
        self._handed_over = False
        # No wait configured (simulate mode's default: nobody takes over) is a choice, not a problem.
        log.log(
            logging.INFO if self.handover_wait_seconds == 0 else logging.WARNING,
            "hand-over: releasing with %d counts not yet seen by every scraper (%s); the next leader "
            "counts them again, and a scraper that saw some of them counts those twice",
            self.ledger.unseen,
            reason,
        )
        return False

    # --- leadership ------------------------------------------------------------------------------

    def _start_exporting(self, previous: LeaseRecord | None) -> None:
        self._handed_over = None
        floor, replayed = self.handover.start_term(previous)
        self.exposition.set_trainer_source(self.metric_state)
        log.info(
            "started leading: exporting the Trainer metrics",
            extra={"previous_watermark": floor, "replayed_events": replayed},
        )

    def _stop_exporting(self) -> None:
        # Count the creations still waiting for their runtime (with what is known now) so that the
        # watermark published at release covers them: the next leader skips everything up to it.
        self.state.flush_pending(math.inf)
        # Unregister first: from this instant no scrape of this replica shows Trainer metrics.
        self.exposition.set_trainer_source(None)
        served = self.handover.stop_term()
        log.info(
            "stopped leading: Trainer metrics no longer exported",
            extra={
                "watermark": self.journal.watermark,
                "served_watermark": max(served.values(), default=None),
            },
        )

    # --- what the routes read (app/api/) -----------------------------------------------------------

    def liveness_problems(self) -> list[str]:
        return [f"background task {what} died" for what in self._failed]

    def readiness_problems(self) -> list[str]:
        problems = []
        runtimes_synced = self._runtimes_synced()
        for informer in self.informers:
            if not informer.synced:
                waits = not runtimes_synced and informer in self._trainjob_informers
                problems.append(
                    f"informer {informer.name} "
                    + ("waits for the runtime lists" if waits else "has not synced")
                )
            elif informer.stale:
                problems.append(f"informer {informer.name} is stale (no watch activity)")
        if not self.informers:
            problems.append("informers not started")
        return problems + self.liveness_problems()

    async def render_metrics(
        self, accept: str | None, accept_encoding: str | None
    ) -> tuple[bytes, dict[str, str]]:
        with self.priority.urgent():
            body, headers = await self.exposition.build_metrics_response_async(accept, accept_encoding)
        return body, headers

    def trainjob_count(self) -> int:
        """TrainJobs held in the informer caches."""
        return sum(len(i) for i in self._trainjob_informers)


class _Callbacks:
    def __init__(self, service: Service) -> None:
        self._service = service

    def on_started_leading(self, previous: LeaseRecord | None) -> None:
        self._service._start_exporting(previous)

    def on_stopped_leading(self) -> None:
        self._service._stop_exporting()

    def on_new_leader(self, identity: str | None) -> None:
        pass  # the elector logs it; the service acts only on its own leadership


async def _until_synced(informers: list[Informer[Any]]) -> None:
    """Until every one of ``informers`` has applied its first list. Informers expose a flag, not an event;
    a short poll until the first sync is cheap."""
    while not all(i.synced for i in informers):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
