"""The benchmarks' pods (bench/pods.py), the replay's pods stream (bench/replay.py ``--pods``) and P1's pods
rows (bench/pod_ingest.py): they run and report; the figures themselves are the benchmark's, not tested."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import orjson
import pytest
from aiohttp import web

from app.trainer import rules
from app.trainer.pods import PodProjector
from bench import pod_ingest, pods, replay, simproc
from bench.scenarios import _CountingHandler, _pipeline
from kubesim.apiserver.core import PODS
from kubesim.apiserver.http.kubeconfig import write_kubeconfig
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS


def _trainjobs(jobs: int) -> tuple[Any, list[dict[str, Any]]]:
    store = trainer_store(history_window=0)
    gen = WorkloadGenerator(store, seed=3, namespaces=5, max_jobs=jobs)
    gen.load_runtimes()
    gen.populate(jobs)
    return store, [e.obj for e in store.entries(TRAINJOBS, None)]


def test_written_pods_are_realistic_jobset_pods_of_their_trainjobs() -> None:
    store, trainjobs = _trainjobs(20)
    assert pods.write_pods(store, trainjobs, 60) == 60
    entries = store.entries(PODS, None)
    assert len(entries) == 60
    names = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in trainjobs}
    projector = PodProjector()
    decode = msgspec.json.Decoder(projector.wire_type).decode
    for entry in entries:
        assert 5_000 <= len(entry.raw) <= 20_000  # production pods' size: the watch must skip the rest
        typed = projector.from_wire(decode(entry.raw))
        assert typed == projector.from_json(orjson.loads(entry.raw))  # both ways read them alike
        assert not typed.malformed
        job = names[(typed.namespace, typed.jobset)]  # the JobSet is named after its TrainJob
        assert typed.replicated_job == "node" and typed.restart_attempt == 0
        assert typed.node and typed.phase == pods.job_phase(job)
        assert typed.devices == (("nvidia.com/gpu", 8),)
        labels = entry.obj["metadata"]["labels"]
        assert labels[rules.JOBSET_NAME_LABEL] == typed.jobset
        assert labels["batch.kubernetes.io/job-name"] == entry.obj["metadata"]["ownerReferences"][0]["name"]
        # both writers' managedFields, as a real API server keeps them
        managers = {m["manager"] for m in entry.obj["metadata"]["managedFields"]}
        assert managers == {"kube-controller-manager", "kubelet"}
    # more pods than the TrainJobs' nodes: further rounds of child Jobs, never a name twice
    assert pods.write_pods(trainer_store(history_window=0), trainjobs[:2], 40) == 40


def test_the_simulator_adds_pods_to_its_trainjobs_on_request() -> None:
    store, _ = _trainjobs(10)
    added = simproc.write_pods(store, 25)
    assert added["pods"] == 25 == store.count(PODS)
    assert 5_000 <= added["pod_bytes_min"] <= added["pod_bytes_median"] <= added["pod_bytes_max"] <= 20_000


def _replay_args(**kw: Any) -> argparse.Namespace:
    args = {"jobs": 20, "events": 400, "forever": False, "rate": 0.0, "seed": 7, "pods": 30, **kw}
    return argparse.Namespace(**args)


@pytest.fixture
async def replay_url(tmp_path: Path) -> AsyncIterator[tuple[str, str, replay.Replay]]:
    server = replay.Replay(_replay_args())
    runner = web.AppRunner(server.app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    kubeconfig = str(tmp_path / "replay.kubeconfig")
    write_kubeconfig(kubeconfig, url)
    try:
        yield url, kubeconfig, server
    finally:
        await runner.cleanup()


async def test_the_replay_serves_pods_list_and_watch_only_when_asked(
    replay_url: tuple[str, str, replay.Replay],
) -> None:
    url, _, server = replay_url
    assert server.sizes()["pod_line_bytes_min"] >= 5_000
    async with aiohttp.ClientSession() as session:
        async with session.get(url + f"/api/v1/pods?labelSelector={rules.POD_SELECTOR}") as resp:
            listing = await resp.json()
        assert listing["kind"] == "PodList" and len(listing["items"]) == 30
        async with session.get(url + "/api/v1/namespaces/x/pods?watch=true") as resp:
            lines = (await resp.read()).splitlines()
    assert len(lines) == 400
    projector = PodProjector()
    rvs = []
    for line in lines:
        event = orjson.loads(line)
        assert event["type"] == "MODIFIED" and event["object"]["kind"] == "Pod"
        assert projector.from_json(event["object"]) is not None
        rvs.append(int(event["object"]["metadata"]["resourceVersion"]))
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    # without --pods the pods paths answer 404, as an API server without pods (P5's service watches none)
    bare = replay.Replay(_replay_args(pods=0))
    assert bare.pod_templates == [] and "pod_line_bytes_median" not in bare.sizes()


async def test_p1_pods_rows_run_the_pods_informer_and_the_kubernetes_asyncio_watch(
    replay_url: tuple[str, str, replay.Replay],
) -> None:
    url, kubeconfig, _ = replay_url
    async with aiohttp.ClientSession() as session, session.get(url + TRAINJOBS.collection_path(None)) as resp:
        trainjob_list = await resp.read()
    series = pod_ingest.pod_series(_pipeline, trainjob_list)
    live = await asyncio.wait_for(pod_ingest.informer_rate(kubeconfig, 200, series, _CountingHandler), 60)
    assert live > 0 and series.pods == 30
    statuses = series.pod_statuses()  # every pod's TrainJob is known to the series
    assert statuses["no_trainjob"] == statuses["older_than_trainjob"] == 0 and statuses["exported"] > 0
    other = pod_ingest.pod_series(_pipeline, trainjob_list)
    baseline = await asyncio.wait_for(pod_ingest.baseline_rate(kubeconfig, 100, other), 60)
    assert baseline > 0 and other.pods == 30
