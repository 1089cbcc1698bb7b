"""The pod series of one replica: the pods watch (one per watched namespace, else one over all), its access
check, and the series it feeds (app/metrics/pods.py), wired to the TrainJob informers' handler.

Pods are optional: an exporter installed without get/list/watch on pods (403), or an API server that serves
no pods (404), keeps everything else. The watch asks first (a LIST of one pod with the watch's label
selector); refused, it says so in one log line, reports ``forbidden`` or ``absent`` in /debug/snapshot and in
``trainer_metrics_pod_watch_status``, and asks again every ``recheck`` seconds (a Role granted later is
picked up, and logged). The pods informers are not among the ones readiness and leadership wait for: a pods
watch that is refused, or slow to sync, never makes a replica unready nor keeps it from leading. They start
once the TrainJob informers have synced (app/replica/service.py), and each tells the hand-over its first
list (``connect``'s ``on_listed``): until then the replica covers no pods floor (app/handover/coverage.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry

from app.config import Settings
from app.handover.streams import pod_stream
from app.kube.client import ApiError, KubeClient
from app.kube.informer import Informer, InformerOptions
from app.kube.informer_telemetry import InformerTelemetry
from app.kube.priority import LoopPriority
from app.metrics.pods import PodJobHandler, PodSeries, PodSeriesHandler, PodSeriesTelemetry
from app.trainer import rules
from app.trainer.events import TrainerSink
from app.trainer.field_builders import object_key
from app.trainer.pod_failures import PodFailures
from app.trainer.pods import PODS, PodProjection, PodProjector
from app.trainer.projection_types import TrainJobProjection

log = logging.getLogger(__name__)

RECHECK_INTERVAL: Final = 60.0  # a refused pods watch asks again this often
_RETRY_INTERVAL: Final = 5.0  # after an answer that says nothing (unreachable, 5xx, throttled)
_REQUEST_TIMEOUT: Final = 10.0
CHECKING: Final = "checking"
WATCHING: Final = "watching"
FORBIDDEN: Final = "forbidden"
ABSENT: Final = "absent"
OFF: Final = "off"


class PodWatch:
    """One scope's pods watch: its access checked, then its informer run until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str | None,
        make_informer: Callable[[str | None], Informer[PodProjection]],
        *,
        recheck: float = RECHECK_INTERVAL,
    ) -> None:
        self._client = client
        self.namespace = namespace
        self._make_informer = make_informer
        self._recheck = recheck
        self.status = CHECKING
        self.reason = ""  # the refusal, while forbidden or absent
        self.informer: Informer[PodProjection] | None = None  # built once access is granted

    @property
    def name(self) -> str:
        return f"pods/{self.namespace}" if self.namespace else "pods"

    async def run(self) -> None:
        """Until cancelled: ask until the pods may be listed, then watch them."""
        while (verdict := await self._check()) != WATCHING:
            if verdict in (FORBIDDEN, ABSENT) and self.status != verdict:
                log.warning(
                    "pods watch %s: %s (%s): no pod series (pod_info, allocated_accelerators, restarts) "
                    "for %s; everything else works. %s Asking again every %g s.",
                    self.name,
                    verdict,
                    self.reason,
                    f"namespace {self.namespace}" if self.namespace else "any namespace",
                    "Grant get, list and watch on pods (the chart does; pod_series=false turns them off)."
                    if verdict == FORBIDDEN
                    else "This API server serves no pods.",
                    self._recheck,
                )
                self.status = verdict
            await asyncio.sleep(self._recheck if verdict in (FORBIDDEN, ABSENT) else _RETRY_INTERVAL)
        if self.status in (FORBIDDEN, ABSENT):
            log.info("pods watch %s: pods may be listed now: watching", self.name)
        self.status, self.reason = WATCHING, ""
        self.informer = self._make_informer(self.namespace)
        await self.informer.run()

    async def _check(self) -> str:
        """WATCHING when the pods may be listed, FORBIDDEN or ABSENT, or CHECKING when the answer says
        nothing about access (unreachable, throttled, a server error)."""
        path = PODS.collection_path(self.namespace)
        try:
            await self._client.request_json(
                "GET",
                path,
                query={"limit": "1", "labelSelector": rules.POD_SELECTOR},
                timeout=_REQUEST_TIMEOUT,
            )
        except ApiError as exc:
            if exc.status in (403, 404):
                self.reason = f"{exc.status} {exc.reason}".strip()
                return FORBIDDEN if exc.status == 403 else ABSENT
            return CHECKING
        except Exception:  # a bug here must not end the task: ask again
            log.exception("pods watch %s: checking access failed", self.name)
            return CHECKING
        return WATCHING


class TrainJobCaches:
    """The TrainJob informers' caches, read by namespace and name (``TrainJobLookup``): where the pod series
    and the pod-failure edges find a pod's TrainJob, so that neither keeps a copy of every TrainJob."""

    def __init__(self) -> None:
        self._all: Informer[TrainJobProjection] | None = None  # the one over all namespaces
        self._by_namespace: dict[str, Informer[TrainJobProjection]] = {}

    def read(self, informers: list[Informer[TrainJobProjection]]) -> None:
        """The TrainJob informers to read: one over all namespaces, or one per watched namespace."""
        self._all = next((i for i in informers if i.namespace is None), None)
        self._by_namespace = {i.namespace: i for i in informers if i.namespace is not None}

    def get(self, namespace: str, name: str) -> TrainJobProjection | None:
        informer = self._all if self._all is not None else self._by_namespace.get(namespace)
        return informer.get(object_key(namespace, name)) if informer is not None else None


