"""The scenarios P1-P7 and P9 (P8: bench/p8.py). Each adds its figures to ``Results``; bench/report.py turns
them into the report."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

if TYPE_CHECKING:  # app is imported where used, after the scenario's logging is set up
    from app.kube.lines import Line

from bench import pod_ingest
from bench.common import (
    PYTHON,
    STALL_EDGES_MS,
    Child,
    Figure,
    cpu_seconds,
    log_histogram,
    percentile,
    rss_bytes,
    runqueue_wait_seconds,
    wait_http,
)
from bench.watch_baseline import timed_watch

TRAINJOBS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"
P9_PAIRS = 6  # P9's alternating with/without pairs per repetition: the median of 30, not 15, in a full run
PROM_TEXT = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "Accept-Encoding": "gzip"}
PROM_DEFAULT = {
    # What Prometheus 2.x/3.x sends by default (scrape_protocols: OpenMetrics first).
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
PROM_PROTOBUF = {
    # Prometheus 2.42 with --enable-feature=native-histograms (protobuf first; 2.49+: scrape_protocols).
    "Accept": "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
    "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


@dataclass
class Sizes:
    quick: bool
    reps: int
    p1_events: int
    p1_baseline_events: int
    p1_jobs: int
    p5_seconds: float
    big_base: int  # generated jobs; x clone = the big cluster
    big_clone: int
    small_jobs: int
    scrapes: int
    idle_seconds: float
    fresh_probes: int
    fresh_rate: float
    mid_clone: int  # big_base x mid_clone = the sweep's middle cluster (10k in full mode), for --plot
    p1_pods: int  # pods of the replay's TrainJobs (bench/replay.py --pods): P1's pods stream
    p1_pod_events: int
    p1_pod_baseline_events: int
    # Pods written into the big cluster for P3 and P4 with pods: half as many as its TrainJobs (the sim
    # holds ~110 KB of Python objects per 14 KB pod: 50,000 pods are ~5.5 GB and ~45 s to write).
    big_pods: int

    @classmethod
    def make(cls, quick: bool) -> Sizes:
        if quick:
            return cls(
                True, 1, 8_000, 2_000, 500, 2.0, 200, 10, 200, 30, 2.0, 20, 200.0, 3, 300, 2_000, 300, 2_000
            )
        return cls(
            False,
            5,
            60_000,
            15_000,
            2_000,
            8.0,
            1_000,
            100,
            1_000,
            300,
            12.0,
            200,
            1000.0,
            10,
            2_000,
            20_000,
            3_000,
            50_000,
        )


@dataclass
class Results:
    figures: dict[str, Figure] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def fig(self, name: str) -> Figure:
        return self.figures.setdefault(name, Figure())


# --------------------------------------------------------------------------------------------- P1


class _CountingHandler:
    """Wraps the TrainerState's job handler; stamps the first update and the one at which the informer has
    applied ``target`` MODIFIED events since. Events, not handler calls: an update that reaches no handler
    (``TrainJobProjector.unchanged``) is ingested work too."""

    def __init__(self, inner: Any, target: int) -> None:
        self.inner = inner
        self.target = target
        self.counters: Any = None  # the informer's InformerCounters, set once it is built
        self.start = 0
        self.events = 0
        self.first = 0.0
        self.last = 0.0
        self.done = asyncio.Event()

    def on_added(self, obj: Any, initial: bool) -> None:
        self.inner.on_added(obj, initial)

    def on_updated(self, old: Any, new: Any) -> None:
        self.inner.on_updated(old, new)
        if self.done.is_set():
            return
        applied = self.counters.modified
        if not self.first:
            self.first = time.perf_counter()
            self.start = applied
        elif applied - self.start >= self.target - 1:
            self.last = time.perf_counter()
            self.events = applied - self.start
            self.done.set()

    def on_deleted(self, last: Any) -> None:
        self.inner.on_deleted(last)


def _pipeline(*, exact: bool = True) -> tuple[Any, Any]:
    """TrainerState → CountJournal (leading) → ServedLedger → TrainerMetricState (born at zero), wired with
    the service's defaults as app/replica/service.py does; ``exact=False`` (P9's baseline): TrainerState
    straight
    into a TrainerMetricState without holds, i.e. without what PromQL-exact counting adds."""
    from app.handover.journal import CountJournal
    from app.handover.served import ServedLedger
    from app.metrics.trainer_metrics import TrainerMetricState
    from app.trainer.state import TrainerState

    defaults = _service_defaults()
    hold = defaults["zero_hold_seconds"] if exact else 0.0
    holder: dict[str, TrainerState] = {}
    metric_state = TrainerMetricState(
        runtime_provider=lambda: holder["state"].runtime_info(),  # noqa: PLW0108
        zero_hold=hold,
    )
    if not exact:
        holder["state"] = TrainerState(metric_state)
        return holder["state"], metric_state
    journal_size = defaults["handover_journal_size"]
    ledger = ServedLedger(metric_state, hold=hold, stream_of=lambda event: "", max_tracked=journal_size)
    journal = CountJournal(ledger, journal_size=journal_size)
    state = holder["state"] = TrainerState(journal, gauge_sink=metric_state)
    journal.start_leading(None)
    return state, metric_state


def _service_defaults() -> dict[str, Any]:
    from app.config import Settings

    fields = Settings.model_fields
    return {name: fields[name].default for name in ("zero_hold_seconds", "handover_journal_size")}


async def _informer_rate(kubeconfig: str, events: int, *, exact: bool = True) -> float:
    from app.kube.client import KubeClient
    from app.kube.informer import Informer
    from app.trainer.informer_projectors import (
        CLUSTER_TRAINING_RUNTIME_PROJECTOR,
        TRAINING_RUNTIME_PROJECTOR,
        TRAINJOB_PROJECTOR,
    )
    from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS

    state, metric_state = _pipeline(exact=exact)
    client = await KubeClient.connect(kubeconfig)
    counting = _CountingHandler(state.job_handler, events)
    informers = [
        Informer(
            client, CLUSTER_TRAINING_RUNTIMES, None, CLUSTER_TRAINING_RUNTIME_PROJECTOR, state.runtime_handler
        ),
        Informer(client, TRAINING_RUNTIMES, None, TRAINING_RUNTIME_PROJECTOR, state.runtime_handler),
    ]
    tasks = [asyncio.create_task(i.run()) for i in informers]
    while not all(i.synced for i in informers):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    jobs = Informer(client, TRAINJOBS, None, TRAINJOB_PROJECTOR, counting)
    counting.counters = jobs.counters
    gc.collect()
    tasks.append(asyncio.create_task(jobs.run()))
    try:
        await asyncio.wait_for(counting.done.wait(), 120)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
    metric_state.render_text()  # the state really holds what it was fed
    return counting.events / (counting.last - counting.first)


async def _baseline_rate(kubeconfig: str, events: int) -> float:
    """kubernetes-asyncio's Watch helper → projector.from_json → dict cache → the same TrainerState."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config

    from app.trainer.informer_projectors import TRAINJOB_PROJECTOR

    state, _ = _pipeline()
    api_client = await k8s_config.new_client_from_config(config_file=kubeconfig)
    api = k8s.CustomObjectsApi(api_client)
    group = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
    listing = await api.list_cluster_custom_object(*group)
    try:
        return await timed_watch(
            api.list_cluster_custom_object,
            group,
            listing,
            TRAINJOB_PROJECTOR,
            state.job_handler,
            events=events,
        )
    finally:
        await api_client.close()


