"""One soak run: the simulated cluster and its workload, the replicas and their taps, the faults, and at the
end the settled state, read for the report."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import resource as rlimit
import tempfile
import time
import tracemalloc
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.handover.watermarks import parse_watermarks
from app.replica.service import Service
from kubesim.apiserver.core import LEASES, PODS
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from tests.chaos.memory import ProcessMemory
from tests.chaos.replicas import InProcessReplica, ProcessReplica, ReplicaHandle
from tests.chaos.soak import faults, samplers
from tests.chaos.soak.config import SoakConfig
from tests.chaos.soak.doubles import DoubleCounts
from tests.chaos.soak.ledger import JOBS, LEASE_NAME, _key, counter_series
from tests.chaos.soak.logs import ErrorLog, RecordsAsText
from tests.chaos.soak.own_memory import rss_bytes, trimmed_rss_bytes
from tests.chaos.soak.promql import read_visible_counts
from tests.chaos.soak.report import build_report
from tests.chaos.soak.terms import Recorder
from tests.chaos.soak.visibility import POD_STREAM, Span, Visibility
from tests.chaos.tap import Record
from tests.support import promql_visible
from tests.support.fleet import FleetPrometheus
from tests.support.prom import PROMETHEUS, SCRAPE_INTERVAL_SECONDS
from tests.support.samples import Samples, parse_samples
from tests.support.slots import SlotSockets
from tests.support.waiting import eventually


def _raise_file_limit(wanted: int) -> None:
    """The soft limit on open files up to ``wanted`` (at most the hard limit): a long run holds hundreds."""
    soft, hard = rlimit.getrlimit(rlimit.RLIMIT_NOFILE)
    if soft != rlimit.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == rlimit.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            rlimit.setrlimit(rlimit.RLIMIT_NOFILE, (target, hard))


async def scrape(handle: ReplicaHandle) -> Samples:
    """One read of a replica's /metrics (a served render, as a scrape is)."""
    resp = await handle.http.get("/metrics")
    resp.raise_for_status()
    return parse_samples(resp.text)


