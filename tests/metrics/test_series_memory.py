"""What the metric series keep, bounded by their label caps: sparse blocks are merged (a family's blocks
follow its live series, not the ones it once had), an exemplar keeps its TrainJob's key, uid and time,
not the event, and the pod series' join keeps nothing per TrainJob."""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable

from app.metrics.counted import LIFETIME
from app.metrics.exemplars import ExemplarRef
from app.metrics.family_kinds import HistogramFamily
from app.metrics.pods import PodJobHandler, PodSeries
from app.metrics.trainer_metrics import TrainerMetricState
from tests.support.pod_shapes import projected_trainjob
from tests.support.trainjob_cache import NullHandler, TrainJobCache

from .helpers import REF, reference_text
from .test_exemplars import created, finished
from .test_pod_series import pod


def test_sparse_gauge_blocks_are_merged_and_the_text_stays_what_prometheus_client_prints() -> None:
    state = TrainerMetricState()
    keys = [(f"ns-{i:04d}", REF, "running") for i in range(1280)]
    for key in keys:
        state.on_jobs_gauge(key, 1)
    assert state.render_text() == reference_text(state)
    family = state.trainjobs
    # Series end in any order: keep one in ten, scattered over every block.
    for i, key in enumerate(keys):
        if i % 10:
            state.on_jobs_gauge(key, 0)
    assert state.render_text() == reference_text(state)
    live = len(family)
    assert live == 128
    assert len(family._blocks) <= 2 * live // family._block_series + 1  # 5, not the 20 blocks it had
    # Every block holds exactly the series it says it does, in the order of the state.
    listed = [key for block in family._blocks for key in block.chunks[0]]
    assert listed == list(family.values)
    assert all(family._block_of[key] is block for block in family._blocks for key in block.chunks[0])
    # And it keeps growing and shrinking correctly afterwards.
    for key in keys[1::10]:
        state.on_jobs_gauge(key, 2)
    for key in keys[::20]:
        state.on_jobs_gauge(key, 0)
    assert state.render_text() == reference_text(state)


def test_an_exemplar_keeps_the_jobs_key_uid_and_time_not_the_event() -> None:
    state = TrainerMetricState(exemplars=True)
    events = [created(1), finished(1, 90.0)]
    before = [sys.getrefcount(e) for e in events]
    for event in events:
        state.on_countable(event)
    del event
    state.render_openmetrics()
    assert [sys.getrefcount(e) for e in events] == before  # nothing of the metric state holds them
    lifetime = state._counted[LIFETIME]
    assert isinstance(lifetime, HistogramFamily)
    sources = [slot[0] for slots in lifetime.exemplars.values() for slot in slots if slot is not None]
    assert sources and all(type(s) is ExemplarRef for s in sources)
    assert (sources[0].key, sources[0].uid, sources[0].at) == ("team-a/job-1", "uid-1", events[1].at)


def test_the_pod_series_keep_nothing_per_trainjob() -> None:
    """The join reads the TrainJobs in the informer's cache: a cached TrainJob, with or without pods, costs
    it no memory of its own (P3, docs/benchmarks.md: the copies of each TrainJob's name, uid, runtime_ref and
    creation time that this join and the pod-failure edges, now not told of TrainJobs, kept cost ~500 B)."""
    cache = TrainJobCache()
    series = PodSeries(cache.get)
    cache.handler = PodJobHandler(NullHandler(), series)
    jobs = [projected_trainjob(f"job-{i}", ns=f"ns-{i % 10}") for i in range(2000)]
    series.pod_added(pod("job-0-node-0-0", job="job-0", ns="ns-0"))  # one job has a pod: it joins

    def add_jobs() -> None:
        for job in jobs:
            cache.on_added(job, True)

    kept = _kept_by(("app/metrics/pods.py", "app/trainer/pods.py"), add_jobs)
    assert kept < 8 * 1024  # nothing that grows with the TrainJobs (2,000 of them: ~1 MB before)
    assert series.info.values  # the job with a pod joined it


def test_the_join_keeps_nothing_per_pod_but_the_pod() -> None:
    """What a pod adds to its job's series is computed again when the pod or its job changes, not kept:
    per pod the join holds only its entry in the job's pods (the series keep their own labels)."""
    cache = TrainJobCache()
    series = PodSeries(cache.get)
    cache.handler = PodJobHandler(NullHandler(), series)
    cache.on_added(projected_trainjob("llama", ns="team-a"), True)
    pods = [pod(f"llama-node-0-{i}", phase="Succeeded", rv=str(i)) for i in range(2000)]

    def add_pods() -> None:
        for p in pods:
            series.pod_added(p)

    kept = _kept_by(("app/metrics/pods.py",), add_pods)
    assert kept / len(pods) < 40  # one dict entry a pod: 26 B here, 52 B with a share kept per pod
    assert series.restarts.values == {("team-a", "llama"): 0.0}
    for p in pods:
        series.pod_deleted(p)
    assert not series._by_job and not series.restarts.values  # nothing kept once the job has no pod


def _kept_by(files: tuple[str, ...], step: Callable[[], None]) -> int:
    """Bytes that ``step`` allocated and that are still held, counted where a frame of ``files`` allocated
    them (tracemalloc, 16 frames deep)."""
    tracemalloc.start(16)
    try:
        before = tracemalloc.take_snapshot()
        step()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(
        stat.size_diff
        for stat in after.compare_to(before, "traceback")
        if any(frame.filename.endswith(files) for frame in stat.traceback)
    )
