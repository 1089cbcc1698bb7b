"""Replicas of the real service, each a real HTTP server on its own loopback port, against one simulated
cluster with a seeded workload generator, all on an event loop in a background thread; and a real
Prometheus scraping every replica slot (each slot's socket is bound when the fleet starts and held until it
stops, tests/support/slots.py, so no two targets can share a port; a slot not running is a target that is
down).

A replica is the in-process runner's (tests/support/replica_inprocess.py) with the app's lifespan on, as the
CLI runs it, stopped the way Kubernetes stops a pod: ``graceful_stop`` is SIGTERM (app/serving/graceful.py:
hand over while still serving, then shut down and release the Lease), ``kill`` a crash (no hand-over, no
release). Each replica gets a new identity (a pod name) and its own ``pod`` target label, as a Deployment's
pods do. ``InProcessService`` is a fleet of one, as ``trainer-metrics --simulate`` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from app.config import Settings
from app.handover.watermarks import WATERMARK_ANNOTATION, parse_watermarks
from app.replica.service import Service
from app.trainer.events import CountableEvent
from kubesim.apiserver.core import LEASES
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.table import WatchEvent
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import DEFAULT_TIME_WARP, WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.metrics_requests import MetricsRequestRecorder
from tests.support.prom import SCRAPE_INTERVAL_SECONDS, Prometheus
from tests.support.replica_inprocess import Replica, start_replica
from tests.support.slots import SlotSockets, check_distinct
from tests.support.workload import drive

T = TypeVar("T")

JOB = "trainer-metrics"
LEASE_NAME = "trainer-metrics"
LEASE_NAMESPACE = "default"
TARGET_NAMESPACE = "trainer-metrics-e2e"

# Fast elections (as the chaos soak's), and the zero hold the chart would set for a 1 s scrape interval.
REPLICA_SETTINGS: dict[str, Any] = {
    "lease_duration_seconds": 3.0,
    "renew_deadline_seconds": 2.0,
    "retry_period_seconds": 0.4,
    "watch_timeout_min_seconds": 30,
    "watch_timeout_max_seconds": 60,
    "zero_hold_seconds": 2.0,
}


@dataclass
class Live:
    slot: int
    replica: Replica

    @property
    def identity(self) -> str:
        return self.replica.identity

    @property
    def service(self) -> Service:
        return self.replica.service


@dataclass
class Killed:
    """A leader killed: the watermark it had published, and what it counted above it (may count twice),
    each with the time.monotonic() at which it counted it."""

    identity: str
    at: float  # time.monotonic() of the kill
    published: dict[str, int]
    above: list[tuple[float, CountableEvent]]

    def counted_within(self, seconds: float) -> list[CountableEvent]:
        """What it counted above its published watermark in the last ``seconds`` before the kill."""
        return [event for when, event in self.above if when >= self.at - seconds]


@dataclass
class Fleet:
    seed: int
    slots: int
    namespaces: int = 5
    max_jobs: int = 200
    populate: int = 40
    min_delete_age: float = 0.0
    time_warp: float | None = None  # the generator's (None: its default)
    settings: Mapping[str, Any] = field(default_factory=lambda: dict(REPLICA_SETTINGS))
    identity_prefix: str = "trainer-metrics-"
    # As ``--simulate``: the app's embedded cluster is the fleet's (settings.simulate, its defaults, apply).
    simulate: bool = False
    recorder: MetricsRequestRecorder | None = None  # what each /metrics request asked for and got, if set
    runtime_refs: list[str] = field(default_factory=list)
    sockets: SlotSockets | None = None  # every slot's socket, bound in start() and held until stop()
    live: dict[str, Live] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    killed: list[Killed] = field(default_factory=list)
    # Per replica, every event it counted (any term) with the time.monotonic() it counted it.
    counted: dict[str, list[tuple[float, CountableEvent]]] = field(default_factory=dict)
    sim: SimulatedCluster | None = None
    generator: WorkloadGenerator | None = None
    _started: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _stop: asyncio.Event | None = None
    _gen_stop: asyncio.Event | None = None
    _gen_task: asyncio.Task[int] | None = None
    _trainjob_rv: int = 0  # revision of the last TrainJob write (Lease renewals advance the store's too)
    _error: BaseException | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    # --- from the test thread ------------------------------------------------------------------------

    def start(self) -> None:
        self.sockets = SlotSockets(self.slots)
        self._tmp = tempfile.TemporaryDirectory(prefix="trainer-metrics-fleet-")
        self._thread = threading.Thread(target=self._run_loop, name="e2e fleet", daemon=True)
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise AssertionError(f"the simulated cluster did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(120)
        if self.sockets is not None:
            self.sockets.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def run(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 120.0) -> T:
        """Run a coroutine function on the fleet's loop; return its result."""
        assert self._loop is not None
        future: Future[T] = asyncio.run_coroutine_threadsafe(fn(), self._loop)
        return future.result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        async def sync() -> T:
            return fn()

        return self.run(sync)

    def targets(self) -> list[tuple[str, dict[str, str]]]:
        """Every slot as a Prometheus target: its address and the labels a ServiceMonitor would give it."""
        assert self.sockets is not None, "start() the fleet first"
        return [
            (address, {"namespace": TARGET_NAMESPACE, "pod": f"slot-{slot}"})
            for slot, address in enumerate(self.sockets.addresses)
        ]

    def add(self) -> str:
        """Start a new replica (a new pod: new identity, next free slot); returns its identity."""
        return self.run(self._add)

    def graceful_stop(self, identity: str) -> bool:
        """SIGTERM: hand over (while still serving), shut down, release. True if every count was seen."""
        return self.run(lambda: self._graceful(identity))

    def kill(self, identity: str) -> Killed:
        return self.run(lambda: self._kill(identity))

    def leader(self) -> str | None:
        def find() -> str | None:
            leaders = [i for i, r in self.live.items() if r.service.journal.leading]
            return leaders[0] if len(leaders) == 1 else None

        return self.call(find)

    def ready(self, identity: str) -> bool:
        return self.call(lambda: not self.live[identity].service.readiness_problems())

    def candidate(self, identity: str) -> bool:
        """Its informers have synced and its elector runs (past the deferral of a fresh replica)."""
        return self.call(lambda: self.live[identity].service.elector is not None)

    def start_generator(self, rate: float, *, lifecycles: bool = False) -> TruthSnapshot:
        """Start the workload (tests.support.workload.drive); returns the truth just before its first step."""

        async def go() -> TruthSnapshot:
            gen = self.generator
            assert gen is not None and self._gen_task is None
            before = gen.snapshot()
            self._gen_stop = asyncio.Event()
            work = drive(gen, rate, self._gen_stop, lifecycles=lifecycles)
            self._gen_task = asyncio.create_task(work, name="e2e generator")
            return before

        return self.run(go)

    def stop_generator(self) -> int:
        async def halt() -> int:
            assert self._gen_stop is not None and self._gen_task is not None
            self._gen_stop.set()
            return await self._gen_task

        return self.run(halt)

    def truth(self) -> TruthSnapshot:
        return self.call(lambda: self._gen().snapshot())

    def trainjob_rv(self) -> int:
        """The revision of the last TrainJob write. The store's own keeps moving with every Lease renewal,
        and a TrainJob watch reaches those revisions only with a bookmark (every 60 s, or ~2 s before its
        deadline): waiting for the store's revision would wait for a bookmark, not for the leader."""
        return self.call(lambda: self._trainjob_rv)

    def unsettled(self, rv: int) -> str | None:
        """None once the leader has seen every TrainJob write up to ``rv`` and every scraper every count it
        made; else what is still missing."""

        def check() -> str | None:
            leaders = [r for r in self.live.values() if r.service.journal.leading]
            if len(leaders) != 1:
                return f"{len(leaders)} leaders"
            service = leaders[0].service
            behind = [
                i.resource_version for i in service._trainjob_informers if int(i.resource_version or 0) < rv
            ]
            held = service.metric_state.held_series
            ledger = service.ledger
            problems = [
                *([f"informers at rv {behind}"] if behind else []),
                *([f"{held} series held at zero"] if held else []),
                *([] if ledger.all_seen() else [f"{ledger.unseen} counted events not seen by every scraper"]),
            ]
            return "; ".join(problems) or None

        return self.call(check)

    # --- on the loop --------------------------------------------------------------------------------

    def _sim(self) -> SimulatedCluster:
        assert self.sim is not None
        return self.sim

    def _gen(self) -> WorkloadGenerator:
        assert self.generator is not None
        return self.generator

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        assert self._tmp is not None
        async with SimulatedCluster(host="127.0.0.1", port=0) as sim:
            self.sim = sim
            self.kubeconfig = sim.write_kubeconfig(Path(self._tmp.name) / "kubeconfig")
            self.generator = WorkloadGenerator(
                sim.store,
                seed=self.seed,
                namespaces=self.namespaces,
                max_jobs=self.max_jobs,
                min_delete_age=self.min_delete_age,
                time_warp=DEFAULT_TIME_WARP if self.time_warp is None else self.time_warp,
            )
            sim.store.subscribe(self._on_store_event)
            self.runtime_refs = self.generator.load_runtimes()
            self.generator.populate(self.populate)  # the first replicas' initial list: never counted
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                if self._gen_stop is not None and self._gen_task is not None:
                    self._gen_stop.set()
                    with contextlib.suppress(Exception):
                        await self._gen_task
                for identity in list(self.live):
                    with contextlib.suppress(Exception):
                        await self._graceful(identity)

    def _on_store_event(self, event: WatchEvent) -> None:
        if event.resource == TRAINJOBS:
            self._trainjob_rv = event.rv

    async def _add(self) -> str:
        slot = self._started
        if slot >= self.slots:
            raise AssertionError(f"all {self.slots} slots used")
        self._started += 1
        identity = f"{self.identity_prefix}{slot}"
        assert self.sockets is not None
        settings = Settings(
            kubeconfig=str(self.kubeconfig),
            identity=identity,
            lease_name=LEASE_NAME,
            lease_namespace=LEASE_NAMESPACE,
            host="127.0.0.1",
            port=self.sockets.port(slot),
            simulate=self.simulate,
            **self.settings,
        )
        replica = await start_replica(
            settings,
            serve=True,
            # The slot's socket, bound since start(): nobody else can have its port (tests/support/slots.py).
            sock=self.sockets.serving(slot),
            lifespan=True,
            cluster=self._embedded if self.simulate else None,
            wrap=self.recorder.wrap if self.recorder is not None else None,
        )
        live = self.live[identity] = Live(slot, replica)
        self._record_counts(live)
        return identity

    @contextlib.asynccontextmanager
    async def _embedded(self, settings: Settings) -> AsyncIterator[str]:
        yield str(self.kubeconfig)

    def _record_counts(self, live: Live) -> None:
        ledger = live.service.ledger
        forward = ledger.on_countable
        record = self.counted.setdefault(live.identity, [])

        def on_countable(event: CountableEvent) -> None:
            record.append((time.monotonic(), event))
            forward(event)

        ledger.on_countable = on_countable  # type: ignore[method-assign]

    async def _graceful(self, identity: str) -> bool:
        live = self.live.pop(identity)
        service = live.service
        await live.replica.graceful_stop()
        handed_over = service._handed_over is not False
        await self._retire(live.slot)
        self.stopped.append(identity)
        return handed_over

    async def _kill(self, identity: str) -> Killed:
        live = self.live.pop(identity)
        service = live.service
        published = self._published()
        killed_at = time.monotonic()
        await live.replica.stop(kill=True)  # a crash: no lifespan shutdown, no release
        await self._retire(live.slot)
        # What its last term counted above the published watermark (replays at its takeover included).
        journal = service.journal
        floor = published.get("", -1)
        this_term = {id(e.event) for e in journal._journal if e.counted and e.term == journal._term}
        above = [
            (when, event)
            for when, event in self.counted.get(identity, [])
            if id(event) in this_term and event.rv > floor
        ]
        killed = Killed(identity, killed_at, published, above)
        self.killed.append(killed)
        self.stopped.append(identity)
        return killed

    async def _retire(self, slot: int) -> None:
        """The slot's server has stopped: its port stays held, and a scrape is reset as a gone pod's."""
        assert self.sockets is not None
        await self.sockets.retire(slot)

    def _published(self) -> dict[str, int]:
        try:
            lease = self._sim().store.get(LEASES, LEASE_NAMESPACE, LEASE_NAME)
        except StoreError:
            return {}
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        return parse_watermarks({WATERMARK_ANNOTATION: annotations[WATERMARK_ANNOTATION]}) or {}


