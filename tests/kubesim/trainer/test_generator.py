"""WorkloadGenerator against the real simulated Store: runtimes, determinism, truth consistency,
controller-like state transitions, adversarial mode, drivers."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, defaultdict
from typing import Any

import pytest

from kubesim.apiserver.storage.store import Store
from kubesim.apiserver.storage.table import WatchEvent
from kubesim.trainer import kueue
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.gen_population import ORPHANED, JobRecord
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from kubesim.trainer.truth import recount_jobs
from kubesim.trainer.truth_rules import FAILURE_REASONS

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TERMINAL = {"succeeded", "failed"}


def stored_jobs(store: Store) -> list[dict[str, Any]]:
    return store.list(TRAINJOBS, None)[0]


def assert_truth_matches_store(gen: WorkloadGenerator, store: Store) -> None:
    """The gauge truth equals a recount of the store; the counters agree with the per-uid records."""
    jobs = stored_jobs(store)
    assert dict(gen.truth.jobs) == recount_jobs(jobs, gen.truth.runtimes, gen.truth.training)
    snap = gen.snapshot()
    assert sum(snap.created.values()) == len(snap.requests)
    assert sum(snap.finished.values()) == len(snap.terminal)
    by_key = Counter((f.result, f.reason, f.runtime_ref) for f in snap.terminal.values())
    assert dict(by_key) == dict(snap.finished)
    for obj in jobs:  # every stored job was created through the generator and is known
        assert obj["metadata"]["uid"] in snap.requests


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored TrainJob without what differs between two identical runs (uid, clocks, managedFields)."""
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "finalizers")}
    status = dict(obj.get("status") or {})
    status["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
    ]
    status.pop("trainerStatus", None)
    spec = dict(obj["spec"])
    # The webhooks stamp runtime patches with the cluster's time, which runs from the job's creation.
    spec["runtimePatches"] = [
        {k: v for k, v in p.items() if k != "time"} for p in spec.get("runtimePatches") or []
    ]
    return {"metadata": meta, "spec": spec, "status": status}


@pytest.fixture
def store() -> Store:
    return trainer_store()


def test_load_runtimes_uses_real_manifests_and_both_kinds(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=1, namespaces=3)
    refs = gen.load_runtimes()
    cluster = {o["metadata"]["name"] for o in store.list(CLUSTER_TRAINING_RUNTIMES, None)[0]}
    assert {
        "torch-distributed",
        "torch-distributed-with-cache",
        "deepspeed-distributed",
        "mlx-distributed",
        "jax-distributed",
        "xgboost-distributed",
        "torchtune-llama3.2-1b",
        "torchtune-llama3.2-3b",
        "torchtune-qwen2.5-1.5b",
        "flux-distributed",
    } <= cluster
    namespaced = store.list(TRAINING_RUNTIMES, None)[0]
    assert len(namespaced) == 2 * 3
    assert {o["metadata"]["name"] for o in namespaced} == {"torch-with-dataset-init", "torch-distributed"}
    assert len(refs) == len(cluster) + len(namespaced)
    # A second generator on the same store adopts the runtimes instead of failing.
    assert sorted(WorkloadGenerator(store, seed=2, namespaces=3).load_runtimes()) == sorted(refs)


def test_load_runtimes_extra_for_benchmarks(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=1)
    refs = gen.load_runtimes(extra=200)
    assert len([r for r in refs if "/bench-rt-" in r]) == 200
    assert len(refs) == len(set(refs))
    gen.populate(300)
    assert_truth_matches_store(gen, store)


def test_same_seed_same_writes() -> None:
    def run(seed: int) -> tuple[list[str], list[dict[str, Any]], dict[Any, int], dict[Any, int]]:
        store = trainer_store()
        gen = WorkloadGenerator(store, seed=seed, malformed_ratio=0.1, clock=lambda: 1_800_000_000.0)
        actions = [gen.step() for _ in range(600)]
        jobs = sorted((comparable(o) for o in stored_jobs(store)), key=lambda o: o["metadata"]["name"])
        return actions, jobs, dict(gen.truth.created), dict(gen.truth.finished)

    first, second, other = run(7), run(7), run(8)
    assert first == second
    assert first[0] != other[0]


