"""Helpers of the suites that run service replicas in the test's process (tests/support/replica_inprocess.py)
against a simulated cluster: Trainer manifests and status writes, "the service has caught up with the
store", and the leadership record of several replicas (taps, the Lease's writes, who exports when)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.metrics import counted
from app.replica.service import Service
from tests.support.replica_inprocess import Replica, replica
from tests.support.waiting import eventually

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
CREATED = "kubeflow_trainer_trainjob_created_total"
FINISHED = "kubeflow_trainer_trainjob_finished_total"
JOBS = "kubeflow_trainer_trainjobs"
RUNTIME_INFO = "kubeflow_trainer_runtime_info"
LIFETIME = "kubeflow_trainer_trainjob_lifetime_seconds"
NODES = "kubeflow_trainer_trainjob_requested_training_nodes_per_job"
ACCELERATORS = "kubeflow_trainer_trainjob_requested_accelerators"


def cluster_ref(name: str) -> str:
    """runtime_ref label of a ClusterTrainingRuntime."""
    return f"trainer.kubeflow.org/ClusterTrainingRuntime//{name}"


def trainjob_manifest(
    name: str,
    *,
    runtime: str = "torch-distributed",
    kind: str | None = None,
    api_group: str | None = None,
    num_nodes: Any = None,
    suspend: bool | None = None,
    gpus_per_node: int | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A TrainJob as a user writes it (runtimeRef apiGroup/kind default as in the CRD when omitted)."""
    ref: dict[str, Any] = {"name": runtime}
    if kind is not None:
        ref["kind"] = kind
    if api_group is not None:
        ref["apiGroup"] = api_group
    spec: dict[str, Any] = {"runtimeRef": ref}
    trainer: dict[str, Any] = {}
    if num_nodes is not None:
        trainer["numNodes"] = num_nodes
    if gpus_per_node is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus_per_node)}}
    if trainer:
        spec["trainer"] = trainer
    if suspend is not None:
        spec["suspend"] = suspend
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": meta, "spec": spec}


ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def runtime_manifest(
    name: str,
    *,
    namespace: str | None = None,
    num_nodes: Any = None,
    ml_policy: str = "torch",
    framework: str = "torch",
    pod_group_policy: str | None = None,
    gpus_per_node: int | None = None,
) -> dict[str, Any]:
    """A TrainingRuntime (``namespace`` given) or ClusterTrainingRuntime with a trainer ``node`` job."""
    policy: dict[str, Any] = {ml_policy: {}}
    if num_nodes is not None:
        policy["numNodes"] = num_nodes
    container: dict[str, Any] = {"name": "node", "image": "example/trainer:1"}
    if gpus_per_node is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus_per_node)}}
    spec: dict[str, Any] = {
        "mlPolicy": policy,
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            # As every real runtime's trainer job: the controller gives mlPolicy.numNodes to,
                            # and merges resourcesPerNode into, the job labelled ancestor "trainer" only.
                            "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                            "spec": {"template": {"spec": {"containers": [container]}}},
                        },
                    }
                ]
            }
        },
    }
    if pod_group_policy is not None:
        spec["podGroupPolicy"] = {pod_group_policy: {}}
    meta: dict[str, Any] = {"name": name, "labels": {"trainer.kubeflow.org/framework": framework}}
    if namespace is not None:
        meta["namespace"] = namespace
    kind = "TrainingRuntime" if namespace is not None else "ClusterTrainingRuntime"
    return {"apiVersion": TRAINER_API_VERSION, "kind": kind, "metadata": meta, "spec": spec}


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def condition(
    cond_type: str, status: str = "True", reason: str = "", when: float | None = None
) -> dict[str, Any]:
    return {
        "type": cond_type,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": rfc3339(time.time() if when is None else when),
    }


def running_status() -> dict[str, Any]:
    return {"jobsStatus": [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0}]}


