"""The generator's trainer reports (status.trainerStatus), and the truth of time to running and admission
wait."""

from __future__ import annotations

import copy
from typing import Any

from kubesim.apiserver.storage.table import WatchEvent
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.truth_rules import parse_time, resumed_condition


class Clock:
    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        self.now += 0.25  # every reading a quarter second later: runs and waits take time
        return self.now


def test_running_trainers_report_progress_loss_and_an_eta() -> None:
    store = trainer_store()
    reports: dict[str, list[dict[str, Any]]] = {}

    def listen(event: WatchEvent) -> None:
        obj = event.entry.obj
        trainer = (obj.get("status") or {}).get("trainerStatus")
        if event.resource == TRAINJOBS and trainer and gen.truth.classify(obj)[0] == "running":
            reports.setdefault(obj["metadata"]["uid"], []).append(copy.deepcopy(trainer))

    store.subscribe(listen)
    gen = WorkloadGenerator(store, seed=3, max_jobs=40, clock=Clock())
    gen.populate(30)
    for _ in range(600):
        gen.step()
    assert len(reports) >= 5
    ticked = [r for r in reports.values() if len(r) >= 3]
    assert ticked, "no trainer reported three times"
    for series in ticked:
        progress = [r["progressPercentage"] for r in series]
        loss = [float(next(m["value"] for m in r["metrics"] if m["name"] == "loss")) for r in series]
        assert progress == sorted(progress) and progress[0] >= 0 and progress[-1] <= 99
        assert loss == sorted(loss, reverse=True)
        assert all("estimatedRemainingSeconds" in r for r in series if r["progressPercentage"] > 0)
        # what the per-TrainJob series must skip and count: a checkpoint path is text
        assert any(
            m["name"] == "checkpoint" and m["value"].startswith("s3://") for m in series[-1]["metrics"]
        )


def test_truth_of_time_to_running_and_admission_wait() -> None:
    store = trainer_store()
    # The wall clock: the store stamps creationTimestamp with it, the generator its conditions.
    gen = WorkloadGenerator(store, seed=11, max_jobs=60, suspend_ratio=0.5)
    gen.lifecycles(80, concurrency=8, delete=False)
    snap = gen.snapshot()
    assert len(snap.started) >= 50 and len(snap.admitted) >= 20
    # An admission is recorded only before the job ran: its resourceVersion precedes the start's.
    for uid, admitted in snap.admitted.items():
        started = snap.started.get(uid)
        assert started is None or admitted.resource_version < started.resource_version
        assert admitted.wait_seconds >= 0
    for started in snap.started.values():
        assert started.startup_seconds >= 0
    # The admission wait is the Resumed condition's lastTransitionTime minus creation, to the second.
    by_name = {o["metadata"]["name"]: o for o in store.list(TRAINJOBS, None)[0]}
    some = next(a for a in snap.admitted.values() if a.name in by_name)
    obj = by_name[some.name]
    cond = resumed_condition(obj)
    assert cond is not None
    created = parse_time(obj["metadata"]["creationTimestamp"])
    resumed = parse_time(cond["lastTransitionTime"])
    assert created is not None and resumed is not None
    # (a preempted job's condition was rewritten later: the wait recorded is its first admission's)
    assert some.wait_seconds <= (resumed - created).total_seconds()
