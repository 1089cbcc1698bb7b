"""The opt-in per-TrainJob series against the simulated cluster: two replicas watch it while the workload
generator drives TrainJobs (trainerStatus ticking on running jobs, jobs admitted through suspension); the
leader's per-TrainJob series equal what the stored objects say, read here from their JSON (not through
app/trainer), and the follower exports none of them. Then the caps: a namespace allow-list and a job cap."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.truth import Truth
from kubesim.trainer.truth_rules import parse_time, runtime_ref_of
from tests.support.harness import wait_caught_up
from tests.support.replica_inprocess import Replica, replica
from tests.support.samples import Samples
from tests.support.waiting import eventually

PREFIX = "kubeflow_trainer_trainjob_"
PER_JOB = (
    "info",
    "status_state",
    "created_timestamp_seconds",
    "status_progress_percent",
    "status_estimated_remaining_seconds",
    "status_trainer_metric",
    "status_trainer_updated_timestamp_seconds",
)
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@pytest.fixture
def workload_options() -> dict[str, Any]:
    return {"seed": 20_261_201, "namespaces": 3, "max_jobs": 60, "populate": 40}


def expected_series(store: Any, truth: Truth) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every per-TrainJob sample the stored TrainJobs call for, read from their JSON (the state by the
    truth's reading, which knows each runtime's training step)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def put(family: str, value: float, **labels: str) -> None:
        out[(PREFIX + family, tuple(sorted(labels.items())))] = value

    for obj in store.list(TRAINJOBS, None)[0]:
        meta = obj["metadata"]
        job = {"namespace": meta["namespace"], "trainjob": meta["name"]}
        put("info", 1.0, **job, runtime_ref=runtime_ref_of(obj)[0])
        put("status_state", 1.0, **job, state=truth.classify(obj)[0])
        created = parse_time(meta["creationTimestamp"])
        assert created is not None
        put("created_timestamp_seconds", created.timestamp(), **job)
        trainer = (obj.get("status") or {}).get("trainerStatus")
        if not trainer:
            continue
        if "progressPercentage" in trainer:
            put("status_progress_percent", float(trainer["progressPercentage"]), **job)
        if "estimatedRemainingSeconds" in trainer:
            put("status_estimated_remaining_seconds", float(trainer["estimatedRemainingSeconds"]), **job)
        updated = parse_time(trainer.get("lastUpdatedTime"))
        if updated is not None:
            put("status_trainer_updated_timestamp_seconds", updated.timestamp(), **job)
        for metric in trainer.get("metrics") or []:
            if _DECIMAL.fullmatch(metric["value"]):
                put("status_trainer_metric", float(metric["value"]), **job, metric=metric["name"])
    return out


def per_job(samples: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {key: v for key, v in samples.items() if key[0].removeprefix(PREFIX) in PER_JOB}


def checkpoints(store: Any) -> int:
    """trainerStatus metrics that are text (the generator's checkpoint paths): skipped and counted."""
    return sum(
        1
        for obj in store.list(TRAINJOBS, None)[0]
        for m in ((obj.get("status") or {}).get("trainerStatus") or {}).get("metrics") or []
        if not _DECIMAL.fullmatch(m["value"])
    )


def steps(gen: WorkloadGenerator, n: int) -> Iterator[None]:
    for _ in range(n):
        gen.step()
        yield None


async def test_leader_exports_per_trainjob_series_equal_to_the_store(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path
) -> None:
    async with (
        replica(kubeconfig, "pj-a", per_trainjob_series=True) as r1,
        replica(kubeconfig, "pj-b", per_trainjob_series=True) as r2,
    ):
        # Whichever wins the Lease: both started together.
        async def leader() -> Replica | None:
            for x in (r1, r2):
                if (await x.http.get("/debug/leadership")).json()["is_leader"]:
                    return x
            return None

        a = await eventually(leader, timeout=20, what="a leader")
        b = r2 if a is r1 else r1
        for i, _ in enumerate(steps(workload, 400)):
            if i % 10 == 0:
                await asyncio.sleep(0)  # let the server stream the events
        await wait_caught_up(a, sim.store)
        await wait_caught_up(b, sim.store)
        want = expected_series(sim.store, workload.truth)
        # The run covered what the families are for: running jobs with progress, an ETA and a loss.
        names = {name for name, _ in want}
        assert {PREFIX + f for f in PER_JOB} <= names, sorted({PREFIX + f for f in PER_JOB} - names)
        assert any(dict(labels).get("metric") == "loss" for _, labels in want)

        async def leader_equals_store() -> bool:
            return per_job(await a.samples()) == want

        await eventually(leader_equals_store, timeout=10, what="the leader's per-TrainJob series == store")
        follower = await b.samples()
        assert not per_job(follower) and not any(name.startswith("kubeflow_trainer_") for name, _ in follower)
        # Self-telemetry on both: every job exported, the text metric values skipped and counted.
        live = len(sim.store.list(TRAINJOBS, None)[0])
        for samples in (await a.samples(), follower):
            assert samples[("trainer_metrics_per_trainjob_jobs", (("status", "exported"),))] == live
            skipped = samples[
                ("trainer_metrics_per_trainjob_skipped_trainer_metrics", (("reason", "unparsable"),))
            ]
            assert skipped == checkpoints(sim.store) > 0


@pytest.mark.parametrize("workload_options", [{"seed": 5, "namespaces": 3, "populate": 60}])
async def test_allow_list_and_job_cap(
    sim: SimulatedCluster, workload: WorkloadGenerator, kubeconfig: Path
) -> None:
    allowed = workload.namespaces[0]
    async with replica(
        kubeconfig,
        "pj-cap",
        leader_election=False,
        per_trainjob_series=True,
        per_trainjob_namespaces=[allowed],
        per_trainjob_max_jobs=5,
    ) as r:
        await wait_caught_up(r, sim.store)
        in_allowed = sum(
            1 for o in sim.store.list(TRAINJOBS, None)[0] if o["metadata"]["namespace"] == allowed
        )
        assert in_allowed > 5

        async def capped() -> bool:
            s = await r.samples()
            info = [labels for name, labels in s if name == PREFIX + "info"]
            return (
                len(info) == 5
                and {dict(labels)["namespace"] for labels in info} == {allowed}
                and s[("trainer_metrics_per_trainjob_jobs", (("status", "over_cap"),))] == in_allowed - 5
                and s[("trainer_metrics_per_trainjob_max_jobs", ())] == 5
            )

        await eventually(capped, timeout=10, what="five jobs of the allowed namespace exported")