class PodHandlers:
    """``InformerHandler[PodProjection]`` of the pods watch: the pod series, then the pod-failure edges."""

    def __init__(
        self, series: PodSeriesHandler, failures: PodFailures, *, on_synced: Callable[[str], None]
    ) -> None:
        self._series = series
        self._failures = failures
        self.on_synced = on_synced  # the first list's resourceVersion (the hand-over's coverage)

    def on_added(self, obj: PodProjection, initial: bool) -> None:
        self._series.on_added(obj, initial)
        self._failures.on_added(obj, initial)

    def on_updated(self, old: PodProjection, new: PodProjection) -> None:
        self._series.on_updated(old, new)
        self._failures.on_updated(old, new)

    def on_deleted(self, last: PodProjection) -> None:
        self._series.on_deleted(last)
        self._failures.on_deleted(last)

    def on_relist(self, since: int | None) -> None:
        self._failures.on_relist(since)


class PodSeriesFeature:
    """The pod series of one replica (``pod_series``): their families for the Trainer exposition (leader
    only), the handler that joins them to the TrainJobs, the pod-failure edges (counted through the
    journal, ``connect``), the pods watches, and their self-telemetry (every replica). Off, it adds no
    family, no handler, no edge and no watch."""

    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry,
        *,
        on_change: Callable[[], None],
        on_limit: Callable[[str], None],
    ) -> None:
        self.enabled = settings.pod_series
        self._namespaces = list(settings.namespaces)
        self._on_limit = on_limit
        self.trainjobs = TrainJobCaches()
        self.series = PodSeries(
            self.trainjobs.get,
            max_pods=settings.pod_series_max_pods,
            max_accelerator_classes=settings.max_accelerator_classes,
            on_change=on_change,
            on_limit=on_limit,
        )
        self.failures = PodFailures(
            self.trainjobs.get, max_reasons=settings.max_failure_reasons, on_limit=on_limit
        )
        self.projector = PodProjector(
            rules.AcceleratorMatcher(settings.accelerator_resource_patterns), self.trainjobs.get
        )
        self.pod_watches: list[PodWatch] = []
        self._on_listed: Callable[[str, str], None] = lambda stream, rv: None  # set by ``connect``
        registry.register(PodSeriesTelemetry(self.series, self.statuses))

    @property
    def families(self) -> tuple[Any, ...]:
        return self.series.families if self.enabled else ()

    def connect(
        self,
        sink: TrainerSink,
        runtime_label: Callable[[str], str],
        on_listed: Callable[[str, str], None],
    ) -> None:
        """The pod failures go to ``sink`` (the hand-over journal), labelled by TrainerState's
        ``runtime_ref_label``; each pods watch's first list is told to ``on_listed(stream, rv)`` (the
        hand-over's ``stream_listed``)."""
        self.failures.connect(sink, runtime_label)
        self._on_listed = on_listed

    def streams(self) -> list[str]:
        """The hand-over streams of the pods watches this replica runs (app/handover/streams.py)."""
        return [pod_stream(ns) for ns in self._scopes()] if self.enabled else []

    def _scopes(self) -> list[str | None]:
        return list(self._namespaces) or [None]

    def job_handler(self, inner: Any) -> Any:
        """The TrainJob informers' handler, with the pod series told of each TrainJob (when on)."""
        if not self.enabled:
            return inner
        return PodJobHandler(inner, self.series)

    def read_trainjobs(self, informers: list[Informer[TrainJobProjection]]) -> None:
        """The TrainJob informers whose caches the pod series and the pod-failure edges read."""
        self.trainjobs.read(informers)

    def watches(
        self,
        client: KubeClient,
        options: InformerOptions,
        telemetry: InformerTelemetry,
        priority: LoopPriority,
    ) -> list[PodWatch]:
        """The pods watches to run (none when off): one per watched namespace, else one over all."""
        if not self.enabled:
            return []
        series = PodSeriesHandler(self.series)

        def informer(namespace: str | None) -> Informer[PodProjection]:
            stream = pod_stream(namespace)

            def listed(rv: str) -> None:
                self._on_listed(stream, rv)

            return Informer(
                client,
                PODS,
                namespace,
                self.projector,
                PodHandlers(series, self.failures, on_synced=listed),
                options=options,
                telemetry=telemetry,
                on_limit=self._on_limit,
                priority=priority,
                label_selector=rules.POD_SELECTOR,
            )

        self.pod_watches = [PodWatch(client, ns, informer, recheck=RECHECK_INTERVAL) for ns in self._scopes()]
        return self.pod_watches

    def statuses(self) -> dict[str, str]:
        """Each scope's pods watch status, by namespace ("" for all namespaces)."""
        if not self.enabled:
            return {"": OFF}
        if not self.pod_watches:
            return {ns: CHECKING for ns in self._namespaces} or {"": CHECKING}
        return {w.namespace or "": w.status for w in self.pod_watches}
