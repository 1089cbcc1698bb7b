"""``python -m bench.per_job_render [--jobs N]``: the cold-scrape cost of the per-TrainJob series.

A scrape of an unchanged state is served from the cached body (P4). After a change, the next scrape re-joins
the body on the event loop and recompresses it in a worker thread (app/metrics/exposition.py); with every
TrainJob exported both grow with the jobs. This builds ``--jobs`` TrainJobs in process (one in eight running
with a trainerStatus of progress, ETA and three numeric metrics), then five times changes one job's progress,
renders the text body and compresses it with zlib level 1, as the exposition does, and prints the times.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from typing import Any

from app.metrics.per_job import PerJobHandler, PerJobSeries
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.informer_projectors import TrainJobProjector
from app.trainer.projection_types import TrainJobProjection

PROJECTOR = TrainJobProjector(trainer_status=True)


class _Null:
    def on_added(self, obj: Any, initial: bool) -> None: ...
    def on_updated(self, old: Any, new: Any) -> None: ...
    def on_deleted(self, last: Any) -> None: ...


def _job(i: int, *, rv: int, progress: int) -> TrainJobProjection:
    running = i % 8 == 0
    status: dict[str, Any] = {"jobsStatus": [{"name": "node", "active": 1, "ready": int(running)}]}
    if running:
        status["trainerStatus"] = {
            "progressPercentage": progress,
            "estimatedRemainingSeconds": 600,
            "lastUpdatedTime": "2026-12-01T01:00:00Z",
            "metrics": [
                {"name": "loss", "value": "0.42"},
                {"name": "eval_accuracy", "value": "0.8"},
                {"name": "learning_rate", "value": "3e-05"},
            ],
        }
    obj = {
        "metadata": {
            "name": f"llama3-2-1b-finetune-{i:06d}",
            "namespace": f"team-{i % 100:02d}",
            "uid": f"uid-{i}",
            "resourceVersion": str(rv),
            "creationTimestamp": "2026-12-01T00:00:00Z",
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
        "status": status,
    }
    projection = PROJECTOR.from_json(obj)
    assert projection is not None
    return projection


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.per_job_render", description=__doc__)
    p.add_argument("--jobs", type=int, default=100_000)
    args = p.parse_args(argv)
    series = PerJobSeries(max_jobs=args.jobs)
    state = TrainerMetricState(extra_families=series.families)
    series._on_change = state.extra_changed
    handler = PerJobHandler(_Null(), series)
    jobs = [_job(i, rv=i + 1, progress=i % 100) for i in range(args.jobs)]
    for job in jobs:
        handler.on_added(job, True)
    body = state.render_text()
    size = len(body) / 2**20
    print(f"{args.jobs} TrainJobs, {series.series_count} per-TrainJob series, text body {size:.1f} MB")
    for k in range(5):
        new = _job(0, rv=args.jobs + 1 + k, progress=50 + k)
        t0 = time.perf_counter()
        handler.on_updated(jobs[0], new)
        jobs[0] = new
        body = state.render_text()
        t1 = time.perf_counter()
        compressor = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        gz = compressor.compress(body) + compressor.flush(zlib.Z_SYNC_FLUSH)
        t2 = time.perf_counter()
        print(
            f"change {k + 1}: render (event loop) {(t1 - t0) * 1000:.1f} ms, gzip level 1 (worker thread) "
            f"{(t2 - t1) * 1000:.1f} ms, {len(gz) / 2**20:.1f} MB gzipped"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
