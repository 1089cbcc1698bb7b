"""The running service: wires informers, Trainer state, metric state, journal and elector together.

Start order: Kubernetes client → informers (every replica, warm standby) → once every informer has
synced, the elector (so a new leader always exports from a warm cache) → periodic housekeeping.
Stop order: stop leading (release the Lease) → informers → client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from app.api.models import (
    InformerStatus,
    LeadershipResponse,
    RuntimeEntry,
    SnapshotResponse,
    TerminalEntry,
    TerminalPage,
)
from app.api.routes import InvalidContinueToken
from app.config import Settings, unknown_env_vars
from app.kube.client import KubeClient
from app.kube.elector import ElectorConfig, KubeLeaseClient, LeaseElector, LeaseRecord, parse_lease
from app.kube.exact_list import list_at
from app.kube.informer import Informer, InformerOptions
from app.kube.informer_telemetry import InformerTelemetry
from app.kube.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS, ResourceKind
from app.metrics.exposition import MetricsExposition
from app.metrics.journal import CountJournal, counted_before
from app.metrics.telemetry import SelfTelemetry
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import CountableEvent
from app.trainer.projections import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
)
from app.trainer.state import TrainerState

log = logging.getLogger(__name__)

WATERMARK_ANNOTATION = "trainer-metrics.kubeflow.org/watermark"
_HOUSEKEEPING_INTERVAL = 1.0
_SETTLE_PAGE_TIMEOUT = 30.0  # seconds per page of the LIST at the hand-over watermark


Watermarks = dict[str, int]  # per watch stream: "" (all namespaces) or a namespace name


def format_watermarks(watermarks: Watermarks) -> str:
    """One stream: the bare resourceVersion; several: a JSON object by namespace."""
    if set(watermarks) == {""}:
        return str(watermarks[""])
    return json.dumps(watermarks, sort_keys=True, separators=(",", ":"))


def parse_watermarks(annotations: Mapping[str, str]) -> Watermarks | None:
    raw = annotations.get(WATERMARK_ANNOTATION)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, int) and not isinstance(value, bool):
        return {"": value}
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
    ):
        return value
    log.warning("ignoring malformed hand-over watermark %r in the Lease", raw[:64])
    return None


def _max_watermarks(a: Watermarks, b: Watermarks) -> Watermarks:
    """Per stream, the higher of two watermarks (a stream in either)."""
    return {stream: max(a.get(stream, -1), b.get(stream, -1)) for stream in a.keys() | b.keys()}


def _utc(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


class Service:
    """One replica of trainer-metrics. ``start()`` returns once background tasks run."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.debug_endpoints = settings.debug_endpoints
        self.terminal_page_max = settings.terminal_page_max

        self.registry = CollectorRegistry()
        self.telemetry = SelfTelemetry(self.registry)
        self.informer_telemetry = InformerTelemetry(self.registry)
        # The provider closes over self.state, built just below: runtime_info is read at render time only.
        self.metric_state = TrainerMetricState(runtime_provider=lambda: self.state.runtime_info())  # noqa: PLW0108
        self.journal = CountJournal(
            self.metric_state,
            journal_size=settings.handover_journal_size,
            telemetry=self.telemetry,
            # One TrainJob watch per configured namespace, else one over all namespaces.
            stream_of=_namespace_stream if settings.namespaces else None,
            on_uncertain=self._uncertain_pending,
        )
        self.state = TrainerState(
            self.journal,
            max_unknown_runtime_refs=settings.max_unknown_runtime_refs,
            on_limit=self.telemetry.limit_hit,
        )
        self.exposition = MetricsExposition(self.registry)

        self.client: KubeClient | None = None
        self.informers: list[Informer[Any]] = []
        self._trainjob_informers: list[Informer[Any]] = []
        self.elector: LeaseElector | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._failed: list[str] = []
        self._started_at = time.monotonic()
        self._seen_watermarks: Watermarks | None = None  # highest hand-over watermarks seen in the Lease
        self._seen_other_leader = False  # a Lease record held by another replica was seen
        self._settler: asyncio.Task[None] | None = None  # settles the journal's uncertain events

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
        self.informers = self._build_informers(self.client)
        for informer in self.informers:
            self._spawn(informer.run(), f"informer {informer.name}")
        self._spawn(self._housekeeping(), "housekeeping")
        self._spawn(self._lead_when_synced(), "leader election")

    async def kill(self) -> None:
        """Stop as a crashed process would: no Lease release (the chaos and hand-over tests use it)."""
        if self.elector is not None:
            self.elector.abandon_on_cancel()
        await self.stop()

    async def stop(self) -> None:
        if self._settler is not None:
            self._settler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._settler
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
        options = InformerOptions.from_settings(self.settings)
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        runtimes, jobs = self.state.runtime_handler, self.state.job_handler

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
            )

        self._trainjob_informers = [informer(TRAINJOBS, ns, TRAINJOB_PROJECTOR, jobs) for ns in scopes]
        return [
            informer(CLUSTER_TRAINING_RUNTIMES, None, CLUSTER_TRAINING_RUNTIME_PROJECTOR, runtimes),
            *(informer(TRAINING_RUNTIMES, ns, TRAINING_RUNTIME_PROJECTOR, runtimes) for ns in scopes),
            *self._trainjob_informers,
        ]

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

    async def _lead_when_synced(self) -> None:
        # Informers expose a flag, not an event; a short poll until the first sync is cheap.
        while not all(i.synced for i in self.informers):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        log.info(
            "informers synced",
            extra={"trainjobs": self._trainjob_count(), "runtimes": len(self.state.runtimes())},
        )
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
        await self._defer_to_warm_followers(leases)
        self.elector = LeaseElector(
            leases,
            config,
            _Callbacks(self),
            annotations=self._lease_annotations,
            on_observed=self._remember_watermark,
        )
        await self.elector.run()

    async def _defer_to_warm_followers(self, leases: KubeLeaseClient) -> None:
        """Hold back this replica's first candidacy for one lease duration if another replica holds
        the Lease. A replica that has just started saw nothing before its first list, so if the holder
        died, a warm follower (whose journal covers the gap) must take over rather than this one.
        """
        s = self.settings
        try:
            lease = await leases.get(s.lease_namespace, s.lease_name)
            record = parse_lease(lease) if lease is not None else None
        except Exception:  # unreadable or unreachable: the elector will sort it out
            record = None
        if record is None:
            return
        self._remember_watermark(record)
        if record.holder_identity and record.holder_identity != s.identity:
            # The Lease can only expire a lease duration after its last renew; warm candidates retry every
            # 1 to 2.2 retry periods (jittered), so three of those on top let them win a dead holder's Lease.
            wait = max(record.lease_duration_seconds, s.lease_duration_seconds) + 3 * s.retry_period_seconds
            log.info(
                "%s holds the Lease: waiting %.1f s before running for leadership, so that a warm "
                "replica takes over first if it has gone",
                record.holder_identity,
                wait,
            )
            await asyncio.sleep(wait)

    # --- leadership ------------------------------------------------------------------------------

    def _lease_annotations(self) -> dict[str, str]:
        # Never publish less than the Lease has said: a replica that led before and takes the Lease again
        # still holds its old term's watermark when the acquiring write is built (start_leading runs after
        # it), and writing that would let the next takeover recount what the leaders in between counted.
        watermarks = _max_watermarks(self.journal.watermarks, self._seen_watermarks or {})
        return {WATERMARK_ANNOTATION: format_watermarks(watermarks)} if watermarks else {}

    def _remember_watermark(self, record: LeaseRecord) -> None:
        if record.holder_identity and record.holder_identity != self.settings.identity:
            self._seen_other_leader = True
        watermarks = parse_watermarks(record.annotations)
        if watermarks is None:
            return
        seen = self._seen_watermarks if self._seen_watermarks is not None else {}
        for stream, rv in watermarks.items():
            if rv > seen.get(stream, -1):
                seen[stream] = rv
        self._seen_watermarks = seen

    def _takeover_floor(self, previous: LeaseRecord | None) -> Watermarks | int | None:
        """The resourceVersion up to which the previous leader counted (see app/metrics/journal.py).

        The record we took over says it; if its watermark is missing or unreadable, the highest one
        seen in the Lease while following is the best knowledge. With none at all: 0 (count all we
        remember) when no other replica was ever seen holding the Lease, since then nobody else counted;
        otherwise None (unknown: count only from now on) rather than recount another leader's events.
        """
        if previous is not None:
            watermarks = parse_watermarks(previous.annotations)
            if watermarks is not None:
                # Every watermark a leader published was counted up to, so a lower value than one seen
                # before (a Lease written by an older version, or restored) must not lower the floor.
                return _max_watermarks(watermarks, self._seen_watermarks or {})
        if self._seen_watermarks is not None:
            return dict(self._seen_watermarks)
        return 0 if not self._seen_other_leader else None

    def _start_exporting(self, previous: LeaseRecord | None) -> None:
        floor = self._takeover_floor(previous)
        replayed = self.journal.start_leading(floor)
        self.exposition.set_trainer_source(self.metric_state)
        log.info(
            "started leading: exporting the Trainer metrics",
            extra={"previous_watermark": floor, "replayed_events": replayed},
        )

    def _uncertain_pending(self) -> None:
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(
                self._settle_uncertain(), name="settle uncertain edges"
            )

    async def _settle_uncertain(self) -> None:
        """Settle the edges the journal holds as uncertain (app/metrics/journal.py, ``take_uncertain``):
        read the TrainJobs as they were at the floor, one paginated LIST per stream and floor, and count
        each edge the previous leader had not. If that read fails (the revision was compacted away, or the
        API is down), count them all: counting twice is the lesser harm than losing them."""
        while self.journal.leading:
            batch = self.journal.take_uncertain()
            if not batch:
                return
            groups: dict[tuple[str, int], list[CountableEvent]] = {}
            for event, stream, floor in batch:
                groups.setdefault((stream, floor), []).append(event)
            for (stream, floor), events in groups.items():
                at_floor: dict[str, bool] | None
                try:
                    at_floor = await self._terminal_at(stream or None, floor)
                except Exception as exc:
                    log.warning(
                        "could not read the TrainJobs at the hand-over watermark %s (%s): counting %d "
                        "edges whose hand-over is uncertain; some may be counted twice",
                        floor,
                        exc,
                        len(events),
                    )
                    at_floor = None
                counted = 0
                for event in events:
                    count = at_floor is None or not counted_before(event, at_floor)
                    counted += count
                    self.journal.settle(event, count)
                log.info(
                    "settled %d edges found by a relist across the hand-over watermark %s: %d counted, "
                    "%d already counted by the previous leader",
                    len(events),
                    floor,
                    counted,
                    len(events) - counted,
                )

    async def _terminal_at(self, namespace: str | None, resource_version: int) -> dict[str, bool]:
        """uid -> terminal, for every TrainJob as it was at ``resource_version``."""
        assert self.client is not None
        out: dict[str, bool] = {}
        items = list_at(
            self.client,
            TRAINJOBS,
            namespace,
            resource_version,
            page_size=self.settings.list_page_size,
            timeout=_SETTLE_PAGE_TIMEOUT,
        )
        async for item in items:
            job = TRAINJOB_PROJECTOR.from_json(item)
            if job is not None:
                out[job.uid] = bool(job.result)
        return out

    def _stop_exporting(self) -> None:
        # Count the creations still waiting for their runtime (with what is known now) so that the
        # watermark published at release covers them: the next leader skips everything up to it.
        self.state.flush_pending(math.inf)
        # Unregister first: from this instant no scrape of this replica shows Trainer metrics.
        self.exposition.set_trainer_source(None)
        watermark = self.journal.stop_leading()
        log.info("stopped leading: Trainer metrics no longer exported", extra={"watermark": watermark})

    # --- views for the routes ----------------------------------------------------------------------

    def liveness_problems(self) -> list[str]:
        return [f"background task {what} died" for what in self._failed]

    def readiness_problems(self) -> list[str]:
        problems = []
        for informer in self.informers:
            if not informer.synced:
                problems.append(f"informer {informer.name} has not synced")
            elif informer.stale:
                problems.append(f"informer {informer.name} is stale (no watch activity)")
        if not self.informers:
            problems.append("informers not started")
        return problems + self.liveness_problems()

    async def render_metrics(
        self, accept: str | None, accept_encoding: str | None
    ) -> tuple[bytes, dict[str, str]]:
        body, headers = await self.exposition.build_metrics_response_async(accept, accept_encoding)
        return body, headers

    def _trainjob_count(self) -> int:
        return sum(len(i) for i in self._trainjob_informers)

    def snapshot(self) -> SnapshotResponse:
        now = time.monotonic()
        runtimes = [
            RuntimeEntry(
                runtime_ref=r.ref,
                kind=r.kind,
                namespace=r.namespace,
                name=r.name,
                ml_policy=r.ml_policy,
                pod_group_policy=r.pod_group_policy,
                framework=r.framework,
                num_nodes=r.num_nodes,
                accelerator_class=r.accelerator_class,
                accelerators_per_node=r.accelerators_per_node,
                resource_version=r.resource_version,
            )
            for r in sorted(self.state.runtimes(), key=lambda r: r.ref)
        ]
        informers = [
            InformerStatus(
                name=i.name,
                synced=i.synced,
                stale=i.stale,
                objects=len(i),
                resource_version=i.resource_version,
                last_event_age_seconds=round(now - i.last_event, 3),
            )
            for i in self.informers
        ]
        return SnapshotResponse(
            runtimes=runtimes,
            informers=informers,
            trainjobs=self._trainjob_count(),
            terminal_entries=self.state.terminal_count,
            unknown_runtime_refs=self.state.unknown_runtime_refs,
        )

    def terminal_page(self, limit: int, continue_token: str | None) -> TerminalPage:
        try:
            entries, next_token = self.state.terminal_entries(limit, continue_token)
        except ValueError as exc:
            raise InvalidContinueToken(str(exc)) from None
        items = [
            TerminalEntry(
                namespace=e.namespace,
                name=e.name,
                uid=e.uid,
                result=e.result,
                reason=e.reason,
                terminal_time=_utc(e.terminal_time),
                recorded_time=datetime.fromtimestamp(e.recorded_time, UTC),
            )
            for e in entries
        ]
        return TerminalPage(total=self.state.terminal_count, items=items, continue_=next_token)

    def leadership(self) -> LeadershipResponse:
        s = self.settings
        if self.elector is None:
            return LeadershipResponse(
                identity=s.identity,
                is_leader=self.journal.leading,
                election_enabled=s.leader_election,
                holder=s.identity if self.journal.leading else None,
                lease_name=s.lease_name,
                lease_namespace=s.lease_namespace,
                acquire_time=None,
                renew_time=None,
                lease_transitions=None,
                watermark=self.journal.watermark,
                watermarks=self.journal.watermarks,
                observed_watermark=None,
                transitions_seen=0,
                last_change=None,
            )
        st = self.elector.status()
        observed_streams = parse_watermarks(st.annotations)
        observed = max(observed_streams.values(), default=None) if observed_streams else None
        return LeadershipResponse(
            identity=st.identity,
            is_leader=st.is_leader,
            election_enabled=True,
            holder=st.holder,
            lease_name=st.lease_name,
            lease_namespace=st.lease_namespace,
            acquire_time=st.acquire_time,
            renew_time=st.renew_time,
            lease_transitions=st.lease_transitions,
            watermark=self.journal.watermark,
            watermarks=self.journal.watermarks,
            observed_watermark=observed,
            transitions_seen=st.transitions_seen,
            last_change=st.last_change,
        )


class _Callbacks:
    def __init__(self, service: Service) -> None:
        self._service = service

    def on_started_leading(self, previous: LeaseRecord | None) -> None:
        self._service._start_exporting(previous)

    def on_stopped_leading(self) -> None:
        self._service._stop_exporting()

    def on_new_leader(self, identity: str | None) -> None:
        pass  # the elector logs it; the service acts only on its own leadership


def _namespace_stream(event: CountableEvent) -> str:
    return event.namespace