def test_lifecycles_truth_equals_recount_and_all_finish(store: Store) -> None:
    """Every lifecycle ends, except those of the jobs no controller runs (a runtime kind the controller
    has not registered, MultiKueue jobs no worker admits): they stay, without a status, until deleted."""
    gen = WorkloadGenerator(store, seed=3, suspend_ratio=0.3)
    before = gen.snapshot()
    gen.lifecycles(300, delete=False)
    after = gen.snapshot()
    assert_truth_matches_store(gen, store)
    orphaned = gen.buckets[ORPHANED].items
    assert len(orphaned) < 10
    assert all("status" not in o or not o["status"] for o in _objects(store, orphaned))
    assert sum(after.created_since(before).values()) == 300
    # once per uid despite duplicate updates
    assert sum(after.finished_since(before).values()) == 300 - len(orphaned)
    assert sum(n for (_, _, state), n in after.jobs.items() if state not in TERMINAL) == len(orphaned)
    results = Counter(f.result for f in after.terminal.values())
    assert results["succeeded"] > 0 and results["failed"] > 0
    # upstream's reasons, and the generator's well-formed new ones by name (truth.reason_label)
    new_reasons = {"PodFailurePolicyRuleMatched", "InPlaceRestartBudgetExhausted"}
    assert {f.reason for f in after.terminal.values()} <= FAILURE_REASONS | new_reasons | {"none", "other"}


def _objects(store: Store, records: list[JobRecord]) -> list[dict[str, Any]]:
    return [store.get(TRAINJOBS, rec.namespace, rec.name) for rec in records]


def test_lifecycles_with_deletion_leave_nothing(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=4, finalizer_ratio=0.5)
    gen.lifecycles(200)
    assert stored_jobs(store) == []
    assert gen.truth.jobs == Counter()
    orphaned = sum(1 for uid in gen.snapshot().requests if uid not in gen.snapshot().terminal)
    assert len(gen.snapshot().terminal) == 200 - orphaned
    assert orphaned < 5
    assert not gen.jobs


def test_state_transitions_follow_the_controller(store: Store) -> None:
    """Every watch event, replayed per uid: created non-terminal, terminal results never change or
    revert, the Suspended condition always carries the reason that goes with its status."""
    history: dict[str, list[tuple[str, str]]] = defaultdict(list)

    def listen(event: WatchEvent) -> None:
        if event.resource == TRAINJOBS:
            obj = event.entry.obj
            history[obj["metadata"]["uid"]].append((event.type, gen.truth.classify(obj)[0]))
            for c in (obj.get("status") or {}).get("conditions") or []:
                if c["type"] == "Suspended":
                    assert (c["status"], c["reason"]) in {("True", "Suspended"), ("False", "Resumed")}

    store.subscribe(listen)
    gen = WorkloadGenerator(store, seed=5)
    for _ in range(4000):
        gen.step()
    gen.lifecycles(100)
    assert history
    for events in history.values():
        assert events[0] == ("ADDED", "pending") or events[0] == ("ADDED", "suspended")
        terminal = [state for _, state in events if state in TERMINAL]
        if terminal:
            first = next(i for i, (_, state) in enumerate(events) if state in TERMINAL)
            assert {state for _, state in events[first:]} == {terminal[0]}
        assert all(kind != "ADDED" for kind, _ in events[1:])
        assert all(kind != "DELETED" for kind, _ in events[:-1])


def test_steady_state_steps_keep_truth_exact(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=6, max_jobs=200)
    actions = Counter(gen.step() for _ in range(5000))
    for name in ("create", "admit", "advance", "train", "finish", "delete", "duplicate-terminal", "remote"):
        assert actions[name] > 0, name
    assert len(gen.jobs) <= 200
    assert_truth_matches_store(gen, store)


