"""The service's Trainer metrics equal the workload generator's ground truth, exactly.

One replica (leader election on) watches a simulated cluster while ``WorkloadGenerator`` drives TrainJobs
through it: first on purpose through every shape a real cluster's Trainer controller (v2.3.0), JobSet
(v0.12.0) and Kueue write (tests/support/trainer_scenarios.py), then a few thousand random lifecycles and
steps (suspend, admit, run, preempt, restart, finish with every failure reason, clean-up writes,
finalizers, deletion), with ``time_warp`` so that lifetimes spread over the minute-to-days buckets and
deadlines fall due within the run.

Shapes covered, each checked by a census of the store's watch events (tests/support/trainer_shapes.py),
which also fails the test on any write that breaks a controller rule:

- initializers ready while they download, then done while the trainer's pods wait for capacity (pending,
  not running: only the training step's ready Jobs make a job running);
- DeadlineExceeded exactly at creation + activeDeadlineSeconds, at the last resume + it, and after a
  preemption and a second admission (suspended jobs are not timed); never a shorter lifetime;
- suspended JobSets (Suspended=True, child Jobs counted suspended), preemption after running, and a JobSet
  restart taking a running job back to pending;
- JobSet failures (FailedJobs, ReachedMaxRestarts, FailJobSetFailurePolicyAction) only with a failed child
  Job, reasons no JobSet v0.12 writes copied by name or as "other";
- managedBy MultiKueue: status copied whole from the worker, or none at all;
- a runtime kind the controller has not registered: no status at all (v2.3.0 never stores
  TrainingRuntimeNotSupported);
- MPI: the ``node`` workers ready long before the launcher (pending until the launcher is ready);
- a runtime's replicated jobs edited, then the runtime deleted, under running jobs (they run on, from the
  controller's runtime snapshot);
- every order of writes that admits a queued job: the controller's Resumed at once, Resumed only after the
  controller came back (down during the admission), and no Suspended condition at all (Kueue ahead of the
  controller's first reconcile);
- node counts as the controller runs them (MPI runLauncherAsNode with numNodes 1: 2 nodes; a runtime with
  no trainer-labelled job ignores numNodes) and device resources only (Intel's millicores, memory.max,
  tiles and *_monitoring never, nvidia.com/gpu.shared yes), beside CPU-only resourcesPerNode on GPU
  runtimes (merged, the GPUs stay), MIG slices, TPUs, Gaudi, Neuron and two accelerator classes on one
  job, runtimes without an mlPolicy (their template's parallelism is the node count).

``sim/kubesim/trainer/truth.py`` derives what the metrics should say from the objects written,
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
from typing import Any

import pytest

from app.metrics.counted import ACCELERATOR_BUCKETS, LIFETIME_BUCKETS, NODES_BUCKETS, STARTUP_BUCKETS
from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from tests.support.harness import (
    ACCELERATORS,
    CREATED,
    FINISHED,
    JOBS,
    LIFETIME,
    NODES,
    wait_caught_up,
    wait_leading,
)
from tests.support.replica_inprocess import STEADY_TIMINGS, replica
from tests.support.samples import Samples, by_labels
from tests.support.trainer_scenarios import hold_initializers_downloading, play_every_shape
from tests.support.trainer_shapes import SHAPES, ShapeCensus

log = logging.getLogger(__name__)

LIFECYCLES = 3000
PREEXISTING = 300
EXTRA_STEPS = 1500  # random actions over everything alive, including the pre-existing jobs
SEED = 20_240_611
TIME_WARP = 20_000.0  # 10 ms of wall time -> 200 s of lifetime; 1 s -> 5.5 h
STARTUP = "kubeflow_trainer_trainjob_startup_seconds"
ADMISSION = "kubeflow_trainer_trainjob_admission_wait_seconds"


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


@pytest.fixture
def sim_options() -> dict[str, Any]:
    # A history window above the run's write count: the informer never needs a relist here.
    return {"history_window": 500_000}


@pytest.fixture
def workload_options() -> dict[str, Any]:
    # PREEXISTING jobs existed before the service: its initial list (tests/conftest.py: workload).
    return {"seed": SEED, "namespaces": 4, "max_jobs": 400, "time_warp": TIME_WARP, "populate": PREEXISTING}


@pytest.mark.slow
async def test_metrics_equal_generator_ground_truth(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path
) -> None:
    gen = workload
    # One term for the whole run (STEADY_TIMINGS): the deltas below are one leader's counts, and the write
    # storm on this one loop (simulated cluster and replica together) has lagged a renew round past
    # FAST_TIMINGS' 1 s deadline (seen once in CI), ending the term mid-run.
    async with replica(
        kubeconfig, "truth", watch_timeout_min_seconds=300, watch_timeout_max_seconds=600, **STEADY_TIMINGS
    ) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        before_samples = await r.samples()
        before = gen.snapshot()
        assert not _nonzero(by_labels(before_samples, CREATED, "namespace"))
        assert not _nonzero(by_labels(before_samples, FINISHED, "result"))
        census = ShapeCensus()
        sim.store.subscribe(census.observe)

        started = time.monotonic()
        await play_every_shape(gen, census, settle=lambda: wait_caught_up(r, sim.store, timeout=60))
        actions = await gen.run_lifecycles(LIFECYCLES, concurrency=16)
        for i in range(EXTRA_STEPS):
            gen.step()
            if i % 4 == 0:
                await asyncio.sleep(0)  # yield to the loop (the server streams the events): no waiting
        downloading = hold_initializers_downloading(gen)  # last: nothing moves it on before the end
        written = time.monotonic() - started
        await wait_caught_up(r, sim.store, timeout=60)
        caught_up = time.monotonic() - started
        after = gen.snapshot()
        # A new counter/histogram series is served as zeros on its first render (born at zero, with
        # zero_hold_seconds 0: for one render), so the first read releases them and the second counts.
        await r.samples()
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

        # Every shape a real cluster writes was written, and nothing a real cluster would not write.
        census.finish()
        log.info("shapes: %s", {shape: census.shapes[shape] for shape in SHAPES})
        assert census.violations == []
        assert [shape for shape in SHAPES if not census.shapes[shape]] == []

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
            "PodFailurePolicyRuleMatched",  # well-formed reasons upstream does not list: by name
            "InPlaceRestartBudgetExhausted",
            "other",  # not CamelCase, or longer than 64 characters
        }
        # kubeflow/trainer v2.3.0 never stores it (kubesim/trainer/controller.py): such a job stays silent.
        assert "TrainingRuntimeNotSupported" not in {reason for _, reason, _ in finished}

        # The gauge: current TrainJobs by (namespace, runtime_ref, state), from the cache.
        assert _nonzero(by_labels(s, JOBS, "namespace", "runtime_ref", "state")) == dict(after.jobs)
        # ... with jobs whose child Jobs are active but not ready among them (pending, not running).
        waiting = [
            o
            for o in sim.store.list(TRAINJOBS, None)[0]
            if any(
                (j.get("active") or 0) > 0 and not j.get("ready")
                for j in (o.get("status") or {}).get("jobsStatus") or []
            )
            and not any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in (o.get("status") or {}).get("conditions") or []
            )
        ]
        assert waiting, "no job waiting for capacity at the end of the run"
        # ... and one whose initializers are ready (downloading): pending too, as the truth's table says.
        assert after.jobs[(downloading.namespace, downloading.runtime.ref_label, "pending")] >= 1
        terminal_live = sum(v for (_, _, state), v in after.jobs.items() if state in ("succeeded", "failed"))
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
        # One observation per accelerator class a job requests.
        count, total_, buckets = _histogram_truth(
            [((cls, q.runtime_ref), n) for q in requests for cls, n in q.accelerators],
            ACCELERATOR_BUCKETS,
        )
        assert _delta(s, before_samples, ACCELERATORS + "_count", "accelerator_class", "runtime_ref") == count
        assert _delta(
            s, before_samples, ACCELERATORS + "_sum", "accelerator_class", "runtime_ref"
        ) == _nonzero(total_)
        assert (
            _delta(s, before_samples, ACCELERATORS + "_bucket", "accelerator_class", "runtime_ref", "le")
            == buckets
        )
        assert sum(n for q in requests for _, n in q.accelerators) > 0  # some GPU jobs among them
        classes = {cls for q in requests for cls, _ in q.accelerators}
        assert {
            "nvidia.com/mig-1g.10gb",
            "google.com/tpu",
            "habana.ai/gaudi",
            "aws.amazon.com/neuroncore",
        } <= (classes)
        assert any(len(q.accelerators) > 1 for q in requests)  # several classes on one job
        # a runtime without mlPolicy: its template's parallelism (4) when the job sets no numNodes
        assert any(q.runtime_ref.endswith("//sim-plain-tpu") and q.nodes == 4 for q in requests)
        # MPI with runLauncherAsNode counts the launcher; a runtime without a trainer label ignores numNodes
        # (the scenarios ask for 1 and 8 nodes)
        assert any(q.runtime_ref.endswith("//deepspeed-distributed") and q.nodes == 2 for q in requests)
        assert all(q.nodes == 2 for q in requests if q.runtime_ref.endswith("//sim-unlabelled-node"))
        # devices only: the scenarios' Intel shares and monitoring handles count nothing, gpu.shared does
        assert {"nvidia.com/gpu.shared", "gpu.intel.com/i915", "gpu.intel.com/xe"} <= classes
        assert not {
            c for c in classes if c.startswith("gpu.intel.com/") and c.split("/")[1] not in ("i915", "xe")
        }

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
            len({bisect.bisect_left(LIFETIME_BUCKETS, f.lifetime_seconds or 0) for f in finished_jobs}) >= 6
        )

        # Admission wait: once per job created suspended, when it first leaves suspended before it ever ran.
        # From the Resumed condition's lastTransitionTime, exact; for a job Kueue admitted before the
        # controller wrote any Suspended condition (none is written then), from the clock when it was seen,
        # so the service's value lies between the truth's (the writer's clock) and that plus the watch
        # latency.
        admitted = after.admitted_since(before)
        assert len(admitted) >= LIFECYCLES // 10  # the generator creates ~20% of its jobs suspended
        assert any(a.by_clock for a in admitted) and any(not a.by_clock for a in admitted)
        count, total_, buckets = _histogram_truth(
            [((a.runtime_ref,), a.wait_seconds) for a in admitted], STARTUP_BUCKETS
        )
        _, late_total, late_buckets = _histogram_truth(
            [((a.runtime_ref,), a.wait_seconds + (caught_up if a.by_clock else 0.0)) for a in admitted],
            STARTUP_BUCKETS,
        )
        assert _delta(s, before_samples, ADMISSION + "_count", "runtime_ref") == count
        got_sum = _delta(s, before_samples, ADMISSION + "_sum", "runtime_ref")
        for key in count:
            assert total_[key] - 1e-6 <= got_sum.get(key, 0.0) <= late_total[key] + 1e-6, key
        got_buckets = _delta(s, before_samples, ADMISSION + "_bucket", "runtime_ref", "le")
        for key, value in buckets.items():
            assert late_buckets.get(key, 0) <= got_buckets.get(key, 0) <= value, key
        assert set(got_buckets) <= set(buckets)
        # Exact where no clock is involved: every runtime whose admissions were all timed by a condition.
        exact = {a.runtime_ref for a in admitted} - {a.runtime_ref for a in admitted if a.by_clock}
        for key in [k for k in count if k[0] in exact]:
            assert got_sum.get(key, 0.0) == pytest.approx(total_[key], abs=1e-9), key

        # Time to running: once per job first seen running in the window. Not the jobs running in the
        # initial list, nor a job running again after a preemption (the truth has them before the window,
        # or once). The service reads its own clock when it sees the job running, the truth the generator's
        # when it wrote it (no object records when pods became ready): every observation is later by the
        # watch latency, at most the time the service took to catch up. So the counts are exact, and each
        # bucket lies between the truth's and the truth's with every value that much later.
        started_jobs = after.started_since(before)
        assert len(started_jobs) >= LIFECYCLES // 2
        count, total_, buckets = _histogram_truth(
            [((j.runtime_ref,), j.startup_seconds) for j in started_jobs], STARTUP_BUCKETS
        )
        lag = caught_up
        _, late_total, late_buckets = _histogram_truth(
            [((j.runtime_ref,), j.startup_seconds + lag) for j in started_jobs], STARTUP_BUCKETS
        )
        assert _delta(s, before_samples, STARTUP + "_count", "runtime_ref") == count
        got_sum = _delta(s, before_samples, STARTUP + "_sum", "runtime_ref")
        for key in count:
            assert total_[key] - 1e-6 <= got_sum.get(key, 0.0) <= late_total[key] + 1e-6, key
        got_buckets = _delta(s, before_samples, STARTUP + "_bucket", "runtime_ref", "le")
        for key, value in buckets.items():
            assert late_buckets.get(key, 0) <= got_buckets.get(key, 0) <= value, key
        assert set(got_buckets) <= set(buckets)


def test_bucket_helpers_match_exposition() -> None:
    """The helper's ``le`` labels are the exposition's, so a bucket comparison cannot be vacuous."""
    _, _, buckets = _histogram_truth([(("x",), 1.0), (("x",), 3.0)], NODES_BUCKETS)
    assert buckets[("x", "1.0")] == 1 and buckets[("x", "2.0")] == 1 and buckets[("x", "4.0")] == 2
    assert buckets[("x", "+Inf")] == 2 and ("x", "1024.0") in buckets
    _, _, buckets = _histogram_truth([(("x",), 0.0)], ACCELERATOR_BUCKETS)
    assert buckets[("x", "0.0")] == 1
