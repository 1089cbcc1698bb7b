"""PromQL sees every failed pod of a TrainJob once, across a graceful leader change: a real Prometheus
scrapes two replicas each second; pods are created through the simulated API server with the labels JobSet
writes (kubernetes-sigs/jobset v0.12.0 ``jobset.sigs.k8s.io/jobset-name``) and failed through pods/status as
the kubelet writes it (``status.reason`` Evicted / DeadlineExceeded: kubernetes ``pkg/kubelet/eviction``,
``pkg/kubelet/active_deadline.go``; a container's ``state.terminated.reason`` OOMKilled / Error: the
runtime's, through CRI). Some fail under the first leader, the leader stops (SIGTERM: it hands over), the
rest fail under its successor. The increments PromQL can see (tests/support/promql_visible.py, from the raw
samples) equal the truth read from the stored pods (sim/kubesim/trainer/truth_pods.py), per (namespace,
runtime_ref, reason); ``sum(increase(...))`` over the run is the number of failed pods."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from app.trainer.kinds import TRAINJOBS
from kubesim.apiserver.core import PODS
from kubesim.trainer.truth_pods import JOBSET_NAME_LABEL, pod_failures
from tests.support.fleet import JOB, Fleet, FleetPrometheus
from tests.support.harness import trainjob_manifest
from tests.support.prom import requires_prometheus, wait_for
from tests.support.promql_visible import born_above_zero, visible_increments

pytestmark = [requires_prometheus, pytest.mark.timeout(180)]

SELECTOR = f'job="{JOB}"'
POD_FAILURES = "kubeflow_trainer_trainjob_pod_failures_total"
NAMESPACES = ("pf-a", "pf-b")


@dataclass
class Run:
    fleet: Fleet
    prom: FleetPrometheus
    started: float
    at: float
    handed_over: bool
    truth: dict[tuple[str, ...], float]

    @property
    def seconds(self) -> int:
        return math.ceil(self.at - self.started) + 10


def create_pod(fleet: Fleet, ns: str, name: str, jobset: str) -> None:
    def create() -> None:
        store = fleet._sim().store
        store.create(
            PODS,
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {JOBSET_NAME_LABEL: jobset, "jobset.sigs.k8s.io/replicatedjob-name": "node"},
                },
                "spec": {"nodeName": "gpu-1", "containers": [{"name": "node", "image": "pytorch"}]},
            },
        )
        obj = store.get(PODS, ns, name)
        obj["status"] = {"phase": "Running"}
        store.update(PODS, ns, obj, subresource="status")

    fleet.call(create)


def fail_pod(
    fleet: Fleet, ns: str, name: str, *, reason: str = "", exit_code: int = 0, why: str = ""
) -> None:
    """The kubelet's status write of a failed pod: its own reason, or its container's termination."""

    def write() -> None:
        store = fleet._sim().store
        obj = store.get(PODS, ns, name)
        status: dict[str, Any] = {"phase": "Failed"}
        if reason:
            status["reason"] = reason
        if exit_code:
            status["containerStatuses"] = [
                {
                    "name": "node",
                    "state": {"terminated": {"exitCode": exit_code, "reason": why}},
                    "ready": False,
                    "restartCount": 0,
                    "image": "pytorch",
                    "imageID": "",
                }
            ]
        obj["status"] = status
        store.update(PODS, ns, obj, subresource="status")

    fleet.call(write)


def stored_truth(fleet: Fleet) -> dict[tuple[str, ...], float]:
    def read() -> dict[tuple[str, ...], float]:
        store = fleet._sim().store
        pods = [p for ns in NAMESPACES for p in store.list(PODS, ns)[0]]
        jobs = [j for ns in NAMESPACES for j in store.list(TRAINJOBS, ns)[0]]
        return {key: float(n) for key, n in pod_failures(pods, jobs).items()}

    return fleet.call(read)


def every_replica(fleet: Fleet, check: Any) -> bool:
    return fleet.call(lambda: all(check(live.service) for live in fleet.live.values()))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    fleet = Fleet(seed=20261206, slots=2, namespaces=2, max_jobs=10, populate=0)
    fleet.start()
    prom: FleetPrometheus | None = None
    try:
        for ns in NAMESPACES:
            fleet.call(lambda ns=ns: fleet._sim().store.create(TRAINJOBS, ns, trainjob_manifest("llama")))
        replicas = [fleet.add(), fleet.add()]
        wait_for(lambda: all(fleet.ready(i) for i in replicas), timeout=30, what="replicas ready")
        leader = wait_for(fleet.leader, timeout=30, what="a leader")
        wait_for(lambda: all(fleet.candidate(i) for i in replicas), timeout=30, what="two candidates")
        # Every replica joins pods to both TrainJobs (its pods watch and its TrainJob watch both synced).
        wait_for(
            lambda: every_replica(
                fleet,
                lambda s: all(s.pods.trainjobs.get(ns, "llama") for ns in NAMESPACES) and s.pods.pod_watches,
            ),
            timeout=30,
            what="the pods watches and both TrainJobs",
        )
        prom = FleetPrometheus(tmp_path_factory.mktemp("prom-pod-failures"), fleet.targets())
        prom.start()
        wait_for(
            lambda: prom.query(f"kubeflow_trainer_runtime_info{{{SELECTOR}}}"), timeout=30, what="a scrape"
        )
        started = time.time()
        pods = [("pf-a", "llama-node-0-0"), ("pf-a", "llama-node-0-1"), ("pf-a", "llama-node-0-2")]
        pods += [("pf-b", "llama-node-0-0"), ("pf-a", "stray-0")]
        for ns, name in pods:
            create_pod(fleet, ns, name, "not-a-trainjob" if name.startswith("stray") else "llama")
        wait_for(
            lambda: every_replica(fleet, lambda s: s.pods.series.pods == len(pods)),
            timeout=30,
            what="every replica watching the pods",
        )

        # Under the first leader: an eviction, an OOM kill, and a pod of a JobSet that is no TrainJob's.
        fail_pod(fleet, "pf-a", "llama-node-0-0", reason="Evicted")
        fail_pod(fleet, "pf-a", "llama-node-0-1", exit_code=137, why="OOMKilled")
        fail_pod(fleet, "pf-a", "stray-0", exit_code=1, why="Error")
        wait_for(
            lambda: every_replica(fleet, lambda s: s.pods.failures.counted == 2),
            timeout=30,
            what="both failures seen by every replica",
        )
        handed_over = fleet.graceful_stop(leader)
        wait_for(fleet.leader, timeout=30, what="a new leader")

        # Under its successor: a container's non-zero exit, a pod past its deadline.
        fail_pod(fleet, "pf-a", "llama-node-0-2", exit_code=1, why="Error")
        fail_pod(fleet, "pf-b", "llama-node-0-0", reason="DeadlineExceeded")
        wait_for(
            lambda: every_replica(fleet, lambda s: s.pods.failures.counted == 4),
            timeout=30,
            what="the last failures seen",
        )
        wait_for(lambda: fleet.unsettled(0) is None, timeout=30, what="every count shown to the scraper")
        now = time.time()
        at = wait_for(
            lambda: (
                stamp
                if (r := prom.query(f"max(timestamp(up{{{SELECTOR}}} == 1))"))
                and (stamp := float(r[0]["value"][1])) > now + 1
                else None
            ),
            timeout=20,
            what="a scrape after the run settled",
        )
        yield Run(fleet, prom, started, at, handed_over, stored_truth(fleet))
    finally:
        if prom is not None:
            prom.stop()
        fleet.stop()


def test_promql_sees_each_failed_pod_once_by_namespace_runtime_and_reason(run: Run) -> None:
    visible = visible_increments(run.prom, run.at, run.seconds, SELECTOR, names=[POD_FAILURES])[POD_FAILURES]
    ref = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"
    assert run.truth == {
        ("pf-a", ref, "Evicted"): 1.0,
        ("pf-a", ref, "OOMKilled"): 1.0,
        ("pf-a", ref, "Error"): 1.0,
        ("pf-b", ref, "DeadlineExceeded"): 1.0,
    }
    assert dict(visible) == run.truth


def test_sum_increase_of_the_counter_is_the_number_of_failed_pods(run: Run) -> None:
    """What a user types, over a range covering the run: the leader that stopped has a series that ended
    before the range did, which increase() extrapolates by at most half a scrape interval."""
    result = run.prom.query(f"sum(increase({POD_FAILURES}{{{SELECTOR}}}[{run.seconds}s]))", run.at)
    got = float(result[0]["value"][1]) if result else 0.0
    assert 4.0 - 1e-6 <= got <= 4.0 * 1.15, got
    assert run.handed_over, "the graceful stop waited until its counts were scraped"


def test_every_pod_failure_series_is_born_at_zero(run: Run) -> None:
    born = born_above_zero(run.prom, run.at, run.seconds, SELECTOR)
    assert [s for s in born if s.get("__name__") == POD_FAILURES] == []