class Soak:
    def __init__(self, cfg: SoakConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.rng = random.Random(cfg.seed)
        self.live: dict[str, ReplicaHandle] = {}
        self.replica_seq = 0
        self.injected: Counter[str] = Counter()
        self.episodes: list[dict[str, Any]] = []
        self.stalls: list[tuple[float, float, str | None]] = []  # (start, end, resource) in soak time
        self.uncalm_stalls = 0  # stalls that began while some informer was not watching: not checked
        self.readiness: list[tuple[float, str, int]] = []  # (t, identity, status)
        self.liveness: dict[str, list[str]] = {}
        self.dead_tasks: list[str] = []
        self.loop_errors: list[str] = []
        self.error_records: list[str] = []
        self.process_errors: list[str] = []  # ERROR log lines of the replica processes
        self.rss: list[tuple[float, int]] = []  # this (the soak's) process
        self.t0 = time.monotonic()
        self.wall0 = time.time() - (time.monotonic() - self.t0)  # time.time() at t0
        self.problems: list[str] = []  # things that went wrong in the harness itself
        self.lease_watermark: dict[str, int] = {}  # per stream, the highest written to the Lease so far
        self.lease_writes = 0
        self.watermark_decreases: list[str] = []
        self.visibility = Visibility()
        self.spans: dict[str, dict[str, Span]] = {}  # identity -> its span of each stream
        self.stopped_services: list[tuple[str, weakref.ref[Service]]] = []
        self.memory: dict[str, dict[str, Any]] = {}  # "warm" / "end": structure sizes, traced MB by part
        self.trimmed: dict[str, int] = {}  # "warm" / "end": trimmed_rss_bytes() of this process
        self.processes: list[ProcessMemory] = []  # process mode: every replica process's memory
        self.sampling_done = False  # the last raw readings were taken (before the trimmed ones at the end)
        # Per slot (one replica instance), what it counted: sample name -> key -> amount.
        self.slot_counted: dict[int, promql_visible.Table] = {}
        self.counted_created = 0.0  # created edges counted by all leader terms, for the ratio over time
        self.ratios: list[tuple[float, float, float]] = []  # (t, truth created, counted created)
        self.demotions = 0  # process mode: leaders made to lose the Lease (a resident is never killed)
        self.exits: list[tuple[str, str, int | None]] = []  # process mode: (identity, how, exit code)
        # Each replica instance is served over HTTP on its own slot (a Prometheus target with label
        # pod="slot-N"): a restarted replica is a new pod, as in a Deployment. Every slot's socket is bound
        # now and held until the end (tests/support/slots.py): no two targets can share a port.
        # A replica instance starts every ~16 s in process (kills and restarts), every ~21 s with processes.
        slots = cfg.replicas + int(cfg.fault_seconds / 8) + 16
        _raise_file_limit(slots + 1024)  # every slot's socket is held for the whole run
        self.slots = SlotSockets(slots)
        self.slot_of: dict[str, int] = {}  # identity -> the slot of its latest instance
        self.slot_seq = 0
        self.prom: FleetPrometheus | None = None
        self.promql: dict[str, Any] = {"checked": False}
        self.raw_series: dict[str, list[dict[str, Any]]] = {}  # PromQL: every counted series' samples
        self.scrapes: dict[str, list[tuple[float, float, float]]] = {}  # per target: (time, up, duration)

    def t(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    # -- replicas --

    async def start_replica(self, identity: str | None = None, *, resident: bool = False) -> str:
        if identity is None:
            self.replica_seq += 1
            identity = f"replica-{self.replica_seq}"
        slot = self.slot_seq
        self.slot_seq += 1
        if slot >= len(self.slots):
            raise RuntimeError(f"no slot left to serve {identity}")
        self.slot_of[identity] = slot
        overrides = {
            **self.cfg.service_overrides,
            "watch_inactivity_timeout_seconds": self.cfg.inactivity_timeout,
            "handover_journal_size": self.cfg.journal_size,
            "lease_name": LEASE_NAME,
        }
        spans = {
            "": self.visibility.span(identity, lambda: self._rv_of(identity)),
            POD_STREAM: self.visibility.span(identity, lambda: self._pod_rv_of(identity), POD_STREAM),
        }

        def on_record(record: Record) -> None:
            self.on_record(identity, slot, spans, record)

        handle: ReplicaHandle
        if self.cfg.processes:
            handle = await ProcessReplica.start(
                self.kubeconfig,
                identity,
                slot,
                self.slots,
                on_record,
                log_dir=self.workdir,
                env=self.cfg.replica_env,
                **overrides,
            )
            assert handle.pid is not None
            self.processes.append(ProcessMemory(identity, slot, handle.pid, resident, self.t()))
        else:
            handle = await InProcessReplica.start(
                self.kubeconfig, identity, slot, self.slots, on_record, **overrides
            )
        handle.resident = resident
        self.spans[identity] = spans
        self.live[identity] = handle
        return identity

    def _rv_of(self, identity: str) -> int:
        handle = self.live.get(identity)
        return min(handle.trainjob_rvs(), default=0) if handle is not None else 0

    def _pod_rv_of(self, identity: str) -> int:
        handle = self.live.get(identity)
        return min(handle.pod_rvs(), default=0) if handle is not None else 0

    def on_record(self, identity: str, slot: int, spans: dict[str, Span], record: Record) -> None:
        """A tap record of one replica instance (tests/chaos/tap.py)."""
        kind = record["k"]
        if kind == "count":
            series = counter_series(record["inc"])
            self.recorder.count(identity, record, series)
            self.doubles.count(identity, record, series)
            table = self.slot_counted.setdefault(slot, {})
            for name, key, amount in record["inc"]:
                by = table.setdefault(name, {})
                k = _key(key)
                by[k] = by.get(k, 0.0) + amount
            if record["kind"] == "created":
                self.counted_created += 1
        elif kind == "term_start":
            self.recorder.start(identity, slot, record)
        elif kind == "term_stop":
            self.recorder.stop(identity, record["t"], record["wall"])
        elif kind == "settle":
            self.doubles.settle(record["count"])
        elif kind == "shown":
            self.recorder.shown(identity, record)
        elif kind in ("initial", "relist"):
            spans[record.get("stream", "")].record(record)
        elif kind == "pod_seen":
            self.visibility.saw_pod(identity, record)

    async def scrape_without_prometheus(self, stop: asyncio.Event) -> None:
        """Without a Prometheus binary: read every replica's /metrics each scrape interval, as one would
        (a leader hands over only what a scrape has shown)."""
        while not stop.is_set():
            for entry in list(self.live.values()):
                with contextlib.suppress(Exception):
                    await entry.http.get("/metrics")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SCRAPE_INTERVAL_SECONDS)

    def targets(self) -> list[tuple[str, dict[str, str]]]:
        return [
            (address, {"namespace": "trainer-metrics-soak", "pod": f"slot-{slot}"})
            for slot, address in enumerate(self.slots.addresses)
        ]

    def _check_replica(self, identity: str) -> None:
        problems, dead = self.live[identity].problems()
        if problems:
            self.liveness[identity] = problems
        self.dead_tasks.extend(f"{identity}: {name}" for name in dead)

    async def stop_replica(self, identity: str, *, kill: bool) -> None:
        self._check_replica(identity)
        spans = self.spans.pop(identity)
        # The rv its informers reached, before it stops (a killed process answers nothing after), read
        # while it is still among the live ones (``_rv_of`` finds no other).
        for span in spans.values():
            span.stop_rv = span.current_rv()
        handle = self.live.pop(identity)
        if isinstance(handle, InProcessReplica):
            self.stopped_services.append((identity, weakref.ref(handle.service)))
        self.recorder.pending_how[identity] = ("killed" if kill else "graceful", time.monotonic())
        try:
            await handle.stop(kill=kill)
        finally:
            # A killed process wrote no term_stop: its term ended when it died, just now (every record it
            # wrote has been handled by then). In this process, kill() wrote one.
            self.recorder.stop(identity, time.monotonic(), time.time())
            self.recorder.pending_how.pop(identity, None)
            for span in spans.values():
                self.visibility.stopped(span)
            await self.slots.retire(handle.slot)  # its port stays held; a scrape is reset from now on
            if isinstance(handle, ProcessReplica):
                self.process_errors.extend(f"{identity}: {text}" for text in handle.errors)
                self.exits.append((identity, "killed" if kill else "graceful", handle.exit_code))
                for proc in self.processes:
                    if proc.pid == handle.pid:
                        proc.stopped = self.t()

    def leader(self) -> str | None:
        leaders = [i for i, e in self.live.items() if e.leading()]
        return leaders[0] if len(leaders) == 1 else None

    async def wait_for(self, check: Callable[[], bool], timeout: float) -> bool:
        """``eventually``, but False instead of a failure: the soak records the problem and carries on."""
        try:
            await eventually(check, timeout)
        except AssertionError:
            return False
        return True

    def all_ready(self) -> bool:
        return all(e.ready() for e in self.live.values())

    def on_lease_write(self, event: Any) -> None:
        """Every committed Lease write: no stream's watermark may go below one published before it (each
        published watermark was counted up to; a lower one lets a takeover recount). A pod deleted: its
        failure's visibility (``Visibility.pod_deleted``)."""
        if event.resource == PODS:
            if event.type == "DELETED":
                self.visibility.pod_deleted(str(event.entry.obj["metadata"].get("uid", "")), event.rv)
            return
        if event.resource != LEASES or event.type == "DELETED":
            return
        marks = parse_watermarks((event.entry.obj.get("metadata") or {}).get("annotations") or {})
        if not marks:
            return
        holder = (event.entry.obj.get("spec") or {}).get("holderIdentity")
        for stream, value in marks.items():
            before = self.lease_watermark.get(stream)
            if before is not None and value < before:
                self.watermark_decreases.append(
                    f"{self.t()}: {holder!r} wrote {value} after {before} (stream {stream!r})"
                )
            self.lease_watermark[stream] = max(value, before or 0)
        self.lease_writes += 1
        self.recorder.lease_written(holder, marks)

    def all_watching(self) -> bool:
        return all(e.watching() for e in self.live.values())

    async def sample_rss(self, stop: asyncio.Event) -> None:
        """This process's RSS (samplers.py); a diagnosis run samples more (tests/chaos/diagnose.py)."""
        await samplers.sample_rss(self, stop)

    # -- main --

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        errors = ErrorLog()
        root = logging.getLogger()
        root.addHandler(errors)
        tracebacks = RecordsAsText()
        root.addHandler(tracebacks)
        loop = asyncio.get_running_loop()

        def loop_handler(_loop: Any, context: dict[str, Any]) -> None:
            self.loop_errors.append(str(context.get("message")) + " " + repr(context.get("exception")))

        loop.set_exception_handler(loop_handler)
        started_tracing = cfg.trace_memory and not tracemalloc.is_tracing()
        if started_tracing:
            tracemalloc.start(1)
        try:
            async with SimulatedCluster(
                bookmark_interval=0.5, history_window=cfg.history_window, watch_timeout=(20.0, 40.0)
            ) as sim:
                self.sim = sim
                self.kubeconfig = sim.write_kubeconfig(self.workdir / "kubeconfig")
                self.gen = WorkloadGenerator(
                    sim.store,
                    seed=cfg.seed,
                    namespaces=cfg.namespaces,
                    max_jobs=cfg.max_jobs,
                    min_delete_age=cfg.min_delete_age,
                    pods=cfg.pods,
                )
                self.gen.load_runtimes()
                self.visibility.attach_truth(self.gen.truth)
                self.recorder = Recorder(sim, self.t0)
                self.doubles = DoubleCounts(self.t0)
                unsubscribe = sim.store.subscribe(self.on_lease_write)
                try:
                    return await self._run_inner()
                finally:
                    unsubscribe()
                    # Followers first: then only the leader hands over (to nobody), once.
                    for identity in sorted(self.live, key=lambda i: self.live[i].leading()):
                        with contextlib.suppress(Exception):
                            await self.stop_replica(identity, kill=False)
        finally:
            if self.prom is not None:
                await asyncio.to_thread(self.prom.stop)
            self.slots.close()
            if started_tracing:
                tracemalloc.stop()
            root.removeHandler(errors)
            root.removeHandler(tracebacks)
            self.error_records = errors.records
            loop.set_exception_handler(None)

    def prefill_history(self) -> int:
        """Run generator steps until the simulated API server's watch history is at its high-water mark
        (the window plus the 1/8 it trims in batches). The history (~10 KB per event: object, previous
        version, JSON) is the largest bounded structure in this process; refilled after a compaction it
        reuses the memory of the first fill, but a first fill after the warm-up point would show as
        ~40 MB of RSS growth that says nothing about the service. Returns the steps taken."""
        store = self.sim.store
        # The store trims in batches once the excess reaches window // 8: the longest it gets is one less.
        target = self.cfg.history_window + max(1, self.cfg.history_window // 8) - 1
        steps = 0
        while len(store._history) < target and steps < 20 * target:
            self.gen._safe_step()
            steps += 1
        # With no watcher yet, nothing serialized the events: an event's NDJSON line (and its object's JSON)
        # is made when the first watch stream sends it, and is most of its size. Without this the prefill
        # reached a third of the high-water mark, and the first refill to ~4500 serialized events after the
        # warm-up (35 s without a compaction or restart) showed as a ~25 MB RSS step (docs/reliability.md).
        for event in store._history:
            _ = event.line
        return steps

    async def _run_inner(self) -> dict[str, Any]:
        cfg = self.cfg
        self.prefill_steps = self.prefill_history()
        stop = asyncio.Event()
        scraper = None
        if cfg.prometheus and PROMETHEUS is not None:
            prom = FleetPrometheus(self.workdir, self.targets())
            await asyncio.to_thread(prom.start)
            self.prom = prom
        else:
            scraper = asyncio.create_task(self.scrape_without_prometheus(stop), name="scraper")
        for i in range(cfg.replicas):
            await self.start_replica(resident=cfg.processes and i < cfg.residents)
        if not await self.wait_for(lambda: self.leader() is not None and self.all_ready(), 30.0):
            raise RuntimeError("replicas did not become ready with one leader")
        if self.prom is not None:
            # The first leader's series are in Prometheus (at zero) before the first TrainJob is counted.
            prom_ = self.prom
            try:
                await eventually(
                    lambda: asyncio.to_thread(prom_.query, "kubeflow_trainer_runtime_info"),
                    20.0,
                    interval=0.2,
                    what="the first leader's series in Prometheus",
                )
            except AssertionError:
                self.problems.append("the first leader's series were not in Prometheus 20 s after it led")
        start_truth = self.gen.snapshot()
        self.created_before = sum(self.gen.truth.created.values())
        self.counted_created = 0.0
        start_wall = time.time()
        gen_stop = asyncio.Event()
        background = [
            asyncio.create_task(self.gen.run(cfg.rate, gen_stop), name="generator"),
            asyncio.create_task(samplers.sample_readiness(self, stop), name="readiness sampler"),
            asyncio.create_task(self.sample_rss(stop), name="rss sampler"),
            asyncio.create_task(samplers.prune_truth(self, stop), name="truth pruner"),
        ]
        if cfg.processes:
            background.append(
                asyncio.create_task(samplers.sample_processes(self, stop), name="process memory")
            )
        started = time.monotonic()
        await faults.faults_loop(self, started + cfg.fault_seconds)
        fault_seconds = time.monotonic() - started
        # Settle: no more writes, no more faults, every replica caught up and ready, one leader.
        gen_stop.set()
        steps = int(await background[0] or 0)
        self.sim.faults.clear()
        end_rv = self.sim.store.resource_version
        settle_start = time.monotonic()

        def settled() -> bool:
            if self.leader() is None or not self.all_ready():
                return False
            return all(
                min(e.trainjob_rvs(), default=0) >= end_rv and min(e.pod_rvs(), default=end_rv) >= end_rv
                for e in self.live.values()
            )

        ok = await self.wait_for(settled, cfg.settle_timeout)
        if not ok:
            self.problems.append(f"did not settle within {cfg.settle_timeout} s")
        # Housekeeping has flushed the creations still waiting for a runtime, then the leader has renewed
        # the Lease twice (the second renew was built after the last count).
        flushed = await self.wait_for(lambda: all(e.pending() == 0 for e in self.live.values()), 15.0)
        writes = self.lease_writes
        if not (flushed and await self.wait_for(lambda: self.lease_writes >= writes + 2, 15.0)):
            self.problems.append("pending creations not flushed, or no renew, within 15 s of settling")
        settle_seconds = time.monotonic() - settle_start
        if cfg.processes:
            # The last raw readings, then the trimmed ones: the trim lowers RSS, which must not enter the
            # growth or the slope, so the sampler reads /proc no more from here.
            self.sampling_done = True
            live = {h.pid: h for h in self.live.values() if h.pid is not None}
            for proc in self.processes:
                if proc.stopped is None and proc.pid in live:
                    proc.sample(self.t())
            await samplers.read_structures(self, live)
            await samplers.read_trimmed(self, "end")
        gc.collect()
        rss_end = rss_bytes()
        if not cfg.processes:
            self.trimmed["end"] = trimmed_rss_bytes(self.sim)
        self.memory["end"] = samplers.memory_point(self)
        stopped_alive = [identity for identity, ref in self.stopped_services if ref() is not None]
        end_truth = self.gen.snapshot()
        leader = self.leader()
        for identity in list(self.live):
            self._check_replica(identity)
        self.recorder.close_open_terms()
        gauge: dict[tuple[str, ...], float] = {}
        scraped_leader_flags: dict[str, float] = {}
        if leader is not None:
            samples = await scrape(self.live[leader])
            for (name, labels), value in samples.items():
                if name == JOBS and value:
                    d = dict(labels)
                    gauge[(d["namespace"], d["runtime_ref"], d["state"])] = value
        for identity, e in self.live.items():
            s = await scrape(e)
            scraped_leader_flags[identity] = s.get(("trainer_metrics_leader", ()), -1.0)
        await read_visible_counts(self, leader, start_wall)
        stop.set()
        await asyncio.gather(*background[1:], *([scraper] if scraper is not None else []))
        return build_report(
            self,
            start_truth=start_truth,
            end_truth=end_truth,
            gauge=gauge,
            leader=leader,
            steps=steps,
            fault_seconds=fault_seconds,
            settle_seconds=settle_seconds,
            rss_end=rss_end,
            leader_flags=scraped_leader_flags,
            stopped_alive=stopped_alive,
        )


async def run_soak(cfg: SoakConfig, workdir: Path | None = None) -> dict[str, Any]:
    """Run one soak; returns the report (see ``Soak.report``). Errors are reported, not raised."""
    report, _soak = await run_soak_keeping(cfg, workdir)
    return report


async def run_soak_keeping(cfg: SoakConfig, workdir: Path | None = None) -> tuple[dict[str, Any], Soak]:
    """``run_soak``, and the soak itself (its readings, for ``Soak.plot``)."""
    with tempfile.TemporaryDirectory() as tmp:
        if workdir is not None:
            os.makedirs(workdir, exist_ok=True)
        soak = Soak(cfg, workdir or Path(tmp))
        result = await soak.run()
        # The error logs are complete once every replica has stopped (run()'s finally): read them again.
        result["error_log_records"] = soak.error_records + soak.process_errors
        result["loop_exceptions"] = soak.loop_errors
        return result, soak