async def _read_watch_lines(kubeconfig: str, events: int, on_line: Callable[[Any], object]) -> float:
    """``events`` TrainJob watch lines read as the informer reads them (``KubeClient.stream``, bounded reads
    of the reflector's ``READ_BYTES``, ``LineSplitter``), each handed to ``on_line``; the seconds from
    the first line to the last. A stream that ends before ``events`` lines is an error: a rate over fewer
    lines than asked would not be the figure it is reported as."""
    from app.kube.client import KubeClient
    from app.kube.informer import InformerOptions
    from app.kube.lines import LineSplitter
    from app.kube.reflector import READ_BYTES

    client = await KubeClient.connect(kubeconfig)
    split = LineSplitter(InformerOptions().max_object_bytes).feed
    count, first = 0, 0.0
    timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=60)
    try:
        async with client.stream(TRAINJOBS_PATH, query={"watch": "true"}, timeout=timeout) as resp:
            read = resp.content.read
            while count < events:
                chunk = await read(READ_BYTES)
                if not chunk:
                    break
                for line in split(chunk)[0]:
                    on_line(line)
                    count += 1
                    if count == 1:
                        first = time.perf_counter()
                    if count == events:
                        break
        last = time.perf_counter()
    finally:
        await client.close()
    if count != events:
        raise RuntimeError(f"the watch ended after {count} of {events} lines")
    return last - first


async def _socket_orjson_rate(kubeconfig: str, events: int) -> float:
    """P1's limit: what live ingestion cannot avoid, the informer's own read path (``_read_watch_lines``) with
    nothing after it but ``orjson.loads`` of each line. P1 ÷ this is the main P1 figure (what the decode,
    projection, cache, rules and counting cost over reading and parsing what arrives); this ÷ bare orjson
    is what reading costs."""
    return (events - 1) / await _read_watch_lines(kubeconfig, events, orjson.loads)


async def _fetch_lists(url: str) -> list[bytes]:
    """The LIST bodies of the cluster runtimes, the runtimes and the TrainJobs, in that order."""
    from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS

    bodies = []
    async with aiohttp.ClientSession() as session:
        for kind in (CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS):
            async with session.get(url + kind.collection_path(None)) as resp:
                bodies.append(await resp.read())
    return bodies