def terminal_status(result: str = "Complete", reason: str = "", when: float | None = None) -> dict[str, Any]:
    """Complete=True (``result="Complete"``) or Failed=True with ``reason``."""
    if result == "Complete":
        cond = condition("Complete", reason=reason or "JobsCompleted", when=when)
    else:
        cond = condition("Failed", reason=reason or "FailedJobs", when=when)
    return {"conditions": [cond], "jobsStatus": [{"name": "node", "active": 0, "succeeded": 1, "failed": 0}]}


def write_status(store: Any, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """A controller's status write (merge patch of the status subresource)."""
    from app.trainer.kinds import TRAINJOBS

    result: dict[str, Any] = store.patch(TRAINJOBS, namespace, name, {"status": status}, subresource="status")
    return result


def last_write_rv(store: Any, resource: Any) -> int:
    """resourceVersion of the last write (create, update or delete) to ``resource`` the store remembers;
    after a compaction, the newest live object's (the informer relists at the store's revision anyway)."""
    events = store.events_since(resource, store.horizon)
    newest: int = events[-1].rv if events else 0
    return max([newest, *(int(e.rv) for e in store.entries(resource, None))])


def caches_match_store(service: Service, store: Any) -> bool:
    """Every informer has processed every write to its resource, its cache holds exactly what the store
    holds (same keys, same resourceVersions), and no JobCreated waits for a runtime."""
    for informer in service.informers:
        if not informer.synced:
            return False
        rv = informer.resource_version
        if not rv.isdigit() or int(rv) < last_write_rv(store, informer.resource):
            return False
        want = {
            (f"{e.key[0]}/{e.key[1]}" if e.key[0] else e.key[1]): str(e.rv)
            for e in store.entries(informer.resource, informer.namespace)
        }
        have = {key: obj.resource_version for key, obj in informer.items()}
        if want != have:
            return False
    return service.state.pending_count == 0


async def wait_caught_up(r: Replica, store: Any, *, timeout: float = 30.0) -> None:
    await eventually(lambda: caches_match_store(r.service, store), timeout=timeout, what="caches == store")


async def wait_leading(r: Replica, *, timeout: float = 20.0) -> None:
    """Until this replica leads (or, without election, exports) the Trainer metrics."""

    async def leading() -> bool:
        resp = await r.http.get("/debug/leadership")
        return resp.status_code == 200 and bool(resp.json()["is_leader"])

    await eventually(leading, timeout=timeout, what=f"{r.identity} leading")


_LEADER_GAUGE = re.compile(r"^trainer_metrics_leader (\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class CountedEvent:
    """One countable event as a replica's metric state counted it (see ``tap_counted``)."""

    at: float  # time.monotonic() when counted
    identity: str
    kind: str  # "created" | "finished"
    uid: str
    rv: int
    labels: tuple[str, ...]  # the counter's label values, in the metric's declared order


def tap_counted(service: Service, sink: list[CountedEvent]) -> None:
    """Record every event ``service`` counts into ``sink`` (wraps its metric state; counting unchanged).
    Both ways in are wrapped: the served ledger calls ``count``, a sink without one ``on_countable``."""
    state = service.metric_state
    on_countable, count = state.on_countable, state.count
    identity = service.settings.identity

    def record(event: Any) -> None:
        if hasattr(event, "result"):
            labels: tuple[str, ...] = (event.result, event.reason, event.runtime_ref)
            kind = "finished"
        elif hasattr(event, "requested_nodes"):
            labels, kind = (event.namespace, event.runtime_ref), "created"
        else:  # time to running, admission wait: histograms only, not the counters compared here
            return
        sink.append(CountedEvent(time.monotonic(), identity, kind, event.uid, event.rv, labels))

    def tapped_on_countable(event: Any) -> None:
        record(event)
        on_countable(event)

    def tapped_count(event: Any) -> Any:
        record(event)
        return count(event)

    state.on_countable = tapped_on_countable  # type: ignore[method-assign]
    state.count = tapped_count  # type: ignore[method-assign]


@dataclass(frozen=True)
class LeadershipChange:
    """A replica started or stopped leading (exporting the Trainer metrics), see ``tap_leadership``."""

    at: float  # time.monotonic() of the change, as it happened (not when a test's poll noticed it)
    identity: str
    leading: bool


def tap_leadership(service: Service, sink: list[LeadershipChange]) -> None:
    """Record each instant ``service``'s journal starts or stops leading into ``sink`` (else unchanged)."""
    journal = service.journal
    identity = service.settings.identity
    start, stop = journal.start_leading, journal.stop_leading

    def start_leading(*args: Any, **kwargs: Any) -> Any:
        sink.append(LeadershipChange(time.monotonic(), identity, True))
        return start(*args, **kwargs)

    def stop_leading(*args: Any, **kwargs: Any) -> Any:
        sink.append(LeadershipChange(time.monotonic(), identity, False))
        return stop(*args, **kwargs)

    journal.start_leading = start_leading  # type: ignore[method-assign]
    journal.stop_leading = stop_leading  # type: ignore[method-assign]


@dataclass(frozen=True)
class LeaseWrite:
    """One committed write of the Lease, as the API server stored it."""

    at: float  # time.monotonic() of the commit
    rv: int
    holder: str
    renew_time: str | None  # spec.renewTime (MicroTime), as written
    annotations: dict[str, str]
    deleted: bool = False


class LeaseLog:
    """Every committed write of one Lease in ``store`` (a synchronous store subscription), in order.

    ``with LeaseLog(store) as leases``: what each holder wrote and when, so a test reads "the last renew
    before the takeover" from the record instead of sampling the Lease at a moment it hopes is right."""

    def __init__(self, store: Any, namespace: str = "default", name: str = "trainer-metrics") -> None:
        self.store = store
        self.namespace, self.name = namespace, name
        self.writes: list[LeaseWrite] = []
        self._unsubscribe: Callable[[], None] | None = None

    def _on_event(self, event: Any) -> None:
        if getattr(event.resource, "plural", None) != "leases":
            return
        obj = event.entry.obj
        meta = obj.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) != (self.namespace, self.name):
            return
        spec = obj.get("spec") or {}
        self.writes.append(
            LeaseWrite(
                time.monotonic(),
                int(event.rv),
                spec.get("holderIdentity") or "",
                spec.get("renewTime"),
                dict(meta.get("annotations") or {}),
                deleted=event.type == "DELETED",
            )
        )

    def __enter__(self) -> LeaseLog:
        self._unsubscribe = self.store.subscribe(self._on_event)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def by(self, holder: str, *, after: float = float("-inf")) -> list[LeaseWrite]:
        return [w for w in self.writes if w.holder == holder and w.at > after and not w.deleted]

    def last_before_takeover(self, old: str, new: str) -> LeaseWrite:
        """``old``'s last write before the first write naming ``new`` (what ``new`` took over)."""
        first_new = next(i for i, w in enumerate(self.writes) if w.holder == new)
        return next(w for w in reversed(self.writes[:first_new]) if w.holder == old)


def counter_values(service: Service) -> dict[str, dict[tuple[str, ...], int]]:
    """The replica's Trainer counters as its metric state holds them (what it exports while leading)."""
    state = service.metric_state
    return {
        "created": dict(state.counter(counted.CREATED).values),
        "finished": dict(state.counter(counted.FINISHED).values),
    }


@dataclass
class ExporterSample:
    at: float
    atomic: tuple[str, ...]  # identities whose exposition held the Trainer source, one synchronous instant
    http: dict[str, tuple[bool, float | None]]  # identity -> (/metrics has kubeflow_trainer_, leader gauge)
    stable: bool  # no replica changed its exposition state while the round's scrapes ran
    gap_allowed: bool


class ExporterSampler:
    """Samples which replicas export Trainer metrics, every ``interval`` seconds, in the background.

    Each round takes (1) a synchronous look at every replica's exposition (one event-loop instant, so it
    is exactly "who exports now") and (2) a scrape of every replica's ``/metrics``. Violations: two
    exporters at one instant; zero exporters outside a window opened by ``allow_gap``; a /metrics that
    disagrees with the exposition state, or whose ``trainer_metrics_leader`` disagrees with it.
    """

    def __init__(self, replicas: list[Replica], *, interval: float = 0.015) -> None:
        self.replicas = replicas
        self.interval = interval
        self.samples: list[ExporterSample] = []
        self.violations: list[str] = []
        self.gaps: list[float] = []  # instants with no exporter outside an allowed gap: violations
        self.gap_allowed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._closed: set[str] = set()
        self._started = 0.0
        self.duration = 0.0
        self.atomic_checks = 0

    def allow_gap(self, allowed: bool) -> None:
        self.gap_allowed = allowed

    def retire(self, replica: Replica) -> None:
        """Stop scraping a replica whose HTTP client is about to close (it is still checked atomically)."""
        self._closed.add(replica.identity)

    def _atomic(self) -> tuple[str, ...]:
        return tuple(r.identity for r in self.replicas if r.service.exposition.trainer_source is not None)

    async def _round(self) -> None:
        before, before_at = self._atomic(), time.monotonic()
        gap_allowed = self.gap_allowed
        http: dict[str, tuple[bool, float | None]] = {}
        for r in list(self.replicas):
            if r.identity in self._closed:
                continue
            text = await r.metrics_text()
            gauge = _LEADER_GAUGE.search(text)
            http[r.identity] = ("kubeflow_trainer_" in text, float(gauge.group(1)) if gauge else None)
        after = self._atomic()
        gap_allowed = gap_allowed and self.gap_allowed
        sample = ExporterSample(time.monotonic(), after, http, before == after, gap_allowed)
        self.samples.append(sample)
        for atomic, at in ((before, before_at), (after, sample.at)):
            if len(atomic) > 1:
                self.violations.append(f"{at:.3f}: two exporters at one instant: {atomic}")
            if not atomic and not (gap_allowed or self.gap_allowed):
                self.gaps.append(at)
        if sample.stable:
            for identity, (exporting, leader_gauge) in http.items():
                if exporting != (identity in after):
                    self.violations.append(f"{sample.at:.3f}: {identity} /metrics exporting={exporting}")
                if leader_gauge != (1.0 if identity in after else 0.0):
                    self.violations.append(f"{sample.at:.3f}: {identity} leader gauge {leader_gauge}")
            if sum(1 for exporting, _ in http.values() if exporting) > 1:
                self.violations.append(f"{sample.at:.3f}: two /metrics with Trainer series: {http}")

    async def _run(self) -> None:
        while True:
            await self._round()
            await asyncio.sleep(self.interval)

    async def _run_atomic(self) -> None:
        # Between the (slower) scrape rounds: the exposition state of all replicas, every few ms.
        while True:
            atomic = self._atomic()
            self.atomic_checks += 1
            if len(atomic) > 1:
                self.violations.append(f"{time.monotonic():.3f}: two exporters at one instant: {atomic}")
            if not atomic and not self.gap_allowed:
                self.gaps.append(time.monotonic())
            await asyncio.sleep(self.interval / 3)

    def start(self) -> ExporterSampler:
        self.atomic_checks = 0
        self._started = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._run(), name="exporter sampler"),
            asyncio.create_task(self._run_atomic(), name="exporter sampler (atomic)"),
        ]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.duration = time.monotonic() - self._started

    def describe(self) -> str:
        rounds = len(self.samples)
        return (
            f"{rounds} scrape rounds ({1000 * self.duration / max(rounds, 1):.0f} ms apart) and "
            f"{self.atomic_checks} instant checks in {self.duration:.1f} s"
        )

    def first_exporting(self, identity: str, after: float) -> float | None:
        """Monotonic time of the first sample after ``after`` in which ``identity`` exported."""
        return next((s.at for s in self.samples if s.at > after and identity in s.atomic), None)

    def last_exporting(self, identity: str) -> float | None:
        return next((s.at for s in reversed(self.samples) if identity in s.atomic), None)

    def assert_clean(self, *, excused: Sequence[tuple[float, float]] = ()) -> None:
        """No violation, except "no exporter" at an instant inside one of the ``excused`` windows (closed,
        monotonic): a step-down the test proved was the elector's own, and not what the test is about."""
        gaps = [
            f"{at:.3f}: no exporter outside a hand-over"
            for at in self.gaps
            if not any(start <= at <= end for start, end in excused)
        ]
        assert self.samples, "the sampler took no sample"
        left = self.violations + gaps
        assert not left, "\n".join(left[:20])


