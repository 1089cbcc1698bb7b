"""P8: P2, P3 and P4 at a million TrainJobs, for the paginated LIST and for the streaming list.

One simulated cluster of ``jobs`` TrainJobs (generated jobs cloned, as for the 100k cluster of
``services_at_scale``, so the metric label sets stay those of the small cluster), then for each way of
syncing (``TRAINER_METRICS_STREAMING_LIST`` off, then on) the measures of ``services_at_scale``:

- P2: process start → ``/readyz`` 200, ÷ a bare paginated fetch (limit 500) + ``orjson.loads`` of the same
  TrainJobs; the bare streaming-list fetch + ``orjson.loads`` (up to the initial-events-end bookmark) is
  reported alongside;
- P3: RSS of the service after sync minus its RSS against a cluster without TrainJobs, ÷ jobs; the high-water
  RSS (VmHWM) shows what the sync needed at its peak;
- P4: ``/metrics`` latency at that size (text 0.0.4 + gzip, and Prometheus' default Accept).

Also recorded (``notes``): the simulated cluster's own RSS and build time, the scenario's wall time, and the
paginated LIST's figures as the largest point of the size sweep (``notes["scaling"]``, for ``--plot``).
Full mode: 1,000,000 TrainJobs (~1000 generated x 1000 copies); quick mode: 1,000 (CI smoke run).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson

from bench.common import peak_rss_bytes, percentile, rss_bytes
from bench.scenarios import (
    PROM_DEFAULT,
    PROM_TEXT,
    TRAINJOBS_PATH,
    Results,
    Sizes,
    _fetch_and_decode,
    _ready_service,
    _scrapes,
    note_scaling,
    start_sim,
)

FULL_JOBS = 1_000_000
QUICK_JOBS = 1_000
MODES = (("list", "off"), ("stream", "on"))
INITIAL_EVENTS_END = b"k8s.io/initial-events-end"


def cluster_shape(jobs: int) -> tuple[int, int]:
    """(generated, copies) giving about ``jobs`` TrainJobs: at most 1000 generated, the rest clones."""
    base = max(1, min(1000, jobs))
    return base, max(1, round(jobs / base))


async def _stream_fetch_and_decode(url: str) -> float:
    """Seconds to read a streaming list up to its initial-events-end bookmark, ``orjson.loads`` per line."""
    query = {
        "watch": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "3600",
    }
    t = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url + TRAINJOBS_PATH, params=query) as resp,
    ):
        if resp.status != 200:
            raise RuntimeError(f"streaming list answered {resp.status}")
        pending = b""
        async for chunk in resp.content.iter_any():
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line:
                    continue
                event = orjson.loads(line)
                if event["type"] == "BOOKMARK" and INITIAL_EVENTS_END in line:
                    return time.perf_counter() - t
    raise RuntimeError("streaming list ended without the initial-events-end bookmark")


def p8_million(sizes: Sizes, work: Path, res: Results, *, jobs: int = 0, reps: int = 1) -> None:
    """P2/P3/P4 at ``jobs`` TrainJobs (default: 1M, quick 1k), paginated LIST vs streaming list."""
    started = time.monotonic()
    jobs = jobs or (QUICK_JOBS if sizes.quick else FULL_JOBS)
    settle = 1.0 if sizes.quick else 3.0
    # Budgets scale with the size (the 100k cluster builds in ~10 s and syncs in ~4 s on the reference host).
    budget = max(300.0, jobs / 1000.0)

    zero = start_sim(work, "p8-sim-0", 0, 1)
    info0 = zero.wait_ready(120)
    try:
        for mode, setting in MODES:
            for rep in range(reps):
                service, _, _ = _ready_service(
                    info0["kubeconfig"], work, f"p8-svc-0-{mode}-{rep}", streaming_list=setting
                )
                time.sleep(settle)
                res.fig(f"p8_{mode}_rss_zero").add(rss_bytes(service.pid))
                service.stop()
    finally:
        zero.stop()

    base, copies = cluster_shape(jobs)
    sim = start_sim(work, "p8-sim-big", base, copies)
    info = sim.wait_ready(2 * budget)
    res.notes["p8_cluster"] = info
    count = int(info["trainjobs"])
    res.notes["p8_sim_rss_built"] = rss_bytes(sim.pid)
    try:
        for rep in range(reps):
            res.fig("p8_fetch_decode_seconds").add(asyncio.run(_fetch_and_decode(info["url"], 500)))
            res.fig("p8_stream_fetch_decode_seconds").add(asyncio.run(_stream_fetch_and_decode(info["url"])))
            for mode, setting in MODES:
                service, url, startup = _ready_service(
                    info["kubeconfig"],
                    work,
                    f"p8-svc-big-{mode}-{rep}",
                    timeout=budget,
                    streaming_list=setting,
                )
                try:
                    _measure(res, mode, service.pid, url, startup=startup, jobs=count, sizes=sizes)
                finally:
                    service.stop()
        res.notes["p8_sim_rss_end"] = rss_bytes(sim.pid)
        res.notes["p8_sim_peak_rss"] = peak_rss_bytes(sim.pid)
    finally:
        sim.stop()
    # The size sweep's largest point (--plot): the paginated LIST, the way the small and big clusters sync.
    note_scaling(
        res,
        count,
        "P8, paginated LIST",
        ready="p8_list_ready_seconds",
        rss="p8_list_rss_big",
        p99_text="p8_list_p4_p99",
        p99_om="p8_list_p4_om_p99",
    )
    res.notes["p8_wall_seconds"] = round(time.monotonic() - started, 1)


def _measure(res: Results, mode: str, pid: int, url: str, *, startup: float, jobs: int, sizes: Sizes) -> None:
    p = f"p8_{mode}"
    settle = 1.0 if sizes.quick else 3.0
    scrapes = sizes.scrapes
    res.fig(f"{p}_ready_seconds").add(startup)
    res.fig(f"{p}_ratio").add(startup / res.fig("p8_fetch_decode_seconds").values[-1])
    time.sleep(settle)
    rss = rss_bytes(pid)
    res.fig(f"{p}_rss_big").add(rss)
    res.fig(f"{p}_peak_rss").add(peak_rss_bytes(pid))
    res.fig(f"{p}_bytes_per_job").add((rss - res.fig(f"{p}_rss_zero").median) / jobs)
    lat = asyncio.run(_scrapes(url, scrapes, PROM_TEXT))
    res.fig(f"{p}_p4_p50").add(percentile(lat, 50))
    res.fig(f"{p}_p4_p99").add(percentile(lat, 99))
    lat = asyncio.run(_scrapes(url, scrapes, PROM_DEFAULT))
    res.fig(f"{p}_p4_om_p99").add(percentile(lat, 99))