def _offline_rate(
    list_bodies: list[bytes],
    lines: list[bytes],
    *,
    exact: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """P1 without the socket: the TrainJobs' Cache and Ingest after the three LISTs, wired as P1 is (Decoder,
    Cache, Ingest, TrainerState, journal, served ledger, metric state; ``exact=False``: P9's baseline), the
    TrainJobs' ``lines`` fed from memory, timed by ``clock``."""
    from app.kube.informer import cache_and_ingest
    from app.kube.informer_telemetry import InformerCounters
    from app.kube.ingest import Ingest
    from app.trainer.informer_projectors import (
        CLUSTER_TRAINING_RUNTIME_PROJECTOR,
        TRAINING_RUNTIME_PROJECTOR,
        TRAINJOB_PROJECTOR,
    )

    state, metric_state = _pipeline(exact=exact)
    wiring: tuple[tuple[Any, Any], ...] = (
        (CLUSTER_TRAINING_RUNTIME_PROJECTOR, state.runtime_handler),
        (TRAINING_RUNTIME_PROJECTOR, state.runtime_handler),
        (TRAINJOB_PROJECTOR, state.job_handler),
    )
    built: list[Ingest[Any]] = []
    for (projector, handler), body in zip(wiring, list_bodies, strict=True):
        _, ingest = cache_and_ingest(
            projector, handler, InformerCounters(), name="bench", clock=time.monotonic
        )
        items: dict[str, Any] = {}
        unusable: set[str] = set()
        list_rv, _ = ingest.list_page(body, items, unusable)
        ingest.replace(items, list_rv, unusable)
        built.append(ingest)
    rate = _lines_rate(built[-1].process_line, lines, clock)
    metric_state.render_text()  # the state really holds what it was fed
    return rate


def _lines_rate(
    process: Callable[[bytes], object], lines: list[bytes], clock: Callable[[], float] = time.perf_counter
) -> float:
    gc.collect()
    t = clock()
    for line in lines:
        process(line)
    return len(lines) / (clock() - t)


async def _fetch_lines(url: str, events: int) -> list[bytes]:
    chunks: list[bytes] = []
    newlines = 0
    async with aiohttp.ClientSession() as session, session.get(url + TRAINJOBS_PATH + "?watch=true") as resp:
        async for chunk in resp.content.iter_any():
            chunks.append(chunk)
            newlines += chunk.count(b"\n")
            if newlines >= events:
                break
    return b"".join(chunks).split(b"\n")[:events]


def _typed_decode() -> Callable[[Line], Any]:
    """msgspec's typed decode of a TrainJob watch line, as the informer's Decoder makes it of an update of a
    cached job: into the status wire type (no spec)."""
    from app.kube.decode import Decoder
    from app.trainer.informer_projectors import TRAINJOB_PROJECTOR

    decoder = Decoder(TRAINJOB_PROJECTOR)
    assert decoder.status_event_decoder is not None  # the TrainJob projector names a status wire type
    decode: Callable[[Line], Any] = decoder.status_event_decoder.decode
    return decode


def _decode_rates(lines: list[bytes]) -> tuple[float, float]:
    """Bare ``orjson.loads`` and msgspec's typed decode of ``lines``, each in lines/s."""
    return _lines_rate(orjson.loads, lines), _lines_rate(_typed_decode(), lines)


def start_replay(
    work: Path, kubeconfig: str, name: str, jobs: int, *stream: str
) -> tuple[Child, dict[str, Any]]:
    """A bench.replay process with ``jobs`` TrainJobs (``stream``: ``--events N`` or ``--forever``), ready."""
    args = [PYTHON, "-m", "bench.replay", "--kubeconfig", kubeconfig, "--jobs", str(jobs), *stream]
    replay = Child(args, name=name, log_dir=work)
    return replay, replay.wait_ready(120)


def p1_ingest(sizes: Sizes, work: Path, res: Results) -> None:
    # The replay's jobs include a few with unusable fields, which every in-process pipeline (about 30 a run)
    # logs once each: the progress lines would drown. The service processes of the other steps still log.
    logging.getLogger("app.trainer.state").setLevel(logging.ERROR)
    kubeconfig = str(work / "replay.kubeconfig")
    events = max(sizes.p1_events, sizes.p1_baseline_events, sizes.p1_pod_events) + 10
    replay, info = start_replay(
        work, kubeconfig, "p1-replay", sizes.p1_jobs, "--events", str(events), "--pods", str(sizes.p1_pods)
    )
    res.notes["p1_lines"] = {k: v for k, v in info.items() if k.startswith("line_bytes")}
    res.notes["p1_pod_lines"] = {
        "pods": info["pods"],
        **{k: v for k, v in info.items() if k.startswith("pod_line_bytes")},
    }
    try:
        for _ in range(sizes.reps):
            lines = asyncio.run(_fetch_lines(info["url"], sizes.p1_events))
            orjson_rate, msgspec_rate = _decode_rates(lines)
            lists = asyncio.run(_fetch_lists(info["url"]))
            offline = _offline_rate(lists, lines)
            # P9 without the host's noise: the same lines from memory, with and without, in the thread's
            # CPU time (what the work costs, not how long the host let it run), alternating.
            cpu = [_offline_rate(lists, lines, exact=e, clock=time.thread_time) for e in (True, False, True)]
            res.fig("p9_offline_cpu_ratio").add((cpu[0] + cpu[2]) / 2 / cpu[1])
            del lines
            # P1's limit is read just before and just after the live run, and the live rate is compared with
            # the mean of the two: this host's speed drifts by tens of percent within seconds.
            socket_before = asyncio.run(_socket_orjson_rate(kubeconfig, sizes.p1_events))
            informer = asyncio.run(_informer_rate(kubeconfig, sizes.p1_events))
            socket_orjson = (
                socket_before + asyncio.run(_socket_orjson_rate(kubeconfig, sizes.p1_events))
            ) / 2
            baseline = asyncio.run(_baseline_rate(kubeconfig, sizes.p1_baseline_events))
            # The pods watch on the replay's pods stream, then kubernetes-asyncio's Watch on the same stream,
            # each into a pod series that knows the replay's TrainJobs (bench/pod_ingest.py).
            pods_live = asyncio.run(
                pod_ingest.informer_rate(
                    kubeconfig,
                    sizes.p1_pod_events,
                    pod_ingest.pod_series(_pipeline, lists[2]),
                    _CountingHandler,
                )
            )
            pods_baseline = asyncio.run(
                pod_ingest.baseline_rate(
                    kubeconfig, sizes.p1_pod_baseline_events, pod_ingest.pod_series(_pipeline, lists[2])
                )
            )
            res.fig("p1_pods_informer_rate").add(pods_live)
            res.fig("p1_pods_baseline_rate").add(pods_baseline)
            res.fig("p1_pods_vs_baseline").add(pods_live / pods_baseline)
            # P9: the same ingest without what PromQL-exact counting adds. This host's speed drifts by tens
            # of percent within seconds, so the two are run in alternation (a third of P1's events each)
            # and each "without" is compared with the mean of the "with" runs around it. The pairs spread
            # over ±15 % while what exact counting adds is ~3 % of the work (the two pipelines fed the same
            # lines from memory, in thread CPU time), so there are P9_PAIRS a repetition.
            n = max(2_000, sizes.p1_events // 3)
            exact_rates = [asyncio.run(_informer_rate(kubeconfig, n))]
            for _ in range(P9_PAIRS):
                plain = asyncio.run(_informer_rate(kubeconfig, n, exact=False))
                exact_rates.append(asyncio.run(_informer_rate(kubeconfig, n)))
                res.fig("p9_plain_rate").add(plain)
                res.fig("p9_ingest_ratio").add((exact_rates[-2] + exact_rates[-1]) / 2 / plain)
            res.fig("p1_informer_rate").add(informer)
            res.fig("p1_orjson_rate").add(orjson_rate)
            res.fig("p1_msgspec_rate").add(msgspec_rate)
            res.fig("p1_baseline_rate").add(baseline)
            res.fig("p1_offline_rate").add(offline)
            res.fig("p1_socket_orjson_rate").add(socket_orjson)
            res.fig("p1_offline_vs_orjson").add(offline / orjson_rate)
            res.fig("p1_socket_vs_orjson").add(socket_orjson / orjson_rate)
            res.fig("p1_vs_read_limit").add(informer / socket_orjson)
            res.fig("p1_vs_orjson").add(informer / orjson_rate)
            res.fig("p1_vs_baseline").add(informer / baseline)
    finally:
        replay.stop()


# --------------------------------------------------------------------------------------------- service


def start_service(
    kubeconfig: str,
    work: Path,
    name: str,
    *,
    lag_probe: bool = False,
    per_trainjob_max_jobs: int = 0,
    streaming_list: str | None = None,
    exact: bool = True,
) -> tuple[Child, str]:
    from tests.support import replica_process

    # The service as the CLI runs it (tests/support/replica_process.py) without election or probe port, the
    # per-TrainJob series on (capped) when asked; not exact: P9's baseline, no born-at-zero hold and no
    # hand-over journal (what PromQL-exact counting adds).
    settings: dict[str, Any] = {
        "kubeconfig": kubeconfig,
        "host": "127.0.0.1",
        "port": 0,
        "probe_port": None,
        "leader_election": False,
        "log_level": "WARNING",
        "per_trainjob_series": per_trainjob_max_jobs > 0,
        "per_trainjob_max_jobs": per_trainjob_max_jobs,
    }
    if streaming_list:
        settings["streaming_list"] = streaming_list
    if not exact:
        settings.update(zero_hold_seconds=0.0, handover_journal_size=0)
    args = replica_process.command(python=PYTHON, ready_line=True, lag_probe=lag_probe)
    child = Child(args, name=name, log_dir=work, env=replica_process.environment(settings, base={}))
    # It binds a port the kernel picks and names it in its ready line (before its service starts).
    port = child.wait_ready(120)["port"]
    return child, f"http://127.0.0.1:{port}"


async def _warm(session: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> None:
    for _ in range(3):  # warm the connection and the caches
        async with session.get(base + "/metrics", headers=headers) as resp:
            await resp.read()


async def _timed_scrape(session: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> float:
    t = time.perf_counter()
    async with session.get(base + "/metrics", headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}")
    return time.perf_counter() - t


async def _scrapes(base: str, n: int, headers: dict[str, str], interval: float = 0.0) -> list[float]:
    out = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        await _warm(session, base, headers)
        for _ in range(n):
            out.append(await _timed_scrape(session, base, headers))
            if interval:
                await asyncio.sleep(interval)
    return out


async def _interleaved_scrapes(
    bases: tuple[str, str], n: int, headers: dict[str, str], block: int = 10
) -> tuple[list[float], list[float]]:
    """``n`` scrapes of each of two services, alternating in blocks of ``block``: a ratio of the two taken
    over the same minutes, which a shared host's load moves alike (P4's big ÷ small)."""
    out: tuple[list[float], list[float]] = ([], [])
    async with (
        aiohttp.ClientSession(auto_decompress=False) as a,
        aiohttp.ClientSession(auto_decompress=False) as b,
    ):
        sessions = (a, b)
        for session, base in zip(sessions, bases, strict=True):
            await _warm(session, base, headers)
        done = 0
        while done < n:
            step = min(block, n - done)
            for session, base, lat in zip(sessions, bases, out, strict=True):
                for _ in range(step):
                    lat.append(await _timed_scrape(session, base, headers))
            done += step
    return out


async def _body(base: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
        return await resp.read()


def _series(body: bytes) -> set[bytes]:
    return {line.rsplit(b" ", 1)[0] for line in body.splitlines() if line.startswith(b"kubeflow_trainer_")}


# The per-TrainJob families (app/metrics/per_job.py): how many of a body's series are theirs.
_PER_JOB_FAMILIES = (
    b"kubeflow_trainer_trainjob_info{",
    b"kubeflow_trainer_trainjob_status_",
    b"kubeflow_trainer_trainjob_created_timestamp_seconds{",
)


async def _fetch_and_decode(url: str, page: int) -> float:
    t = time.perf_counter()
    query = f"?limit={page}"
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + TRAINJOBS_PATH + query) as resp:
                doc = orjson.loads(await resp.read())
            token = doc["metadata"].get("continue")
            if not token:
                break
            query = f"?limit={page}&continue={token}"
    return time.perf_counter() - t


def start_sim(work: Path, name: str, jobs: int, clone: int) -> Child:
    kubeconfig = str(work / f"{name}.kubeconfig")
    args = [
        PYTHON,
        "-m",
        "bench.simproc",
        "--kubeconfig",
        kubeconfig,
        "--jobs",
        str(jobs),
        "--clone",
        str(clone),
    ]
    return Child(args, name=name, log_dir=work)


def _ready_service(
    kubeconfig: str, work: Path, name: str, *, timeout: float = 300, **kw: Any
) -> tuple[Child, str, float]:
    """Start the service; returns it, its URL and seconds from process start to /readyz 200."""
    service, base = start_service(kubeconfig, work, name, **kw)
    try:
        ready_at = asyncio.run(wait_http(base + "/readyz", timeout, interval=0.005))
    except Exception:
        service.stop()
        raise RuntimeError(
            f"{name} never ready:\n" + service.log_path.read_text(errors="replace")[-3000:]
        ) from None
    return service, base, ready_at - service.started


def services_at_scale(sizes: Sizes, work: Path, res: Results) -> None:
    """P2, P3, P4, P6 and P7: the service process against simulated clusters of 0, 1k and 100k jobs."""
    settle = 1.0 if sizes.quick else 3.0
    # 0 TrainJobs (runtimes only): the RSS baseline of P3.
    sim0 = start_sim(work, "sim-0", 0, 1)
    info0 = sim0.wait_ready(120)
    try:
        for rep in range(sizes.reps):
            service, _, _ = _ready_service(info0["kubeconfig"], work, f"svc-0-{rep}")
            time.sleep(settle)
            res.fig("p3_rss_zero").add(rss_bytes(service.pid))
            service.stop()
    finally:
        sim0.stop()

    # The small cluster: P4's denominator, then P6 with background load.
    sim1 = start_sim(work, "sim-small", sizes.small_jobs, 1)
    info1 = sim1.wait_ready(120)
    res.notes["small_cluster"] = info1
    small_series: set[bytes] = set()
    try:
        for rep in range(sizes.reps):
            service, base, startup = _ready_service(info1["kubeconfig"], work, f"svc-small-{rep}")
            time.sleep(settle)
            # Not in the table: the small cluster's point of the size sweep (res.notes["scaling"]).
            res.fig("p2_small_ready_seconds").add(startup)
            res.fig("p3_rss_small").add(rss_bytes(service.pid))
            small_series = _series(asyncio.run(_body(base)))
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_TEXT))
            res.fig("p4_small_p50").add(percentile(lat, 50))
            res.fig("p4_small_p99").add(percentile(lat, 99))
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_DEFAULT))
            res.fig("p4_small_om_p50").add(percentile(lat, 50))
            res.fig("p4_small_om_p99").add(percentile(lat, 99))
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_PROTOBUF))
            res.fig("p4_small_pb_p50").add(percentile(lat, 50))
            service.stop()
        note_scaling(
            res,
            int(info1["trainjobs"]),
            "small cluster",
            ready="p2_small_ready_seconds",
            rss="p3_rss_small",
            p99_text="p4_small_p99",
            p99_om="p4_small_om_p99",
        )
        p6_freshness(sizes, work, res, info1)
        # P4's ratios: a small cluster's service scraped in turn with the big one's, over the same minutes.
        reference, small_base, _ = _ready_service(info1["kubeconfig"], work, "svc-small-ref")
        try:
            big_section(sizes, work, res, small=(small_base, small_series), settle=settle)
        finally:
            reference.stop()
    finally:
        sim1.stop()


