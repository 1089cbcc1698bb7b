"""The pod series against the simulated API server: pods created through it with the labels JobSet writes
(kubernetes-sigs/jobset v0.12.0 ``pkg/controllers/jobset_controller.go`` labelAndAnnotateObject:
``jobset.sigs.k8s.io/jobset-name`` = the JobSet's, hence the TrainJob's name (kubeflow/trainer v2.3.0
``pkg/runtime/framework/plugins/jobset/jobset.go``), ``replicatedjob-name``, ``restart-attempt``; the Job
controller's ``batch.kubernetes.io/job-name``), their status written through pods/status as the kubelet
writes it; and the pods watch refused (403): one log line, reported in /debug/snapshot and the
self-telemetry, everything else working, picked up once allowed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from app.handover.watermarks import WATERMARK_ANNOTATION
from app.kube.lease import LeaseRecord
from app.replica import pods as replica_pods
from app.trainer.kinds import TRAINJOBS
from kubesim.apiserver.core import PODS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.harness import JOBS, cluster_ref, rfc3339, trainjob_manifest
from tests.support.replica_inprocess import replica
from tests.support.samples import Samples
from tests.support.waiting import eventually

NS = "team-a"
INFO = "kubeflow_trainer_trainjob_pod_info"
ALLOCATED = "kubeflow_trainer_trainjob_allocated_accelerators"
RESTARTS = "kubeflow_trainer_trainjob_restarts"
WATCH_STATUS = "trainer_metrics_pod_watch_status"


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"load_runtimes": True}


def create_pod(
    sim: SimulatedCluster,
    name: str,
    *,
    job: str | None = "llama",
    node: str = "",
    phase: str = "Running",
    gpus: int = 8,
    attempt: int = 0,
    replicated: str = "node",
    ns: str = NS,
) -> dict[str, Any]:
    """A pod as the Job controller creates it from a JobSet's template, then bound and its status written
    through pods/status (the scheduler binds it, the kubelet reports its phase)."""
    labels = {
        "batch.kubernetes.io/job-name": f"{job}-{replicated}-0",
        "jobset.sigs.k8s.io/replicatedjob-name": replicated,
        "jobset.sigs.k8s.io/restart-attempt": str(attempt),
    }
    if job is not None:
        labels["jobset.sigs.k8s.io/jobset-name"] = job
    sim.store.create(
        PODS,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                **({"nodeName": node} if node else {}),
                "containers": [
                    {
                        "name": "node",
                        "image": "pytorch",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        },
    )
    return set_phase(sim, name, phase, ns=ns)


def set_phase(sim: SimulatedCluster, name: str, phase: str, *, ns: str = NS) -> dict[str, Any]:
    obj = sim.store.get(PODS, ns, name)
    obj["status"] = {"phase": phase}
    return sim.store.update(PODS, ns, obj, subresource="status")


def of(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def job_labels(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"namespace": NS, "trainjob": "llama", **extra}.items()))


def info(pod: str, node: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            {
                "namespace": NS,
                "trainjob": "llama",
                "pod": pod,
                "node": node,
                "replicated_job": "node",
                "runtime_ref": cluster_ref("torch-distributed"),
            }.items()
        )
    )


async def test_pod_series_follow_the_pods_of_each_trainjob(sim: SimulatedCluster, kubeconfig: Path) -> None:
    sim.store.create(TRAINJOBS, NS, trainjob_manifest("llama"))
    create_pod(sim, "llama-node-0-0", node="gpu-1", attempt=1)
    create_pod(sim, "llama-node-0-1", node="gpu-2", gpus=4, attempt=1)
    create_pod(sim, "llama-node-0-2", phase="Pending")  # not bound yet
    create_pod(sim, "llama-node-0-old", node="gpu-3", phase="Failed", attempt=0)  # before the restart
    # A pod of a mistral TrainJob deleted before this test: no such TrainJob now.
    create_pod(sim, "mistral-old", job="mistral", node="gpu-4", attempt=9)
    created = sim.store.get(PODS, NS, "mistral-old")["metadata"]["creationTimestamp"]
    create_pod(sim, "plain", job=None, node="gpu-5")  # not a JobSet's: the selector leaves it out
    async with replica(kubeconfig, "pods-a", leader_election=False, debug_endpoints=True) as r:

        async def joined() -> bool:
            s = await r.samples()
            return (
                of(s, INFO) == {info("llama-node-0-0", "gpu-1"): 1.0, info("llama-node-0-1", "gpu-2"): 1.0}
                and of(s, ALLOCATED) == {job_labels(accelerator_class="nvidia.com/gpu"): 12.0}
                and of(s, RESTARTS) == {job_labels(): 1.0}
            )

        await eventually(joined, timeout=15, what="the pod series of llama")
        snapshot = (await r.http.get("/debug/snapshot")).json()["pods"]
        assert snapshot["enabled"] is True
        assert [(w["namespace"], w["status"]) for w in snapshot["watches"]] == [("", "watching")]
        assert snapshot["watches"][0]["informer"]["objects"] == 5  # the labelled pods only
        assert snapshot["pods"]["no_trainjob"] == 1 and snapshot["pods"]["not_holding"] == 2

        # The pending pod is bound and runs; a running one fails: what the job holds follows.
        sim.store.bind_pod(NS, "llama-node-0-2", {"target": {"kind": "Node", "name": "gpu-6"}})
        set_phase(sim, "llama-node-0-1", "Failed")

        async def moved() -> bool:
            s = await r.samples()
            return set(of(s, INFO)) == {
                info("llama-node-0-0", "gpu-1"),
                info("llama-node-0-2", "gpu-6"),
            } and of(s, ALLOCATED) == {job_labels(accelerator_class="nvidia.com/gpu"): 16.0}

        await eventually(moved, timeout=15, what="the series after a bind and a failure")

        # A pod of no cached TrainJob fails: /debug shows it unjoined (app/trainer/pod_failures.py: never
        # counted). Failed pods cached: llama's old one (failed before the first list), llama's and this one.
        create_pod(sim, "ghost-node-0-0", job="ghost", node="gpu-7")
        set_phase(sim, "ghost-node-0-0", "Failed")

        async def unjoined() -> bool:
            pods = (await r.http.get("/debug/snapshot")).json()["pods"]
            return bool(pods["unjoined_failures"] == 1 and pods["failed_pods"] == 3)

        await eventually(unjoined, timeout=15, what="the ghost pod's failure shown unjoined")

        # A new mistral TrainJob (a later second than the old pod: timestamps have whole seconds) and its
        # pod: the old pod, created before it, is not its. Then llama is deleted: its series go.
        await eventually(lambda: rfc3339(time.time()) > created, timeout=3, what="the next second")
        sim.store.create(TRAINJOBS, NS, trainjob_manifest("mistral"))
        create_pod(sim, "mistral-node-0-0", job="mistral", node="gpu-4", attempt=7)
        sim.store.delete(TRAINJOBS, NS, "llama")

        async def swapped() -> bool:
            s = await r.samples()
            trainjobs = {
                dict(labels)["trainjob"] for name in (INFO, ALLOCATED, RESTARTS) for labels in of(s, name)
            }
            pods = {dict(labels)["pod"] for labels in of(s, INFO)}
            return (
                trainjobs == {"mistral"}
                and pods == {"mistral-node-0-0"}
                and of(s, RESTARTS) == {tuple(sorted({"namespace": NS, "trainjob": "mistral"}.items())): 7.0}
            )

        await eventually(swapped, timeout=15, what="mistral's series only")


async def test_forbidden_pods_leave_everything_else_working(
    sim: SimulatedCluster, kubeconfig: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_pods, "RECHECK_INTERVAL", 0.5)
    sim.faults.deny("pods")
    sim.store.create(TRAINJOBS, NS, trainjob_manifest("llama"))
    create_pod(sim, "llama-node-0-0", node="gpu-1")
    caplog.set_level(logging.INFO, logger="app.replica.pods")
    async with replica(kubeconfig, "pods-b", leader_election=False, debug_endpoints=True) as r:

        async def exporting_without_pods() -> bool:
            s = await r.samples()
            return (
                await r.ready()
                and sum(v for (n, _), v in s.items() if n == JOBS) == 1
                and s.get((WATCH_STATUS, (("namespace", ""), ("status", "forbidden")))) == 1
            )

        await eventually(exporting_without_pods, timeout=15, what="ready and exporting, pods forbidden")
        assert not of(await r.samples(), INFO)
        snapshot = (await r.http.get("/debug/snapshot")).json()["pods"]
        watch = snapshot["watches"][0]
        assert (watch["status"], watch["informer"]) == ("forbidden", None)
        assert watch["reason"].startswith("403")
        # ... asked again every RECHECK_INTERVAL, logged once.
        await eventually(lambda: sim.faults.counters["forbidden"] >= 3, timeout=10, what="rechecks")
        refusals = [rec for rec in caplog.records if "forbidden" in rec.getMessage()]
        assert len(refusals) == 1 and "get, list and watch on pods" in refusals[0].getMessage()

        sim.faults.allow("pods")

        async def watching() -> bool:
            s = await r.samples()
            return of(s, INFO) == {info("llama-node-0-0", "gpu-1"): 1.0} and (
                s.get((WATCH_STATUS, (("namespace", ""), ("status", "watching")))) == 1
            )

        await eventually(watching, timeout=15, what="the pod series once pods are allowed")
        assert any("may be listed now" in rec.getMessage() for rec in caplog.records)


async def test_the_pods_are_listed_after_the_trainjobs(sim: SimulatedCluster, kubeconfig: Path) -> None:
    """client-go's WaitForCacheSync before a dependent informer: the pods watch lists once the TrainJobs are
    cached, so a pod already Failed in its first list finds its TrainJob (a failure it cannot join is never
    counted, app/trainer/pod_failures.py) and each pod shares its TrainJob's key string."""
    sim.store.create(TRAINJOBS, NS, trainjob_manifest("llama"))
    create_pod(sim, "llama-node-0-0", node="gpu-1", phase="Failed")
    create_pod(sim, "llama-node-0-1", node="gpu-2")
    sim.faults.stall_requests(resource=TRAINJOBS.plural, watch=False)  # the TrainJobs' LIST hangs
    async with replica(kubeconfig, "pods-after", leader_election=False) as r:
        await eventually(
            lambda: all(i.synced for i in r.service._runtime_informers), timeout=15, what="runtimes"
        )
        (watch,) = r.service.pods.pod_watches
        assert watch.informer is None and r.service.journal.unlisted == {"pods/"}
        sim.faults.release_requests()
        await eventually(lambda: not r.service.journal.unlisted, timeout=15, what="the pods listed")
        assert watch.informer is not None and r.service.pods.failures.unjoined == 0
        (job_key,) = {pod.trainjob_key for _, pod in watch.informer.items()}
        cached = r.service.pods.trainjobs.get(NS, "llama")
        assert cached is not None and job_key is cached.key