def test_names_are_rfc1035_labels(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=9)
    gen.populate(2000)
    names = [o["metadata"]["name"] for o in stored_jobs(store)]
    assert len(names) == 2000
    assert all(RFC1035.match(n) and len(n) <= 63 for n in names)
    assert max(len(n) for n in names) == 63  # some realistic long names reach the limit


def test_populate_shapes_cover_the_interesting_cases(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=10)
    gen.populate(3000)
    assert_truth_matches_store(gen, store)
    snap = gen.snapshot()
    states = Counter(state for (_, _, state), n in snap.jobs.items() for _ in range(n))
    assert set(states) == {"suspended", "pending", "running", "succeeded", "failed"}
    requests = list(snap.requests.values())
    classes = {cls for r in requests for cls, _ in r.accelerators}
    assert {"none", "nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-1g.10gb", "google.com/tpu"} <= classes
    assert any(len(r.accelerators) > 1 for r in requests)  # several classes on one job
    assert {0, 1, 16} <= {r.nodes for r in requests}
    kinds = {r.runtime_ref.split("/")[1] for r in requests if r.runtime_ref != "unknown"}
    assert kinds == {"ClusterTrainingRuntime", "TrainingRuntime"}
    specs = [o["spec"] for o in stored_jobs(store)]
    assert any(s.get("suspend") is True for s in specs)
    queued = [o for o in stored_jobs(store) if kueue.QUEUE_LABEL in (o["metadata"].get("labels") or {})]
    assert queued
    reasons = {reason for (_, reason, _) in snap.finished}
    assert {"none", "FailedJobs", "ReachedMaxRestarts", "FailJobSetFailurePolicyAction", "other"} <= reasons


def test_runtime_ref_defaults_are_applied_by_the_store(store: Store) -> None:
    """Every stored reference carries the CRD's defaults; a rare few (a webhook bypassed) name a runtime
    kind the controller has not registered."""
    gen = WorkloadGenerator(store, seed=11)
    gen.populate(1000)
    refs = [obj["spec"]["runtimeRef"] for obj in stored_jobs(store)]
    registered = [r for r in refs if (r["apiGroup"], r["kind"]) in REGISTERED]
    assert all(r.get("apiGroup") and r.get("kind") for r in refs)
    assert len(refs) - len(registered) <= 10


REGISTERED = {("trainer.kubeflow.org", "ClusterTrainingRuntime"), ("trainer.kubeflow.org", "TrainingRuntime")}


def test_malformed_mode_stays_consistent(store: Store) -> None:
    # seed: one whose 200 KB-annotation job is still alive at the end (deletion is random)
    gen = WorkloadGenerator(store, seed=21, malformed_ratio=1.0)
    for _ in range(1500):
        gen.step()
    gen.lifecycles(100, delete=False)
    assert_truth_matches_store(gen, store)
    snap = gen.snapshot()
    assert any(ns_ref[1] == "unknown" for ns_ref in snap.created)
    assert any("/missing-runtime-" in ref for _, ref in snap.created)
    assert any(r.malformed for r in snap.requests.values())
    annotations = [len(str(o["metadata"].get("annotations") or "")) for o in stored_jobs(store)]
    # The 1 MB annotation is refused (422: annotations total at most 256 KiB) and retried at 200 KB.
    assert 200_000 <= max(annotations) < 256 * 1024
    condition_types = {
        c["type"] for o in stored_jobs(store) for c in (o.get("status") or {}).get("conditions") or []
    }
    assert {"Created", "example.com/Checkpointed"} <= condition_types