def big_section(
    sizes: Sizes, work: Path, res: Results, *, small: tuple[str, set[bytes]], settle: float
) -> None:
    """P2, P3, P4, P7 and P9 at the big cluster. ``small``: the URL of a small cluster's service and its
    series; P4's ratios are against that service, scraped in turn with the big one's
    (``_interleaved_scrapes``)."""
    small_base, small_series = small
    simb = start_sim(work, "sim-big", sizes.big_base, sizes.big_clone)
    infob = simb.wait_ready(600)
    res.notes["big_cluster"] = infob
    jobs = infob["trainjobs"]
    try:
        for rep in range(sizes.reps):
            baseline = asyncio.run(_fetch_and_decode(infob["url"], 500))
            service, base, startup = _ready_service(infob["kubeconfig"], work, f"svc-big-{rep}")
            res.fig("p2_ready_seconds").add(startup)
            res.fig("p2_fetch_decode_seconds").add(baseline)
            res.fig("p2_ratio").add(startup / baseline)
            time.sleep(settle)
            rss = rss_bytes(service.pid)
            res.fig("p3_rss_big").add(rss)
            zero = res.fig("p3_rss_zero").median
            res.fig("p3_bytes_per_job").add((rss - zero) / jobs)
            body = asyncio.run(_body(base))
            big_series = _series(body)
            res.notes["p4_same_label_sets"] = big_series == small_series if small_series else None
            res.notes["p4_series"] = len(big_series)
            res.notes["p4_body_bytes"] = len(body)
            for headers, prefix in ((PROM_TEXT, "p4"), (PROM_DEFAULT, "p4_om"), (PROM_PROTOBUF, "p4_pb")):
                lat, lat_small = asyncio.run(_interleaved_scrapes((base, small_base), sizes.scrapes, headers))
                res.fig(f"{prefix}_p50").add(percentile(lat, 50))
                res.fig(f"{prefix}_p99").add(percentile(lat, 99))
                res.fig(f"{prefix}_ratio").add(percentile(lat, 50) / percentile(lat_small, 50))
            time.sleep(settle)
            c0, t0 = cpu_seconds(service.pid), time.monotonic()
            time.sleep(sizes.idle_seconds)
            c1, t1 = cpu_seconds(service.pid), time.monotonic()
            res.fig("p7_idle_cpu_percent").add((c1 - c0) / (t1 - t0) * 100.0)
            service.stop()
            # P9: the same scrapes from a service without what PromQL-exact counting adds.
            service, base, _ = _ready_service(infob["kubeconfig"], work, f"svc-big-plain-{rep}", exact=False)
            time.sleep(settle)
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_TEXT))
            service.stop()
            res.fig("p9_p4_p99_plain").add(percentile(lat, 99))
            res.fig("p9_p4_p99_ratio").add(res.fig("p4_p99").values[-1] / percentile(lat, 99))
        note_scaling(
            res,
            jobs,
            "big cluster",
            ready="p2_ready_seconds",
            rss="p3_rss_big",
            p99_text="p4_p99",
            p99_om="p4_om_p99",
        )
        per_trainjob_at_scale(sizes, work, res, kubeconfig=infob["kubeconfig"], jobs=jobs, settle=settle)
        # Last: the pods stay in the big cluster once written.
        pods_at_scale(sizes, work, res, sim=infob, settle=settle)
    finally:
        simb.stop()


