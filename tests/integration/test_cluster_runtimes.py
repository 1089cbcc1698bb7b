"""ClusterTrainingRuntimes are cluster-scoped, so a namespaced install (Roles only, no ClusterRole) cannot
read them. A replica that watches them without that access never syncs: never ready, never leading. With
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
from tests.support.harness import CREATED, NODES, RUNTIME_INFO, cluster_ref, trainjob_manifest, wait_leading
from tests.support.replica_inprocess import replica
from tests.support.samples import scrape_counts, total
from tests.support.waiting import eventually

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
            return resp.status_code == 503 and reasons == ["informer clustertrainingruntimes has not synced"]

        # The namespaced informers sync; the cluster-scoped one never does, so nothing is exported.
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