class FleetPrometheus(Prometheus):
    """tests/support/prom.py's Prometheus, scraping every slot of a fleet under one job, with rule files."""

    def __init__(
        self, workdir: Path, targets: list[tuple[str, dict[str, str]]], rule_files: list[Path] | None = None
    ) -> None:
        super().__init__(workdir, {})
        self.slot_targets = targets
        self.rule_files = rule_files or []
        check_distinct(self.addresses())  # the harness refuses to start with two targets on one address

    def addresses(self) -> list[str]:
        return [address for address, _labels in self.slot_targets]

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["scrape_configs"] = [
            {
                "job_name": JOB,
                "honor_labels": True,  # as the chart's ServiceMonitor
                "metrics_path": "/metrics",
                "static_configs": [
                    {"targets": [address], "labels": labels} for address, labels in self.slot_targets
                ],
            }
        ]
        if self.rule_files:
            config["rule_files"] = [str(path) for path in self.rule_files]
        return config


class InProcessService:
    """The app ``trainer-metrics --simulate`` runs, alone, served on a loopback port, against a simulated
    cluster whose workload generator the test controls: a fleet of one. The only difference from
    ``app.replica.simulate.embedded_cluster``: the generator is started by the test once the service leads
    (so its ground truth of "created" and "finished" starts exactly where the service's counters start), and
    stopped by the test (so the stream can settle before comparing). ``recorder`` sees every /metrics."""

    def __init__(self, *, seed: int, max_jobs: int, populate: int, time_warp: float) -> None:
        self.recorder = MetricsRequestRecorder()
        self.fleet = Fleet(
            seed=seed,
            slots=1,
            max_jobs=max_jobs,
            populate=populate,
            time_warp=time_warp,
            # Born at zero for two scrape intervals of the test's Prometheus, as the chart sets it.
            settings={"zero_hold_seconds": 2.0 * SCRAPE_INTERVAL_SECONDS},
            identity_prefix="trainer-metrics-e2e-",
            simulate=True,
            recorder=self.recorder,
        )
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime_refs(self) -> list[str]:
        return self.fleet.runtime_refs

    def start(self) -> None:
        self.fleet.start()
        self.fleet.add()
        assert self.fleet.sockets is not None
        self.port = self.fleet.sockets.port(0)

    def stop(self) -> None:
        self.fleet.stop()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the service's event loop (the generator and store are not thread-safe)."""
        return self.fleet.call(fn)

    def start_generator(self, rate: float, *, lifecycles: bool = False) -> TruthSnapshot:
        return self.fleet.start_generator(rate, lifecycles=lifecycles)

    def stop_generator(self) -> int:
        return self.fleet.stop_generator()

    def truth(self) -> TruthSnapshot:
        return self.fleet.truth()

    def gen(self) -> WorkloadGenerator:
        return self.fleet._gen()