_POD_SERIES_PODS = re.compile(rb"^trainer_metrics_pod_series_pods\{[^}]*\} (\S+)$", re.M)


async def _wait_pods_synced(base: str, pods: int, timeout: float) -> float:
    """Poll ``/metrics`` until the pod series hold ``pods`` pods (readiness does not wait for the pods watch,
    app/replica/pods.py); returns the seconds waited."""
    t0 = time.monotonic()
    seen = 0.0
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - t0 < timeout:
            async with session.get(base + "/metrics") as resp:
                seen = sum(float(v) for v in _POD_SERIES_PODS.findall(await resp.read()))
            if seen >= pods:
                return time.monotonic() - t0
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the pods watch holds {seen:.0f} of {pods} pods after {timeout} s")


def pods_at_scale(sizes: Sizes, work: Path, res: Results, *, sim: dict[str, Any], settle: float) -> None:
    """P3 and P4 again at the big cluster with its TrainJobs' pods present and the pods watch on (the
    service's default; without pods it watched none): ``sizes.big_pods`` realistic pods (bench/pods.py,
    10-18 KB of JSON each) written into the sim's store. P3's way per pod: (RSS after the pods synced -
    P3's RSS at the big cluster without pods) ÷ pods, what each watched pod costs in the informer's cache
    and the series."""
    added = asyncio.run(_post(sim["url"] + f"/bench/pods?count={sizes.big_pods}"))
    res.notes["big_cluster_pods"] = added
    pods = int(added["pods"])
    for rep in range(sizes.reps):
        service, base, _ = _ready_service(sim["kubeconfig"], work, f"svc-big-pods-{rep}")
        try:
            res.fig("p2_pods_synced_seconds").add(asyncio.run(_wait_pods_synced(base, pods, 600)))
            time.sleep(settle)
            rss = rss_bytes(service.pid)
            res.fig("p3_rss_big_pods").add(rss)
            res.fig("p3_bytes_per_pod").add((rss - res.fig("p3_rss_big").median) / pods)
            body = asyncio.run(_body(base))
            res.notes["p4_pods_pod_info_series"] = body.count(b"\nkubeflow_trainer_trainjob_pod_info{")
            res.notes["p4_pods_body_bytes"] = len(body)
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_TEXT))
            res.fig("p4_pods_p50").add(percentile(lat, 50))
            res.fig("p4_pods_p99").add(percentile(lat, 99))
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_DEFAULT))
            res.fig("p4_pods_om_p99").add(percentile(lat, 99))
        finally:
            service.stop()


