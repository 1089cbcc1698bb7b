"""The simulated cluster as a benchmark process: ``python -m bench.simproc --jobs 1000 --clone 100``.

Builds the store before listening: ``--jobs`` TrainJobs from the workload generator (seeded) in 100
namespaces with the ~200 real runtimes, then each job cloned ``--clone - 1`` more times under new names
(same namespace, runtime, spec and status). Cloning keeps the set of metric label sets the same at 1k and
100k jobs, which P4's ratio needs. Then ``gc.freeze()`` and every object's JSON is serialized once, so a
measurement never pays for the sim's own warm-up.

Bench-only control routes (added through ``SimServer.add_route``):
- ``POST /bench/rate?rate=R``: run the generator at R steps/s in the background (0 stops it);
- ``POST /bench/pods?count=N``: write N realistic pods of the TrainJobs into the store (bench/pods.py: bound
  to nodes, in their TrainJob's phase, 10-18 KB of JSON each), serialized once like the rest; answers how
  many, the seconds it took and their JSON sizes. P3 and P4 with pods (bench/scenarios.py) add them to the
  big cluster after its measurements without pods;
- ``POST /bench/probe``: flip the probe TrainJob (namespace ``bench-probe``) between running and pending
  with one status write; answers the new state and ``time.monotonic()`` right after the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys
import time
from typing import Any

from aiohttp import web

from bench import pods
from kubesim.apiserver.core import PODS
from kubesim.apiserver.storage.store import Store
from kubesim.trainer import jobset
from kubesim.trainer.cluster import SimulatedCluster, trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from kubesim.trainer.shapes_runtimes import API_VERSION

PROBE_NS = "bench-probe"
PROBE_NAME = "freshness-probe"
PROBE_RUNTIME = "torch-distributed"


def clone_jobs(store: Store, copies: int) -> int:
    """Create ``copies`` clones of every TrainJob; returns how many were made."""
    made = 0
    originals = store.entries(TRAINJOBS, None)
    for i in range(1, copies + 1):
        for entry in originals:
            obj = entry.obj
            meta = obj["metadata"]
            name = f"c{i}-{meta['name']}"
            if len(name) > 63:  # keep the original's unique suffix, drop from the front of its base
                name = f"c{i}-{meta['name'][len(name) - 63 :]}"
            new_meta: dict[str, Any] = {"name": name, "namespace": meta["namespace"]}
            for key in ("labels", "annotations", "finalizers"):
                if key in meta:
                    new_meta[key] = meta[key]
            doc = {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": new_meta,
                "spec": obj["spec"],
            }
            store.create(TRAINJOBS, meta["namespace"], doc, copy=False)
            if obj.get("status"):
                store.patch(
                    TRAINJOBS,
                    meta["namespace"],
                    new_meta["name"],
                    {"status": obj["status"]},
                    subresource="status",
                    copy=False,
                )
            made += 1
    return made


def write_pods(store: Store, count: int) -> dict[str, Any]:
    """``count`` pods of the TrainJobs (not the probe's) written into ``store`` and serialized once, then
    frozen out of the cyclic GC's way as the rest of the cluster: how many, the seconds it took, their JSON
    sizes."""
    t = time.monotonic()
    trainjobs = [e.obj for e in store.entries(TRAINJOBS, None) if e.key[0] != PROBE_NS]
    made = pods.write_pods(store, trainjobs, count)
    sizes = sorted(len(entry.raw) for entry in store.entries(PODS, None))
    gc.collect()
    gc.freeze()
    return {
        "pods": made,
        "seconds": round(time.monotonic() - t, 2),
        "pod_bytes_median": sizes[len(sizes) // 2] if sizes else 0,
        "pod_bytes_min": sizes[0] if sizes else 0,
        "pod_bytes_max": sizes[-1] if sizes else 0,
    }


def _probe_status(running: bool) -> dict[str, Any]:
    return {
        "conditions": [],
        # running = a training-step child Job ready, not merely active (app/trainer/rules job_state)
        "jobsStatus": jobset.status_of({"node": jobset.READY if running else jobset.CREATED}),
    }


async def serve(args: argparse.Namespace) -> None:
    started = time.monotonic()
    store = trainer_store(history_window=args.history_window)
    generator = WorkloadGenerator(
        store, seed=args.seed, namespaces=args.namespaces, max_jobs=max(args.jobs, 1)
    )
    generator.load_runtimes(extra=args.extra_runtimes)
    gc.disable()
    if args.jobs:
        generator.populate(args.jobs)
    if args.clone > 1:
        clone_jobs(store, args.clone - 1)
    ref = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": PROBE_RUNTIME}
    store.create(
        TRAINJOBS,
        PROBE_NS,
        {
            "apiVersion": API_VERSION,
            "kind": "TrainJob",
            "metadata": {"name": PROBE_NAME, "namespace": PROBE_NS},
            "spec": {"runtimeRef": ref, "trainer": {"numNodes": 1}},
        },
    )
    for entry in (
        store.entries(TRAINJOBS, None)
        + store.entries(TRAINING_RUNTIMES, None)
        + store.entries(CLUSTER_TRAINING_RUNTIMES, None)
    ):
        _ = entry.raw  # serialize once now, not during a measured LIST
    gc.collect()
    gc.freeze()  # everything built so far lives on: keep the cyclic GC from rescanning it
    gc.enable()
    build_seconds = time.monotonic() - started

    probe_state = {"running": False}
    runner: dict[str, asyncio.Task[int] | None] = {"task": None}
    stop_rate = asyncio.Event()

    async def rate(request: web.Request) -> web.StreamResponse:
        value = float(request.query.get("rate", "0"))
        task = runner["task"]
        if task is not None:
            stop_rate.set()
            await task
            stop_rate.clear()
            runner["task"] = None
        if value > 0:
            runner["task"] = asyncio.create_task(generator.run(value, stop_rate))
        return web.json_response({"rate": value, "rv": store.resource_version})

    async def probe(request: web.Request) -> web.StreamResponse:
        running = not probe_state["running"]
        store.patch(TRAINJOBS, PROBE_NS, PROBE_NAME, {"status": _probe_status(running)}, subresource="status")
        committed = time.monotonic()
        probe_state["running"] = running
        return web.json_response(
            {"t": committed, "state": "running" if running else "pending", "rv": store.resource_version}
        )

    async def add_pods(request: web.Request) -> web.StreamResponse:
        return web.json_response(write_pods(store, int(request.query.get("count", "0"))))

    cluster = SimulatedCluster(args.host, args.port, store=store, bookmark_interval=args.bookmark_interval)
    cluster.server.add_route("POST", "/bench/rate", rate)
    cluster.server.add_route("POST", "/bench/probe", probe)
    cluster.server.add_route("POST", "/bench/pods", add_pods)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with cluster:
        cluster.write_kubeconfig(args.kubeconfig)
        info = {
            "ready": True,
            "url": cluster.url,
            "kubeconfig": args.kubeconfig,
            "trainjobs": store.count(TRAINJOBS),
            "runtimes": store.count(TRAINING_RUNTIMES) + store.count(CLUSTER_TRAINING_RUNTIMES),
            "namespaces": len({e.key[0] for e in store.entries(TRAINJOBS, None)}),
            "build_seconds": round(build_seconds, 2),
        }
        sys.stdout.write(json.dumps(info) + "\n")
        sys.stdout.flush()
        await stop.wait()
        if runner["task"] is not None:
            stop_rate.set()
            await runner["task"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.simproc")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--clone", type=int, default=1, help="total copies of each generated job (1 = none)")
    p.add_argument("--namespaces", type=int, default=100)
    p.add_argument("--extra-runtimes", type=int, default=0)
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--history-window", type=int, default=100_000)
    p.add_argument("--bookmark-interval", type=float, default=60.0)
    asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()
