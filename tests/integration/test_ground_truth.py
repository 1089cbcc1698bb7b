"""The service's Trainer metrics equal the workload generator's ground truth, exactly.

One replica (leader election on) watches a simulated cluster while ``WorkloadGenerator`` drives a few
thousand TrainJob lifecycles through it (suspend, admit, run, preempt, finish with every failure reason,
duplicate terminal writes, finalizers, deletion), with ``time_warp`` so that lifetimes spread over the
minute-to-days buckets. ``app/sim/truth.py`` derives what the metrics should say from the objects written,
independently of ``app/trainer``. The comparison window starts once the service has synced (jobs that
existed before are the initial list: never counted created) and ends once every informer cache equals the
store; over it, every counter and histogram count/sum, by its labels, must equal the truth's delta, and
the ``kubeflow_trainer_trainjobs`` gauge must equal the truth's current table.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from app.metrics.trainer_metrics import ACCELERATOR_BUCKETS, LIFETIME_BUCKETS, NODES_BUCKETS
from app.sim.cluster import SimulatedCluster
from app.sim.generator import WorkloadGenerator
from tests.integration.harness import (
    ACCELERATORS,
    CREATED,
    FINISHED,
    JOBS,
    LIFETIME,
    NODES,
    Samples,
    by_labels,
    replica,
    wait_caught_up,
    wait_leading,
)

log = logging.getLogger(__name__)

LIFECYCLES = 3000
PREEXISTING = 300
EXTRA_STEPS = 1500  # random actions over everything alive, including the pre-existing jobs
SEED = 20_240_611
TIME_WARP = 20_000.0  # 10 ms of wall time -> 200 s of lifetime; 1 s -> 5.5 h


def _nonzero(d: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    return {k: v for k, v in d.items() if v}


def _delta(after: Samples, before: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    a, b = by_labels(after, name, *keys), by_labels(before, name, *keys)
    return _nonzero({k: v - b.get(k, 0.0) for k, v in a.items()})


def _histogram_truth(
    observations: Iterable[tuple[tuple[str, ...], float]], buckets: tuple[float, ...]
) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float], dict[tuple[str, ...], float]]:
    """(count, sum, cumulative bucket counts keyed by labels + (le,)) of the given observations."""
    counts: Counter[tuple[str, ...]] = Counter()
    sums: dict[tuple[str, ...], float] = {}
    cumulative: Counter[tuple[str, ...]] = Counter()
    for labels, value in observations:
        counts[labels] += 1
        sums[labels] = sums.get(labels, 0.0) + value
        first = bisect.bisect_left(buckets, value)  # le is inclusive: value <= bound
        for bound in buckets[first:]:
            cumulative[(*labels, _le(bound))] += 1
        cumulative[(*labels, "+Inf")] += 1
    return dict(counts), sums, dict(cumulative)


def _le(bound: float) -> str:
    return str(float(bound))


@pytest.mark.slow
async def test_metrics_equal_generator_ground_truth(tmp_path: Path) -> None:
    # A history window above the run's write count: the informer never needs a relist here.
    async with SimulatedCluster(history_window=500_000) as sim:
        gen = WorkloadGenerator(sim.store, seed=SEED, namespaces=4, max_jobs=400, time_warp=TIME_WARP)
        gen.populate(PREEXISTING)  # existed before the service: its initial list
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        async with replica(
            kubeconfig, "truth", watch_timeout_min_seconds=300, watch_timeout_max_seconds=600
        ) as r:
            await wait_leading(r)
            await wait_caught_up(r, sim.store)
            before_samples = await r.samples()
            before = gen.snapshot()
            assert not _nonzero(by_labels(before_samples, CREATED, "namespace"))
            assert not _nonzero(by_labels(before_samples, FINISHED, "result"))

            started = time.monotonic()
            actions = await gen.run_lifecycles(LIFECYCLES, concurrency=16)
            for i in range(EXTRA_STEPS):
                gen.step()
                if i % 4 == 0:
                    await asyncio.sleep(0)
            written = time.monotonic() - started
            await wait_caught_up(r, sim.store, timeout=60)
            caught_up = time.monotonic() - started
            after = gen.snapshot()
            s = await r.samples()
            log.info(
                "ground truth: %d lifecycles + %d steps = %d actions, store rv %d -> %d, %d jobs live; "
                "writes done in %.1fs, service caught up at %.1fs",
                LIFECYCLES,
                EXTRA_STEPS,
                actions + EXTRA_STEPS,
                before.resource_version,
                after.resource_version,
                sum(after.jobs.values()),
                written,
                caught_up,
            )

            # Counters, by their labels.
            created = after.created_since(before)
            finished = after.finished_since(before)
            assert sum(created.values()) >= LIFECYCLES
            assert _delta(s, before_samples, CREATED, "namespace", "runtime_ref") == created
            assert _delta(s, before_samples, FINISHED, "result", "reason", "runtime_ref") == finished
            # The run exercised every result and reason bucket the generator can produce.
            assert {reason for _, reason, _ in finished} >= {
                "none",
                "FailedJobs",
                "DeadlineExceeded",
                "ReachedMaxRestarts",
                "FailJobSetFailurePolicyAction",
                "TrainingRuntimeNotSupported",
                "other",
            }

            # The gauge: current TrainJobs by (namespace, runtime_ref, state), from the cache.
            assert _nonzero(by_labels(s, JOBS, "namespace", "runtime_ref", "state")) == dict(after.jobs)
            terminal_live = sum(
                v for (_, _, state), v in after.jobs.items() if state in ("succeeded", "failed")
            )
            snapshot = (await r.http.get("/debug/snapshot")).json()
            assert snapshot["terminal_entries"] == terminal_live
            assert snapshot["trainjobs"] == sum(after.jobs.values())

            # Requested nodes / accelerators histograms: one observation per created job.
            requests = after.requests_since(before)
            count, total_, buckets = _histogram_truth(
                [((q.runtime_ref,), q.nodes) for q in requests], NODES_BUCKETS
            )
            assert _delta(s, before_samples, NODES + "_count", "runtime_ref") == count
            assert _delta(s, before_samples, NODES + "_sum", "runtime_ref") == _nonzero(total_)
            assert _delta(s, before_samples, NODES + "_bucket", "runtime_ref", "le") == buckets
            count, total_, buckets = _histogram_truth(
                [((q.accelerator_class, q.runtime_ref), q.accelerators) for q in requests],
                ACCELERATOR_BUCKETS,
            )
            assert (
                _delta(s, before_samples, ACCELERATORS + "_count", "accelerator_class", "runtime_ref")
                == count
            )
            assert _delta(
                s, before_samples, ACCELERATORS + "_sum", "accelerator_class", "runtime_ref"
            ) == _nonzero(total_)
            assert (
                _delta(s, before_samples, ACCELERATORS + "_bucket", "accelerator_class", "runtime_ref", "le")
                == buckets
            )
            assert sum(q.accelerators for q in requests) > 0  # some GPU jobs among them

            # Lifetimes: one observation per finished job (both timestamps present for generated jobs).
            finished_jobs = after.terminal_since(before)
            assert all(f.lifetime_seconds is not None for f in finished_jobs)
            count, total_, buckets = _histogram_truth(
                [((f.result, f.runtime_ref), float(f.lifetime_seconds or 0.0)) for f in finished_jobs],
                LIFETIME_BUCKETS,
            )
            assert _delta(s, before_samples, LIFETIME + "_count", "result", "runtime_ref") == count
            got_sum = _delta(s, before_samples, LIFETIME + "_sum", "result", "runtime_ref")
            assert got_sum.keys() == _nonzero(total_).keys()
            for key, value in got_sum.items():
                assert value == pytest.approx(total_[key], rel=1e-9), key
            assert _delta(s, before_samples, LIFETIME + "_bucket", "result", "runtime_ref", "le") == buckets
            # time_warp spread the lifetimes from the minute buckets to the day buckets.
            assert (
                len({bisect.bisect_left(LIFETIME_BUCKETS, f.lifetime_seconds or 0) for f in finished_jobs})
                >= 6
            )


def test_bucket_helpers_match_exposition() -> None:
    """The helper's ``le`` labels are the exposition's, so a bucket comparison cannot be vacuous."""
    _, _, buckets = _histogram_truth([(("x",), 1.0), (("x",), 3.0)], NODES_BUCKETS)
    assert buckets[("x", "1.0")] == 1 and buckets[("x", "2.0")] == 1 and buckets[("x", "4.0")] == 2
    assert buckets[("x", "+Inf")] == 2 and ("x", "1024.0") in buckets
    _, _, buckets = _histogram_truth([(("x",), 0.0)], ACCELERATOR_BUCKETS)
    assert buckets[("x", "0.0")] == 1
