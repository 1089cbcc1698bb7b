"""Where a watched pod's bytes go: the live memory of the service, by the line that allocated it, per pod.

    .venv/bin/python -m bench.pod_memory [--pods 20000] [--jobs 1000 --clone 30] [--top 30]

Two runs against a bench.simproc cluster (``--jobs`` generated TrainJobs cloned ``--clone`` times), each with
the service in this process (tests/support/replica_inprocess.py) under tracemalloc from its start: one without
pods, one with ``--pods`` pods of its TrainJobs (bench/pods.py, what P3 per watched pod writes) written
before the service starts, so that the pods watch lists them as P3's does. Each run waits until the pods
watch holds every pod, scrapes ``/metrics`` with gzip as Prometheus does, collects, and snapshots; the
difference of the two snapshots, by line and ÷ pods, is what a pod costs (traced objects only: the RSS P3
measures also holds the allocator's free heap). Nothing here is asserted: it prints the table that
docs/benchmarks.md's P3 paragraph sums up.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import sys
import tempfile
import tracemalloc
from pathlib import Path

import httpx

from bench.scenarios import start_sim
from tests.support.replica_inprocess import settings_for, start_replica

_PODS_SEEN = re.compile(rb'trainer_metrics_pod_series_pods\{status="[a-z_]+"\} ([0-9.e+]+)')
# Long enough that a loaded host neither loses the Lease nor restarts a watch while the pods are listed.
_STEADY = {
    "lease_duration_seconds": 60.0,
    "renew_deadline_seconds": 40.0,
    "watch_inactivity_timeout_seconds": 300.0,
    "watch_timeout_min_seconds": 300,
    "watch_timeout_max_seconds": 600,
}


async def _traced_run(work: Path, jobs: int, clone: int, pods: int) -> tuple[int, dict[str, tuple[int, int]]]:
    """(pods written, {file:line: (bytes, objects)}) of one run."""
    sim = start_sim(work, "sim", jobs, clone)
    info = sim.wait_ready(300)
    try:
        written = 0
        if pods:
            async with httpx.AsyncClient(timeout=600) as client:
                resp = await client.post(info["url"] + f"/bench/pods?count={pods}")
                written = int(resp.json()["pods"])
        tracemalloc.start(1)
        replica = await start_replica(settings_for(Path(info["kubeconfig"]), "pod-memory", **_STEADY))
        try:
            await _wait_synced(replica.http, written)
            await replica.http.get("/metrics", headers={"Accept-Encoding": "gzip"})
            gc.collect()
            snapshot = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
            await replica.stop()
    finally:
        sim.stop()
    lines = {}
    for stat in snapshot.statistics("lineno"):
        frame = stat.traceback[0]
        lines[f"{frame.filename}:{frame.lineno}"] = (stat.size, stat.count)
    return written, lines


async def _wait_synced(http: httpx.AsyncClient, pods: int) -> None:
    """Until the replica is ready, leads, and its pods watch holds ``pods`` pods (no body kept after)."""
    for _ in range(3000):
        if (await http.get("/readyz")).status_code == 200:
            body = (await http.get("/metrics")).content
            if b"kubeflow_trainer_" in body and sum(float(v) for v in _PODS_SEEN.findall(body)) >= pods:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the pods watch never held the {pods} pods")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pod_memory", description=__doc__.split("\n")[0])
    p.add_argument("--pods", type=int, default=20_000)
    p.add_argument("--jobs", type=int, default=1_000, help="generated TrainJobs of the simulated cluster")
    p.add_argument("--clone", type=int, default=30, help="each generated TrainJob cloned this many times")
    p.add_argument("--top", type=int, default=30, help="lines to print")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pod-memory-") as tmp:
        _, without = asyncio.run(_traced_run(Path(tmp), args.jobs, args.clone, 0))
        pods, with_pods = asyncio.run(_traced_run(Path(tmp), args.jobs, args.clone, args.pods))
    root = str(Path(__file__).resolve().parent.parent) + "/"
    rows = []
    for line in with_pods.keys() | without.keys():
        size, count = with_pods.get(line, (0, 0))
        base_size, base_count = without.get(line, (0, 0))
        rows.append((size - base_size, count - base_count, line.removeprefix(root)))
    rows.sort(reverse=True)
    print(f"{pods:,} pods: {sum(r[0] for r in rows) / pods:,.0f} B traced per pod")
    for size, count, line in rows[: args.top]:
        print(f"{size / pods:8.1f} B {count / pods:6.2f} objects per pod  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