def per_trainjob_at_scale(
    sizes: Sizes, work: Path, res: Results, *, kubeconfig: str, jobs: int, settle: float
) -> None:
    """P3 and P4 again at the big cluster with the per-TrainJob series on, capped at every TrainJob (the worst
    case: all of them exported). A tenth of the scrapes: a body of tens of MB takes a fraction of a second."""
    for rep in range(sizes.reps):
        service, base, _ = _ready_service(
            kubeconfig, work, f"svc-big-perjob-{rep}", per_trainjob_max_jobs=jobs
        )
        time.sleep(settle)
        rss = rss_bytes(service.pid)
        res.fig("p3_rss_big_per_job").add(rss)
        res.fig("p3_bytes_per_job_per_job").add((rss - res.fig("p3_rss_zero").median) / jobs)
        body = asyncio.run(_body(base))
        series = _series(body)
        res.notes["p4_per_job_series"] = len(series)
        res.notes["p4_per_job_only_series"] = sum(1 for s in series if s.startswith(_PER_JOB_FAMILIES))
        res.notes["p4_per_job_body_bytes"] = len(body)
        scrapes = max(10, sizes.scrapes // 10)
        lat = asyncio.run(_scrapes(base, scrapes, PROM_TEXT))
        res.fig("p4_per_job_p50").add(percentile(lat, 50))
        res.fig("p4_per_job_p99").add(percentile(lat, 99))
        lat = asyncio.run(_scrapes(base, scrapes, PROM_DEFAULT))
        res.fig("p4_per_job_om_p50").add(percentile(lat, 50))
        # ... and once scraped: the cached bodies (text, OpenMetrics, their gzip segments) are held too.
        res.fig("p3_rss_big_per_job_scraped").add(rss_bytes(service.pid))
        service.stop()


def mid_cluster(sizes: Sizes, work: Path, res: Results) -> None:
    """The size sweep's middle point (~10k TrainJobs in full mode, between the small and the big cluster), for
    ``--plot``: built as the big cluster is (generated jobs cloned), and measured as it is (start → ready, RSS
    after sync, ``/metrics`` p99 in text and OpenMetrics) by one service process: a point on a curve, not a
    target, so one repetition keeps the step cheap."""
    settle = 1.0 if sizes.quick else 3.0
    sim = start_sim(work, "sim-mid", sizes.big_base, sizes.mid_clone)
    info = sim.wait_ready(300)
    res.notes["mid_cluster"] = info
    try:
        service, base, startup = _ready_service(info["kubeconfig"], work, "svc-mid")
        try:
            res.fig("p2_mid_ready_seconds").add(startup)
            time.sleep(settle)
            res.fig("p3_rss_mid").add(rss_bytes(service.pid))
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_TEXT))
            res.fig("p4_mid_p99").add(percentile(lat, 99))
            lat = asyncio.run(_scrapes(base, sizes.scrapes, PROM_DEFAULT))
            res.fig("p4_mid_om_p99").add(percentile(lat, 99))
        finally:
            service.stop()
    finally:
        sim.stop()
    note_scaling(
        res,
        int(info["trainjobs"]),
        "sweep",
        ready="p2_mid_ready_seconds",
        rss="p3_rss_mid",
        p99_text="p4_mid_p99",
        p99_om="p4_mid_om_p99",
    )


