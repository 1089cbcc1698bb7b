"""A bench-only API server that replays a prepared stream of TrainJob MODIFIED events as fast as it can.

Why not the simulated cluster: its watch path commits every event through the Store (defaulting,
managedFields, history) and queues it per watcher, ~20-40 k writes/s on one core, below what the informer
can ingest, so P1 would measure the sim. Here every event is a pre-serialized template with its
resourceVersion spliced in, written to the socket in ~200 KB batches.

The objects are real simulated-cluster objects made realistic: created by ``kubectl apply`` (so they carry
the ``kubectl.kubernetes.io/last-applied-configuration`` annotation and a kubectl-client-side-apply
managedFields entry), then status writes by the trainer controller (a second managedFields entry), so
lines are 2-4 KB like production TrainJobs. Each job cycles through four status variants: running,
running with ready pods and trainer progress, complete, and a refreshed complete (duplicate terminal).

Endpoints (cluster-wide and per-namespace paths of the three Trainer kinds):
- TrainJob LIST: the jobs in their first variant; WATCH: ``--events`` MODIFIED lines (then a clean end of
  stream) or, with ``--forever``, an endless stream (optionally paced with ``--rate``);
- runtimes LIST: the real runtimes; their WATCH stays open and idle;
- with ``--pods N``: pods (cluster-wide and per-namespace paths; the label selector is not applied, every pod
  has the JobSet label): N realistic pods of the TrainJobs (bench/pods.py, 10-18 KB each), LIST in their
  first variant and WATCH as for the TrainJobs, each pod cycling through four status writes: bound and
  pulling its image, running, running with its conditions rewritten (nothing the pods watch reads changes),
  succeeded. Without it the pods paths answer 404, as before (P5's service then has no pods watch);
- ``POST /bench/pause`` and ``POST /bench/resume``: hold every TrainJob watch stream (no byte is sent, the
  connections stay open) and let it go on; a watch that connects while paused holds before its first event.
  P5 measures the service idle (synced, stream held) and then under the firehose, in one process;
- ``GET /bench/stats``: events sent so far, the last resourceVersion, and whether the streams are paused.

``python -m bench.replay --jobs 2000 --events 60000 --kubeconfig K`` prints ``{"ready": ..., "url": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
from typing import Any

import orjson
from aiohttp import web

from bench import pods
from kubesim.apiserver.core import PODS
from kubesim.apiserver.http.kubeconfig import write_kubeconfig
from kubesim.apiserver.storage.store import Store
from kubesim.trainer import controller, jobset
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS

_RV_MARK = "__RV_MARK__"
_BATCH_BYTES = 256 * 1024


Template = tuple[bytes, bytes]  # a watch line's bytes before and after its resourceVersion


def _template(obj: dict[str, Any]) -> Template:
    marked = dict(obj, metadata=dict(obj["metadata"], resourceVersion=_RV_MARK))
    prefix, _, suffix = orjson.dumps(marked).partition(b'"' + _RV_MARK.encode() + b'"')
    return b'{"type":"MODIFIED","object":' + prefix + b'"', b'"' + suffix + b"}\n"


def build_pod_events(
    store: Store, trainjobs: list[dict[str, Any]], count: int
) -> tuple[list[Template], list[bytes]]:
    """(event templates, list items) of ``count`` pods of ``trainjobs`` written into ``store``: created
    bound to a node, then four status writes per pod (bench/pods.py); the stream goes through the pods
    variant by variant, as it does the TrainJobs."""
    variants: list[list[Template]] = []
    items: list[bytes] = []
    for spot, _ in pods.spots(trainjobs, count):
        obj = pods.pod_object(spot, gpus=8)
        obj["spec"]["nodeName"] = spot.node
        store.create(PODS, spot.namespace, obj, field_manager="kube-controller-manager", copy=False)
        running = pods.pod_status(spot, pods.RUNNING)
        rewritten = dict(
            running, conditions=[dict(c, lastProbeTime=pods.LATER) for c in running["conditions"]]
        )
        own: list[Template] = []
        for i, status in enumerate(
            (pods.pod_status(spot, pods.PENDING), running, rewritten, pods.pod_status(spot, pods.SUCCEEDED))
        ):
            written = store.patch(
                PODS,
                spot.namespace,
                spot.name,
                {"status": status},
                subresource="status",
                field_manager="kubelet",
                copy=False,
            )
            if i == 0:
                items.append(orjson.dumps(written))
            own.append(_template(written))
        variants.append(own)
    return [own[v] for v in range(4) for own in variants], items


def build_events(jobs: int, seed: int = 7) -> tuple[list[Template], list[bytes], list[bytes]]:
    """(event templates as (prefix, suffix) around the resourceVersion, job list items, runtime items)."""
    gen_store = trainer_store()
    gen = WorkloadGenerator(gen_store, seed=seed, namespaces=20, max_jobs=jobs)
    gen.load_runtimes()
    gen.populate(jobs)
    store = trainer_store(history_window=0)
    runtimes: list[bytes] = []
    for kind in (CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES):
        for entry in gen_store.entries(kind, None):
            runtimes.append(entry.raw)
    templates: list[tuple[bytes, bytes]] = []
    items: list[bytes] = []
    variants: list[list[bytes]] = []
    for entry in gen_store.entries(TRAINJOBS, None):
        src = entry.obj
        meta = src["metadata"]
        applied_meta = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta}
        applied = {
            "apiVersion": src["apiVersion"],
            "kind": src["kind"],
            "metadata": applied_meta,
            "spec": src["spec"],
        }
        annotations = dict(meta.get("annotations") or {})
        annotations["kubectl.kubernetes.io/last-applied-configuration"] = (
            orjson.dumps(applied).decode() + "\n"
        )
        doc: dict[str, Any] = {
            "apiVersion": src["apiVersion"],
            "kind": src["kind"],
            "metadata": {**applied_meta, "annotations": annotations},
            "spec": src["spec"],
        }
        ns, name = meta["namespace"], meta["name"]
        store.create(TRAINJOBS, ns, doc, field_manager="kubectl-client-side-apply", copy=False)
        now = controller.rfc3339(1.7e9)
        complete = controller.condition(
            controller.COMPLETE, "True", jobset.ALL_JOBS_COMPLETED, jobset.ALL_JOBS_COMPLETED_MESSAGE, now
        )
        statuses: list[dict[str, Any]] = [
            {"conditions": [], "jobsStatus": jobset.status_of({"node": jobset.STARTING})},
            {
                "conditions": [],
                "jobsStatus": jobset.status_of({"node": jobset.READY}),
                "trainerStatus": {"progressPercentage": 40, "lastUpdatedTime": now},
            },
            {
                "conditions": [complete],
                "jobsStatus": jobset.status_of({"node": jobset.SUCCEEDED}),
            },
            {
                "conditions": [complete],
                "jobsStatus": jobset.status_of({"node": jobset.SUCCEEDED}),
                "trainerStatus": {
                    "progressPercentage": 100,
                    "lastUpdatedTime": now,
                    "metrics": [{"name": "loss", "value": "0.1234"}],
                },
            },
        ]
        own: list[bytes] = []
        for i, status in enumerate(statuses):
            obj = store.patch(
                TRAINJOBS,
                ns,
                name,
                {"status": status},
                subresource="status",
                field_manager="trainer-controller",
                copy=False,
            )
            if i == 0:
                items.append(orjson.dumps(obj))
            marked = dict(obj, metadata=dict(obj["metadata"], resourceVersion=_RV_MARK))
            own.append(orjson.dumps(marked))
        variants.append(own)
    for v in range(4):
        for own in variants:
            prefix, _, suffix = own[v].partition(b'"' + _RV_MARK.encode() + b'"')
            templates.append((b'{"type":"MODIFIED","object":' + prefix + b'"', b'"' + suffix + b"}\n"))
    return templates, items, runtimes


class Replay:
    def __init__(self, args: argparse.Namespace) -> None:
        self.templates, self.items, self.runtimes = build_events(args.jobs, args.seed)
        self.pod_templates: list[Template] = []
        self.pod_items: list[bytes] = []
        if args.pods:
            trainjobs = [orjson.loads(item) for item in self.items]
            self.pod_templates, self.pod_items = build_pod_events(
                trainer_store(history_window=0), trainjobs, args.pods
            )
        self.events = args.events
        self.forever = args.forever
        self.rate = args.rate
        self.rv = len(self.items) + len(self.pod_items) + len(self.runtimes) + 10
        self.list_rv = self.rv
        self.sent = 0
        # Set while the streams may flow; cleared by POST /bench/pause (created here: one loop serves all).
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.app = web.Application()
        self.app.router.add_get("/bench/stats", self.stats)
        self.app.router.add_post("/bench/pause", self.pause)
        self.app.router.add_post("/bench/resume", self.resume)
        self.app.router.add_get("/{tail:.*}", self.handle)

    def sizes(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for prefix, templates in (("line_bytes", self.templates), ("pod_line_bytes", self.pod_templates)):
            lengths = [len(p) + len(s) + 6 for p, s in templates]
            if lengths:
                out |= {
                    f"{prefix}_median": statistics.median(lengths),
                    f"{prefix}_min": min(lengths),
                    f"{prefix}_max": max(lengths),
                }
        return out

    async def stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"sent": self.sent, "rv": self.rv, "paused": not self.flowing.is_set()})

    async def pause(self, request: web.Request) -> web.StreamResponse:
        """Hold the streams. A stream checks between batches, so what it is writing now (at most one batch)
        still goes out; ``sent`` stops moving at once."""
        self.flowing.clear()
        return await self.stats(request)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        self.flowing.set()
        return await self.stats(request)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        watch = request.query.get("watch", "").lower() in ("1", "true")
        if path.endswith("/trainjobs"):
            if watch:
                return await self._stream(request, self.templates)
            return self._list("TrainJobList", self.items)
        if path.endswith("/pods") and self.pod_templates:
            if watch:
                return await self._stream(request, self.pod_templates)
            return self._list("PodList", self.pod_items, api_version="v1")
        if path.endswith("/clustertrainingruntimes") or path.endswith("/trainingruntimes"):
            kind = "ClusterTrainingRuntimeList" if "cluster" in path else "TrainingRuntimeList"
            if watch:
                return await self._idle(request)
            wanted = b'"kind":"ClusterTrainingRuntime"' if "cluster" in path else b'"kind":"TrainingRuntime"'
            return self._list(kind, [r for r in self.runtimes if wanted in r])
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)

    def _list(
        self, kind: str, items: list[bytes], *, api_version: str = "trainer.kubeflow.org/v1alpha1"
    ) -> web.Response:
        body = (
            b'{"kind":"' + kind.encode() + b'","apiVersion":"' + api_version.encode() + b'","metadata":'
            b'{"resourceVersion":"' + str(self.list_rv).encode() + b'"},"items":[' + b",".join(items) + b"]}"
        )
        return web.Response(body=body, content_type="application/json")

    async def _idle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await asyncio.sleep(3600)
        return resp

    async def _stream(self, request: web.Request, templates: list[Template]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        n_templates = len(templates)
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent_here = 0
        batch: list[bytes] = []
        size = 0
        while self.forever or sent_here < self.events:
            if not batch and not self.flowing.is_set():
                held = loop.time()
                await self.flowing.wait()
                start += loop.time() - held  # --rate paces the time streamed, not the time held
            self.rv += 1
            prefix, suffix = templates[self.sent % n_templates]
            batch.append(prefix)
            batch.append(str(self.rv).encode())
            batch.append(suffix)
            size += len(prefix) + len(suffix)
            self.sent += 1
            sent_here += 1
            if size >= _BATCH_BYTES or (self.rate and sent_here % max(1, int(self.rate / 100)) == 0):
                await resp.write(b"".join(batch))
                batch, size = [], 0
                if self.rate:
                    delay = start + sent_here / self.rate - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
        if batch:
            await resp.write(b"".join(batch))
        await resp.write_eof()
        return resp


async def serve(args: argparse.Namespace) -> None:
    replay = Replay(args)
    runner = web.AppRunner(replay.app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}"
    write_kubeconfig(args.kubeconfig, url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(
        json.dumps(
            {
                "ready": True,
                "url": url,
                "jobs": len(replay.items),
                "pods": len(replay.pod_items),
                **replay.sizes(),
            }
        )
        + "\n"
    )
    sys.stdout.flush()
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.replay")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--events", type=int, default=60_000, help="events per watch request")
    p.add_argument("--forever", action="store_true", help="stream without end")
    p.add_argument("--rate", type=float, default=0.0, help="events/s (0 = as fast as possible)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--pods", type=int, default=0, help="pods of the TrainJobs to serve (0: no pods)")
    asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()