def lease_with_watermarks(watermarks: str) -> LeaseRecord:
    """An expired Lease of a leader that published ``watermarks`` (the hand-over floor)."""
    return LeaseRecord(
        holder_identity="gone",
        lease_duration_seconds=1,
        acquire_time=None,
        renew_time=None,
        lease_transitions=3,
        annotations={WATERMARK_ANNOTATION: watermarks},
        resource_version="1",
    )


async def test_a_replica_covers_no_pods_floor_before_its_pods_watch_listed(
    sim: SimulatedCluster, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pods watch lists after the TrainJobs and leading does not wait for it (app/replica/service.py).
    Until it has listed, the replica remembers no pod failure, so it covers no pods floor: a replica that
    does takes a dead leader's Lease first (app/handover/coverage.py), as for a journal that starts above
    the floor. The chaos soak lost failures that way: a replica whose pods list came after them led at
    once, and pods a JobSet restart had deleted were in no list it could read."""
    monkeypatch.setattr(replica_pods, "RECHECK_INTERVAL", 0.2)
    sim.faults.deny("pods")
    sim.store.create(TRAINJOBS, NS, trainjob_manifest("llama"))
    create_pod(sim, "llama-node-0-0", node="gpu-1")
    async with replica(kubeconfig, "pods-cover", retry_period_seconds=0.4) as r:
        await eventually(lambda: "" in r.service.journal.remembered_from, timeout=15, what="synced")
        assert r.service.journal.unlisted == {"pods/"}
        covered_trainjobs = r.service.journal.remembered_from[""]
        # A floor on the TrainJob stream only (no leader counted a pod failure): covered.
        assert r.service.takeover_delay(lease_with_watermarks(f'{{"":{covered_trainjobs}}}')) == 0.0
        with_pods = lease_with_watermarks(f'{{"":{covered_trainjobs},"pods/":{covered_trainjobs}}}')
        assert r.service.takeover_delay(with_pods) == pytest.approx(3 * 0.4)

        sim.faults.allow("pods")
        await eventually(lambda: not r.service.journal.unlisted, timeout=15, what="the pods listed")
        listed = r.service.journal.remembered_from["pods/"]
        assert listed >= covered_trainjobs  # its first pods list came after the TrainJobs'
        assert (
            r.service.takeover_delay(lease_with_watermarks(f'{{"":{covered_trainjobs},"pods/":{listed}}}'))
            == 0.0
        )
        # ... and a pods floor below its first pods list stays uncovered, as any stream's.
        below = lease_with_watermarks(f'{{"":{covered_trainjobs},"pods/":{listed - 1}}}')
        assert r.service.takeover_delay(below) == pytest.approx(3 * 0.4)


async def test_pod_series_off_adds_no_watch(sim: SimulatedCluster, kubeconfig: Path) -> None:
    sim.store.create(TRAINJOBS, NS, trainjob_manifest("llama"))
    create_pod(sim, "llama-node-0-0", node="gpu-1")
    async with replica(
        kubeconfig, "pods-c", leader_election=False, pod_series=False, debug_endpoints=True
    ) as r:

        async def exporting() -> bool:
            return sum(v for (n, _), v in (await r.samples()).items() if n == JOBS) == 1

        await eventually(exporting, timeout=15, what="the TrainJob exported")
        s = await r.samples()
        assert not of(s, INFO) and s[(WATCH_STATUS, (("namespace", ""), ("status", "off")))] == 1
        assert r.service.pods.pod_watches == []
        assert (await r.http.get("/debug/snapshot")).json()["pods"]["watches"][0]["status"] == "off"


async def test_namespaced_mode_watches_pods_per_namespace(sim: SimulatedCluster, kubeconfig: Path) -> None:
    sim.faults.deny("pods", namespace="team-b")  # a Role only in team-a
    sim.store.create(TRAINJOBS, NS, trainjob_manifest("llama"))
    create_pod(sim, "llama-node-0-0", node="gpu-1")
    async with replica(
        kubeconfig, "pods-d", leader_election=False, namespaces=[NS, "team-b"], debug_endpoints=True
    ) as r:

        async def per_namespace() -> bool:
            s = await r.samples()
            return (
                of(s, INFO) == {info("llama-node-0-0", "gpu-1"): 1.0}
                and s.get((WATCH_STATUS, (("namespace", NS), ("status", "watching")))) == 1
                and s.get((WATCH_STATUS, (("namespace", "team-b"), ("status", "forbidden")))) == 1
                and await r.ready()
            )

        await eventually(per_namespace, timeout=15, what="team-a watched, team-b forbidden")