def note_scaling(
    res: Results, trainjobs: int, source: str, *, ready: str, rss: str, p99_text: str, p99_om: str
) -> None:
    """One point of the size sweep in ``res.notes["scaling"]`` (what ``--plot`` draws), from the medians of a
    step's figures: ``ready`` (seconds start → /readyz 200), ``rss`` (bytes after sync), ``p99_text`` and
    ``p99_om`` (seconds). Kept sorted by size; a step that runs again replaces its point."""
    point = {
        "trainjobs": trainjobs,
        "source": source,
        "ready_s": round(res.figures[ready].median, 3),
        "rss_mib": round(res.figures[rss].median / 2**20, 1),
        "p99_text_ms": round(res.figures[p99_text].median * 1000, 3),
        "p99_openmetrics_ms": round(res.figures[p99_om].median * 1000, 3),
    }
    points = [p for p in res.notes.get("scaling", []) if p["source"] != source]
    res.notes["scaling"] = sorted([*points, point], key=lambda p: int(p["trainjobs"]))


# --------------------------------------------------------------------------------------------- P5


async def _get_json(session: aiohttp.ClientSession, url: str, *, post: bool = False) -> dict[str, Any]:
    async with session.request("POST" if post else "GET", url) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
        return dict(await resp.json())


async def _paced_scrapes(
    session: aiohttp.ClientSession, base: str, seconds: float
) -> tuple[list[float], float]:
    """``/metrics`` (text 0.0.4 + gzip) every 100 ms for ``seconds``, as a 10/s scraper would: the latencies
    and the window's length."""
    latencies = []
    t0 = time.monotonic()
    t_end = t0 + seconds
    while time.monotonic() < t_end:
        t = time.perf_counter()
        async with session.get(base + "/metrics", headers=PROM_TEXT) as resp:
            await resp.read()
        latencies.append(time.perf_counter() - t)
        await asyncio.sleep(max(0.0, 0.1 - (time.perf_counter() - t)))
    return latencies, time.monotonic() - t0


async def _scrape_idle(base: str, seconds: float, replay_url: str) -> dict[str, Any]:
    """P5's reference window: the same scrapes from the same process, synced, its watch open and held (the
    replay paused before the service connected), so the firehose window's p99 has a denominator that differs
    only by the ingest."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        # The first scrapes after a sync render from cold caches; with ~80 samples p99 is the slowest one, so
        # an unwarmed window would measure that, not the idle service.
        for _ in range(3):
            async with session.get(base + "/metrics", headers=PROM_TEXT) as resp:
                await resp.read()
        await _get_json(session, base + "/bench/lag?reset=1")  # the first call starts the probe
        await asyncio.sleep(0.5)
        await _get_json(session, base + "/bench/lag?reset=1")
        sent0 = (await _get_json(session, replay_url + "/bench/stats"))["sent"]
        latencies, _ = await _paced_scrapes(session, base, seconds)
        lag = await _get_json(session, base + "/bench/lag")
        sent1 = (await _get_json(session, replay_url + "/bench/stats"))["sent"]
    if sent1 != sent0:
        raise RuntimeError(f"P5 idle window: the replay sent {sent1 - sent0} events while paused")
    return {
        "max_lag": lag["max_lag"],
        "scrape_p50": percentile(latencies, 50),
        "scrape_p99": percentile(latencies, 99),
    }


async def _scrape_under_load(base: str, seconds: float, replay_url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        await _get_json(session, replay_url + "/bench/resume", post=True)
        await asyncio.sleep(0.5)  # the firehose up to speed before the window opens
        await _get_json(session, base + "/bench/lag?reset=1")
        sent0 = (await _get_json(session, replay_url + "/bench/stats"))["sent"]
        latencies, elapsed = await _paced_scrapes(session, base, seconds)
        lag = await _get_json(session, base + "/bench/lag?lags=1")
        sent1 = (await _get_json(session, replay_url + "/bench/stats"))["sent"]
    return {
        "max_lag": lag["max_lag"],
        "over_5ms": lag["over_5ms"],
        "samples": lag["samples"],
        "lags": lag["lags"],
        "scrape_p50": percentile(latencies, 50),
        "scrape_p99": percentile(latencies, 99),
        "scrapes_per_s": len(latencies) / elapsed,
        "events_per_s": (sent1 - sent0) / elapsed,
    }


async def _post(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        return await _get_json(session, url, post=True)


def _final_json(child: Child, timeout: float = 30) -> dict[str, Any]:
    """The last JSON line a child prints before it exits (after its ready line). Read while it runs: a line
    longer than the pipe's buffer (the control's lag samples) would otherwise block the child's exit."""
    assert child.proc.stdout is not None
    os.set_blocking(child.proc.stdout.fileno(), True)  # wait_ready left it non-blocking
    out, _ = child.proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith(b"{")]
    return dict(json.loads(lines[-1]))