def test_time_warp_stretches_lifetimes(store: Store) -> None:
    # The clock runs 30 s ahead of the store's creationTimestamps: every job "ran" >= 30 s, x100.
    # (No deadlines: one would end a job at its activeDeadlineSeconds instead.)
    gen = WorkloadGenerator(
        store, seed=13, time_warp=100.0, deadline_ratio=0.0, clock=lambda: time.time() + 30
    )
    gen.lifecycles(20, delete=False)
    lifetimes = [f.lifetime_seconds for f in gen.snapshot().terminal.values()]
    assert len(lifetimes) == 20 - len(gen.buckets[ORPHANED])
    assert all(lt is not None and 2900 <= lt <= 3300 for lt in lifetimes), lifetimes


def test_huge_time_warp_stays_parseable(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=13, time_warp=1e12, clock=lambda: time.time() + 30)
    gen.lifecycles(5, delete=False)
    assert all(f.lifetime_seconds is not None for f in gen.snapshot().terminal.values())


async def test_run_drives_steps_at_a_rate(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=14)
    assert await gen.run(rate=5000, max_steps=300) == 300
    stop = asyncio.Event()
    task = asyncio.create_task(gen.run(rate=1000, stop=stop))
    await asyncio.sleep(0.05)
    stop.set()
    steps = await asyncio.wait_for(task, 2)
    assert steps > 0
    assert_truth_matches_store(gen, store)


async def test_run_lifecycles_yields_to_the_loop(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=15)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    actions = await gen.run_lifecycles(50, delete=False)
    task.cancel()
    assert actions >= 50 * 3
    assert ticks > actions // 2
    assert sum(gen.truth.finished.values()) == 50 - len(gen.buckets[ORPHANED])


def test_external_deletion_is_tolerated(store: Store) -> None:
    gen = WorkloadGenerator(store, seed=16)
    gen.populate(60)
    for obj in stored_jobs(store)[:20]:
        meta = obj["metadata"]
        if meta.get("finalizers"):
            store.patch(TRAINJOBS, meta["namespace"], meta["name"], {"metadata": {"finalizers": None}})
        store.delete(TRAINJOBS, meta["namespace"], meta["name"])
    for _ in range(300):
        gen.step()  # 404s on vanished jobs are absorbed
    gen.reconcile()
    assert_truth_matches_store(gen, store)


def test_jobs_no_controller_runs_stay_without_status(store: Store) -> None:
    """A runtime kind the controller has not registered: no status ever (kubeflow/trainer v2.3.0 Reconcile
    panics on the nil runtime before its status patch); MultiKueue jobs Kueue cannot build PodSets for (no
    such runtime) are never dispatched; a queued job whose runtime does not exist gets the Suspended
    condition only (its JobSet cannot be built)."""
    statuses: dict[str, list[Any]] = defaultdict(list)  # uid -> the status of each of its events
    store.subscribe(
        lambda ev: (
            statuses[ev.entry.obj["metadata"]["uid"]].append(ev.entry.obj.get("status"))
            if ev.resource == TRAINJOBS
            else None
        )
    )
    gen = WorkloadGenerator(store, seed=1)
    gen.load_runtimes()
    unregistered = {"apiGroup": "kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    missing = {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "no-such-runtime",
    }
    jobs = [
        gen.create_job(suspended=False, ref=unregistered),
        gen.create_job(suspended=True, ref=unregistered, multikueue=True, dispatch=True),
        gen.create_job(suspended=True, ref=missing, multikueue=True, dispatch=True),
        gen.create_job(suspended=True, ref=missing, multikueue=False),
    ]
    assert all(rec is not None and rec.phase == ORPHANED for rec in jobs)
    for _ in range(500):  # until their users give up on them
        gen.step()
    seen = [statuses[rec.uid] for rec in jobs if rec is not None]
    assert [set(map(str, events)) for events in seen[:3]] == [{"None"}] * 3
    suspended_only = {
        str([c["type"] for c in (status or {}).get("conditions", [])]) for status in seen[3][1:]
    }
    assert suspended_only == {"['Suspended']"}
