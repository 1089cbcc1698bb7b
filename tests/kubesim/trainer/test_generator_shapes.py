"""The workload generator produces every shape a real cluster's Trainer controller, JobSet and Kueue write,
and none that they do not (tests/support/trainer_shapes.py reads them from the store's watch events).

The generator's clock is a counter here (each reading 0.2 s later): deadlines, the one time-driven event,
fall due at the same steps on every run, so the census is the same on any machine."""

from __future__ import annotations

import time
from collections import Counter

from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.truth import recount_jobs
from tests.support.trainer_scenarios import play_every_shape
from tests.support.trainer_shapes import DEADLINE_AFTER_READMISSION, SCENARIO_ONLY, SHAPES, ShapeCensus


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        self.now += 0.2
        return self.now


def test_every_shape_and_no_rule_broken() -> None:
    store = trainer_store()
    census = ShapeCensus()
    store.subscribe(census.observe)
    gen = WorkloadGenerator(
        store, seed=22, max_jobs=300, suspend_ratio=0.35, time_warp=40.0, clock=Clock(), namespaces=3
    )
    gen.populate(150)
    for _ in range(6000):
        gen.step()
    gen.lifecycles(400, concurrency=12)
    census.finish()
    assert census.violations == []
    # All but the rarest (a deadline, a preemption and a second admission, all before the job ends) and the
    # scenarios' own, which the scenarios reach on purpose (below).
    missing = [shape for shape in SHAPES if not census.shapes[shape] and shape not in SCENARIO_ONLY]
    assert missing in ([], [DEADLINE_AFTER_READMISSION])
    assert dict(gen.truth.jobs) == recount_jobs(
        store.list(TRAINJOBS, None)[0], gen.truth.runtimes, gen.truth.training
    )
    reasons = Counter({reason: n for (_, reason, _), n in gen.snapshot().finished.items()})
    assert "TrainingRuntimeNotSupported" not in reasons
    assert {"none", "FailedJobs", "DeadlineExceeded", "FailJobSetFailurePolicyAction"} <= set(reasons)


async def test_scenarios_reach_every_shape() -> None:
    """tests/support/trainer_scenarios.py, which the ground-truth test plays, reaches every shape alone."""
    store = trainer_store()
    census = ShapeCensus()
    store.subscribe(census.observe)
    gen = WorkloadGenerator(store, seed=5, time_warp=20_000.0)
    gen.load_runtimes()
    await play_every_shape(gen, census)
    census.finish()
    assert census.violations == []
    assert [shape for shape in SHAPES if not census.shapes[shape]] == []
    reasons = {reason for (_, reason, _) in gen.snapshot().finished}
    assert {
        "FailedJobs",
        "ReachedMaxRestarts",
        "FailJobSetFailurePolicyAction",
        "DeadlineExceeded",
    } <= reasons