class Fleet:
    """Several replicas in one test, each with its own kubeconfig/client, their counted events tapped.

    Enter it with ``async with Fleet(tmp_path) as fleet``; leaving stops every replica still running."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.replicas: list[Replica] = []
        self.counted: list[CountedEvent] = []
        self.changes: list[LeadershipChange] = []
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Fleet:
        await self._stack.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stack.__aexit__(*exc)

    async def add(self, kubeconfig: Path, identity: str, **overrides: Any) -> Replica:
        r = await self._stack.enter_async_context(replica(kubeconfig, identity, **overrides))
        tap_counted(r.service, self.counted)
        tap_leadership(r.service, self.changes)
        self.replicas.append(r)
        return r

    def started(self, identity: str, *, after: float = float("-inf")) -> float | None:
        """When ``identity`` first started leading after ``after`` (monotonic), as recorded."""
        return next(
            (c.at for c in self.changes if c.identity == identity and c.leading and c.at > after), None
        )

    def stopped(self, identity: str, *, after: float = float("-inf")) -> float | None:
        """When ``identity`` first stopped leading after ``after`` (monotonic), as recorded."""
        return next(
            (c.at for c in self.changes if c.identity == identity and not c.leading and c.at > after), None
        )

    async def wait_counted(self, r: Replica, n: int, *, timeout: float = 20.0) -> None:
        """Until ``r`` has counted ``n`` more events than it had when called (it leads, and the workload
        runs through it): a term's worth of work, however fast the machine is."""
        start = len(self.counted)

        def enough() -> bool:
            return sum(1 for e in self.counted[start:] if e.identity == r.identity) >= n

        await eventually(enough, timeout=timeout, what=f"{r.identity} to count {n} more events")

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.service.client is not None]

    def leaders(self) -> list[Replica]:
        return [r for r in self.replicas if r.service.journal.leading]

    def by_identity(self, identity: str) -> Replica:
        return next(r for r in self.replicas if r.identity == identity)

    async def wait_leader(self, *, timeout: float = 10.0) -> Replica:
        leaders: list[Replica] = await eventually(self.leaders, timeout=timeout, what="a leader")
        assert len(leaders) == 1, [r.identity for r in leaders]
        return leaders[0]

    async def wait_candidates(self, *, timeout: float = 10.0) -> None:
        """Every live replica has synced its informers and runs its elector."""

        def ready() -> bool:
            return all(
                r.service.elector is not None and all(i.synced for i in r.service.informers)
                for r in self.alive()
            )

        await eventually(ready, timeout=timeout, what="all replicas synced and electing")

    def caught_up(self, resource_version: int) -> bool:
        """Every live replica's TrainJob informers have seen ``resource_version``."""
        return all(
            int(i.resource_version or 0) >= resource_version
            for r in self.alive()
            for i in r.service.informers
            if i.resource.plural == "trainjobs"
        )
