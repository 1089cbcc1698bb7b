"""ClusterTrainingRuntimes are cluster-scoped, so a namespaced install (Roles only, no ClusterRole) cannot
read them. A replica that watches them without that access never syncs: never ready, never leading (its
TrainJobs are listed after the runtimes, so they wait too). With
``watch_cluster_runtimes`` off it does not watch them: it becomes ready, and a TrainJob of a
ClusterTrainingRuntime is counted at once with its own spec (its runtime would never arrive to be waited for).

The simulated API server has no RBAC; a LIST of clustertrainingruntimes that always fails stands for the
refusal (the informer retries any failed LIST the same way, whatever the status)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.harness import (
    CREATED,
    JOBS,
    NODES,
    RUNTIME_INFO,
    cluster_ref,
    running_status,
    trainjob_manifest,
    wait_leading,
    write_status,
)
from tests.support.replica_inprocess import replica
from tests.support.samples import scrape_counts, total
from tests.support.waiting import eventually

STARTUP = "kubeflow_trainer_trainjob_startup_seconds"
NAMESPACED: dict[str, Any] = {"leader_election": False, "namespaces": ["team1"]}


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"load_runtimes": True}  # the upstream ClusterTrainingRuntimes


def refuse_cluster_runtimes(sim: SimulatedCluster) -> None:
    sim.faults.fail_next(100_000, status=503, retry_after=None, resource=CLUSTER_TRAINING_RUNTIMES.plural)


async def test_cluster_runtimes_that_cannot_be_read_keep_the_replica_unready(
    sim: SimulatedCluster, kubeconfig: Path
) -> None:
    refuse_cluster_runtimes(sim)
    async with replica(kubeconfig, "a", **NAMESPACED) as r:

        async def only_cluster_runtimes_missing() -> bool:
            resp = await r.http.get("/readyz")
            reasons = resp.json()["reasons"]
            return resp.status_code == 503 and reasons == [
                "informer clustertrainingruntimes has not synced",
                "informer trainjobs/team1 waits for the runtime lists",
            ]

        # The namespaced runtimes sync; the cluster-scoped ones never do, the TrainJobs wait for them (listed
        # after the runtimes: test_trainjobs_are_listed_after_the_runtimes), so nothing is exported.
        await eventually(only_cluster_runtimes_missing, timeout=20, what="readyz naming them alone")
        assert not await r.exporting()
        assert sim.faults.counters["status_503"] >= 1


async def test_unwatched_cluster_runtimes_ready_and_counted_at_once(
    sim: SimulatedCluster, kubeconfig: Path
) -> None:
    refuse_cluster_runtimes(sim)
    async with replica(kubeconfig, "a", watch_cluster_runtimes=False, **NAMESPACED) as r:
        await wait_leading(r)
        assert await r.ready()
        assert [i.name for i in r.service.informers] == ["trainingruntimes/team1", "trainjobs/team1"]
        snapshot = (await r.http.get("/debug/snapshot")).json()
        assert {i["name"] for i in snapshot["informers"]} == {"trainingruntimes/team1", "trainjobs/team1"}

        sim.store.create(TRAINJOBS, "team1", trainjob_manifest("job-0", num_nodes=3, gpus_per_node=2))
        (jobs,) = [i for i in r.service.informers if i.resource == TRAINJOBS]

        async def seen() -> bool:
            return jobs.get("team1/job-0") is not None

        await eventually(seen, timeout=20, what="the TrainJob in the cache")
        # Counted in the same handler call that cached it: nothing waits for a runtime never watched.
        assert r.service.state.pending_count == 0
        samples = await scrape_counts(r)
        ref = cluster_ref("torch-distributed")
        assert total(samples, CREATED, namespace="team1", runtime_ref=ref) == 1
        # Nodes from the job's own numNodes (the runtime, unknown, adds nothing).
        assert total(samples, NODES + "_sum", runtime_ref=ref) == 3
        assert total(samples, RUNTIME_INFO, kind="ClusterTrainingRuntime") == 0
    assert sim.faults.counters["status_503"] == 0  # nothing asked for them


async def test_trainjobs_are_listed_after_the_runtimes(sim: SimulatedCluster, kubeconfig: Path) -> None:
    """A TrainJob is read with its runtime's training step (app/trainer/rules/steps.py); one listed before its
    runtime is read by the controller's naming, and its next write cannot be told from an edge. So a replica
    lists the runtimes first. An MPI job whose ``node`` workers are ready while its launcher is not is pending
    (kubeflow/trainer v2.3.0: the launcher is the ancestor-``trainer`` job of deepspeed_distributed.yaml and
    ``dependsOn`` the ready ``node`` job, kubernetes-sigs/jobset v0.12.0 pkg/controllers/depends_on.go), but
    running by the naming alone. Its launcher ready later is its start, observed once. Listed before its
    runtime (a slow runtime list), it was read running and its start was never observed."""
    ns = "team1"
    sim.store.create(TRAINJOBS, ns, trainjob_manifest("mpi", runtime="deepspeed-distributed"))
    node, launcher = running_status()["jobsStatus"][0], {"name": "launcher", "active": 1, "ready": 0}
    write_status(sim.store, ns, "mpi", {"jobsStatus": [node, launcher]})
    # The cluster runtimes' LIST hangs until released: the TrainJobs must not be listed meanwhile.
    sim.faults.stall_requests(resource=CLUSTER_TRAINING_RUNTIMES.plural, watch=False)
    async with replica(kubeconfig, "a", leader_election=False) as r:

        async def trainjobs_wait() -> bool:
            reasons = (await r.http.get("/readyz")).json()["reasons"]
            return "informer trainjobs waits for the runtime lists" in reasons

        await eventually(trainjobs_wait, timeout=20, what="readyz: the TrainJobs wait for the runtimes")
        (jobs,) = [i for i in r.service.informers if i.resource == TRAINJOBS]
        assert not jobs.synced and len(jobs) == 0
        sim.faults.release_requests()
        await wait_leading(r)
        ref = cluster_ref("deepspeed-distributed")
        assert total(await scrape_counts(r), JOBS, namespace=ns, runtime_ref=ref, state="pending") == 1
        write_status(sim.store, ns, "mpi", {"jobsStatus": [node, {**launcher, "ready": 1}]})

        async def started() -> bool:
            return total(await scrape_counts(r), STARTUP + "_count", runtime_ref=ref) == 1

        await eventually(started, timeout=20, what="the MPI job's start observed")
        assert total(await scrape_counts(r), JOBS, namespace=ns, runtime_ref=ref, state="running") == 1
