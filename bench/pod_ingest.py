"""P1's pods rows: the pods watch's ingest rate on bench/replay.py's pods stream (``--pods``), and
kubernetes-asyncio's ``Watch`` on the same stream, each feeding the same pod series.

The pipeline is the service's (app/replica/pods.py): the pods informer with the service's projector and label
selector, ``PodSeriesHandler`` into a ``PodSeries`` that knows the replay's TrainJobs (fed from their LIST
through ``PodJobHandler``, as the TrainJob informer feeds it), its changes told to the metric state. P1's
TrainJob pipeline and its counting handler come from bench/scenarios.py, which passes them in (``pipeline``,
``counting``) so this module does not import it back.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from bench.watch_baseline import timed_watch

PODS_PATH = "/api/v1/pods"


class Counting(Protocol):
    """bench/scenarios.py's ``_CountingHandler``: a handler wrapper that stamps ``events`` MODIFIED events."""

    counters: Any
    events: int
    first: float
    last: float
    done: asyncio.Event

    def on_added(self, obj: Any, initial: bool) -> None: ...
    def on_updated(self, old: Any, new: Any) -> None: ...
    def on_deleted(self, last: Any) -> None: ...


def pod_series(pipeline: Callable[[], tuple[Any, Any]], trainjob_list: bytes) -> Any:
    """A ``PodSeries`` wired as the service wires it: every TrainJob of ``trainjob_list`` (a LIST body) held
    in a cache the series reads (the TrainJob informer's, app/replica/pods.py ``TrainJobCaches``), each told
    to the TrainJob handler chain the service builds (``PodJobHandler`` around TrainerState's)."""
    from app.metrics.pods import PodJobHandler, PodSeries
    from app.trainer.informer_projectors import TRAINJOB_PROJECTOR

    state, metric_state = pipeline()
    cache: dict[tuple[str, str], Any] = {}
    series = PodSeries(
        lambda namespace, name: cache.get((namespace, name)), on_change=metric_state.extra_changed
    )
    jobs = PodJobHandler(state.job_handler, series)
    for item in orjson.loads(trainjob_list)["items"]:
        job = TRAINJOB_PROJECTOR.from_json(item)
        if job is not None:
            cache[(job.namespace, job.name)] = job  # the informer stores before it tells its handler
            jobs.on_added(job, True)
    return series


async def informer_rate(
    kubeconfig: str,
    events: int,
    series: Any,
    counting: Callable[[Any, int], Counting],
) -> float:
    """MODIFIED pod events/s through the service's pods informer into ``series``."""
    from app.kube.client import KubeClient
    from app.kube.informer import Informer
    from app.metrics.pods import PodSeriesHandler
    from app.trainer import rules
    from app.trainer.pods import PODS, PodProjector

    client = await KubeClient.connect(kubeconfig)
    counted = counting(PodSeriesHandler(series), events)
    informer = Informer(client, PODS, None, PodProjector(), counted, label_selector=rules.POD_SELECTOR)
    counted.counters = informer.counters
    gc.collect()
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(counted.done.wait(), 120)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
    if not series.pods:
        raise RuntimeError("the pod series holds no pod after the pods watch")
    return counted.events / (counted.last - counted.first)


async def baseline_rate(kubeconfig: str, events: int, series: Any) -> float:
    """kubernetes-asyncio's ``Watch`` over ``CoreV1Api.list_pod_for_all_namespaces`` (what its users get: each
    event's pod deserialized into a ``V1Pod``, its dict in ``raw_object``) → ``PodProjector.from_json`` → dict
    cache → the same ``PodSeriesHandler``. Its LIST is read raw (not measured)."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config

    from app.metrics.pods import PodSeriesHandler
    from app.trainer import rules
    from app.trainer.pods import PodProjector

    projector = PodProjector()
    handler = PodSeriesHandler(series)
    api_client = await k8s_config.new_client_from_config(config_file=kubeconfig)
    api = k8s.CoreV1Api(api_client)
    # _preload_content=False: the aiohttp response, not the V1PodList its type says
    resp: Any = await api.list_pod_for_all_namespaces(
        label_selector=rules.POD_SELECTOR, _preload_content=False
    )
    listing = orjson.loads(await resp.read())
    try:
        return await timed_watch(
            api.list_pod_for_all_namespaces,
            (),
            listing,
            projector,
            handler,
            events=events,
            unchanged=projector.unchanged,
            label_selector=rules.POD_SELECTOR,
        )
    finally:
        await api_client.close()
