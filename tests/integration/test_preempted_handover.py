"""A replica that started while a TrainJob was preempted does not count the job's next run, or its
re-admission, as its first: the leader carries the jobs that ran before in the Lease
(app/handover/history.py, docs/leadership.md "Jobs that ran before").

Why the replica cannot tell by itself: the controller writes Suspended=True with reason "Suspended" to a
job waiting for its first admission and to a preempted one alike (kubeflow/trainer v2.3.0
pkg/controller/trainjob_controller.go, setSuspendedCondition), and JobSet suspends the child Jobs of both
(kubernetes-sigs/jobset pkg/controllers/jobset_controller.go, suspendJobs). The control case shows the
double count that carrying the facts removes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.handover import lease_payload
from app.handover.history import parse_history
from app.kube.resources import LEASES
from app.replica.service import Service
from app.trainer.events import JobAdmitted, JobStarted
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from tests.support.harness import Fleet
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

LEASE_NS, LEASE_NAME = "default", "trainer-metrics"


def tap_edges(service: Service, sink: list[tuple[str, str, str]]) -> None:
    """Record (identity, kind, uid) of every time-to-running / admission edge ``service`` counts (through
    the served ledger's ``count``, its only way in while leading)."""
    state = service.metric_state
    original = state.count
    identity = service.settings.identity

    def count(event: Any) -> Any:
        if isinstance(event, JobStarted):
            sink.append((identity, "started", event.uid))
        elif isinstance(event, JobAdmitted):
            sink.append((identity, "admitted", event.uid))
        return original(event)

    state.count = count  # type: ignore[method-assign]


def lease_says_ran(sim: SimulatedCluster, uid: str) -> bool:
    lease = sim.store.get(LEASES, LEASE_NS, LEASE_NAME)
    ran, _ = parse_history(lease["metadata"].get("annotations", {}))
    return uid in ran


@pytest.mark.parametrize(
    ("carried", "kill"),
    [(True, False), (True, True), (False, False)],
    ids=["graceful", "leader-killed", "control-not-carried"],
)
async def test_a_replica_started_while_a_job_was_preempted_counts_its_next_run_never(
    *,
    sim: SimulatedCluster,
    workload: WorkloadGenerator,
    kubeconfig: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    carried: bool,
    kill: bool,
) -> None:
    if not carried:
        monkeypatch.setattr(lease_payload, "format_history", lambda *a, **k: {})
    edges: list[tuple[str, str, str]] = []
    async with Fleet(tmp_path) as fleet:
        a = await fleet.add(kubeconfig, "a")
        tap_edges(a.service, edges)
        await fleet.wait_leader()
        # A Kueue job the built-in controller runs, with no deadline to end it on the way.
        ref = {"name": "torch-distributed"}
        rec = workload.create_job(
            suspended=True, runtime="torch-distributed", ref=ref, multikueue=False, deadline=None
        )
        assert rec is not None
        uid = rec.uid
        workload.admit(rec)
        workload.progress(rec)  # its pods are ready: it runs
        await eventually(
            lambda: {(k, u) for _, k, u in edges} == {("admitted", uid), ("started", uid)},
            what="a counts the first admission and the first run",
        )
        workload.preempt(rec)
        if carried:
            await eventually(lambda: lease_says_ran(sim, uid), what="the Lease says the job ran")
        else:
            await eventually(
                lambda: uid in a.service.state.published_history()[0], what="a knows the job ran"
            )

        b = await fleet.add(kubeconfig, "b")  # its first list shows the job preempted, nothing more
        tap_edges(b.service, edges)
        await fleet.wait_candidates()
        if kill:
            await a.service.kill()  # b takes over once a's Lease expires
        else:
            await a.service.stop()  # graceful hand-over
        successor = await fleet.wait_leader(timeout=15)
        assert successor is b

        workload.admit(rec)  # readmitted, and it runs again
        workload.progress(rec)
        rv = workload.truth.resource_version
        await eventually(lambda: fleet.caught_up(rv), what="b saw the job run again")
        b_edges = [(k, u) for who, k, u in edges if who == "b"]
        if carried:
            assert b_edges == []
            workload.preempt(rec)  # and b carries the fact on in its turn
            await eventually(lambda: lease_says_ran(sim, uid), what="b's Lease says the job ran")
        else:
            # What carrying removes: b takes the next run and re-admission for the first ones.
            assert sorted(b_edges) == [("admitted", uid), ("started", uid)]