def _stall_summary(lags: list[float]) -> dict[str, Any]:
    """A window's lag samples as P5's notes keep them: the log-bucket counts (bench/common.STALL_EDGES_MS)
    and a few exact percentiles, in ms; the raw samples (~8,000 a window) stay out of benchmarks.json."""
    return {
        "histogram": log_histogram(lags),
        "samples": len(lags),
        **{f"p{q:g}_ms": round(percentile(lags, q) * 1000, 3) for q in (50, 99, 99.9)},
        "max_ms": round(max(lags, default=float("nan")) * 1000, 3),
    }


def p5_stall(sizes: Sizes, work: Path, res: Results) -> None:
    """P5: per repetition one service process, first idle (the replay paused: synced, watch open, no event),
    then under the firehose (resumed) with the control beside it; both windows scraped 10/s."""
    kubeconfig = str(work / "replay5.kubeconfig")
    replay, info = start_replay(work, kubeconfig, "p5-replay", sizes.p1_jobs, "--forever")
    stalls: list[dict[str, Any]] = []
    res.notes["p5_stalls"] = {"edges_ms": list(STALL_EDGES_MS), "reps": stalls}
    try:
        for rep in range(sizes.reps):
            # Held before the service connects: its watch opens onto a stream that sends nothing yet.
            asyncio.run(_post(info["url"] + "/bench/pause"))
            service, base, _ = _ready_service(kubeconfig, work, f"svc-p5-{rep}", lag_probe=True)
            control: Child | None = None
            try:
                idle_window = asyncio.run(_scrape_idle(base, sizes.p5_seconds, info["url"]))
                # The control: an idle loop in its own process over the firehose window (bench/lagprobe.py).
                control = Child(
                    [PYTHON, "-m", "bench.lagprobe", "--seconds", str(sizes.p5_seconds + 0.5), "--lags"],
                    name=f"p5-control-{rep}",
                    log_dir=work,
                )
                control.wait_ready(30)
                waited, t0 = runqueue_wait_seconds(service.pid), time.monotonic()
                out = asyncio.run(_scrape_under_load(base, sizes.p5_seconds, info["url"]))
                waited = (runqueue_wait_seconds(service.pid) - waited) / (time.monotonic() - t0)
                beside = _final_json(control)  # the control over the firehose window
            finally:
                service.stop()
                if control is not None:
                    control.stop()
            res.fig("p5_runqueue_wait_percent").add(waited * 100)
            res.fig("p5_control_max_stall_ms").add(beside["max_lag"] * 1000)
            res.fig("p5_control_stalls_over_5ms").add(beside["over_5ms"])
            res.fig("p5_max_stall_ms").add(out["max_lag"] * 1000)
            res.fig("p5_stall_minus_control_ms").add((out["max_lag"] - beside["max_lag"]) * 1000)
            res.fig("p5_stalls_over_5ms").add(out["over_5ms"])
            res.fig("p5_idle_scrape_p99_ms").add(idle_window["scrape_p99"] * 1000)
            res.fig("p5_scrape_p99_ms").add(out["scrape_p99"] * 1000)
            res.fig("p5_scrape_p99_vs_idle").add(out["scrape_p99"] / idle_window["scrape_p99"])
            res.fig("p5_events_per_s").add(out["events_per_s"])
            res.fig("p5_scrapes_per_s").add(out["scrapes_per_s"])
            stalls.append(
                {
                    "rep": rep,
                    "service": _stall_summary(out["lags"]),
                    "control": _stall_summary(beside["lags"]),
                    "idle_window_max_stall_ms": round(idle_window["max_lag"] * 1000, 3),
                }
            )
    finally:
        replay.stop()


# --------------------------------------------------------------------------------------------- P6

_PROBE_LINE = re.compile(
    rb'kubeflow_trainer_trainjobs\{namespace="bench-probe",runtime_ref="[^"]*",state="(\w+)"\} 1'
)


async def _freshness(sim_url: str, base: str, probes: int, rate: float) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as session:
        async with session.post(sim_url + f"/bench/rate?rate={rate}") as resp:
            await resp.read()
        await asyncio.sleep(1.0)
        try:
            for _ in range(probes):
                async with session.post(sim_url + "/bench/probe") as resp:
                    probe = await resp.json()
                want = probe["state"].encode()
                deadline = time.monotonic() + 10
                while True:
                    async with session.get(base + "/metrics") as resp:
                        body = await resp.read()
                    seen = time.monotonic()
                    match = _PROBE_LINE.search(body)
                    if match is not None and match.group(1) == want:
                        out.append(seen - probe["t"])
                        break
                    if seen > deadline:
                        raise RuntimeError("probe write never became visible")
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0.02)
        finally:
            async with session.post(sim_url + "/bench/rate?rate=0") as resp:
                await resp.read()
    return out


def p6_freshness(sizes: Sizes, work: Path, res: Results, sim_info: dict[str, Any]) -> None:
    """P6, and P9's P6: the same probes against a service without PromQL-exact counting (alternating)."""
    for rep in range(sizes.reps):
        for exact in (True, False) if rep % 2 else (False, True):
            name = f"svc-p6-{rep}" if exact else f"svc-p6-plain-{rep}"
            service, base, _ = _ready_service(sim_info["kubeconfig"], work, name, exact=exact)
            try:
                lat = asyncio.run(_freshness(sim_info["url"], base, sizes.fresh_probes, sizes.fresh_rate))
            finally:
                service.stop()
            if exact:
                res.fig("p6_p50_ms").add(percentile(lat, 50) * 1000)
                res.fig("p6_p99_ms").add(percentile(lat, 99) * 1000)
            else:
                res.fig("p9_p6_p99_plain_ms").add(percentile(lat, 99) * 1000)
        with_exact, without = res.fig("p6_p99_ms").values[-1], res.fig("p9_p6_p99_plain_ms").values[-1]
        res.fig("p9_p6_p99_ratio").add(with_exact / without)
