"""Stopped and killed replicas are freed (docs/reliability.md, "Memory").

Several ``Service`` replicas run against one simulated cluster; one after another is stopped gracefully or
killed (``Service.kill()``: no Lease release) and replaced by a fresh one, as in the chaos soak. Afterwards:

* no stopped ``Service`` object is alive any more (weak references, after ``gc.collect()``): nothing (a
  done-callback, a task, a logger, a registry, a kubernetes-asyncio client, the soak-style wrappers) keeps a
  stopped replica, its informer caches, journal or aiohttp session;
* the memory traced by tracemalloc whose allocating frame is in the service's code (``app/``; the
  simulated cluster is ``sim/kubesim/``) is back within 10 % of what the same number of warm replicas held
  before the cycles, so a replica leaves nothing behind (one leaked replica's caches would be ~1/3 of the
  figure);
* the number of asyncio tasks is back to what it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import pytest

from app.replica.service import Service
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from tests.chaos.soak.config import SoakConfig
from tests.chaos.soak.own_memory import service_traced_bytes
from tests.support.harness import last_write_rv
from tests.support.replica_inprocess import replica
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPLICAS = 3
CYCLES = 6  # alternately a kill of the leader and a graceful stop of a follower
JOBS = 300


async def _warm(services: list[Service]) -> bool:
    leaders = [s for s in services if s.journal.leading]
    return len(leaders) == 1 and all(not s.readiness_problems() for s in services)


def _steady(services: list[Service], store: Any) -> bool:
    """Nothing left to happen: one leader, all ready, every informer at the store's last write, every
    follower has read the leader's Lease (the point at which the memory and the tasks are compared)."""
    leaders = [s for s in services if s.journal.leading]
    if len(leaders) != 1 or any(s.readiness_problems() for s in services):
        return False
    holder = leaders[0].settings.identity
    return all(
        s.elector is not None
        and s.elector.status().holder == holder
        and all(
            i.synced and int(i.resource_version or 0) >= last_write_rv(store, i.resource) for i in s.informers
        )
        for s in services
    )


async def test_stopped_and_killed_replicas_are_freed(tmp_path: Path) -> None:
    overrides: dict[str, Any] = {
        **SoakConfig().service_overrides,
        "lease_name": "no-leak",
        "handover_journal_size": 500,
    }
    started_tracing = not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start(1)
    try:
        async with SimulatedCluster(bookmark_interval=0.5, history_window=2000) as sim:
            kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
            gen = WorkloadGenerator(sim.store, seed=7, namespaces=4, max_jobs=JOBS)
            gen.load_runtimes()
            for _ in range(6 * JOBS):  # a full population of jobs in every state, then no more writes
                gen._safe_step()

            live: dict[str, tuple[Service, contextlib.AsyncExitStack]] = {}
            seq = 0

            async def start() -> None:
                nonlocal seq
                seq += 1
                stack = contextlib.AsyncExitStack()
                r = await stack.enter_async_context(replica(kubeconfig, f"replica-{seq}", **overrides))
                live[r.identity] = (r.service, stack)

            async def settled() -> None:
                services = [s for s, _ in live.values()]
                await eventually(lambda: _warm(services), timeout=30.0, what="one leader, all ready")

            for _ in range(REPLICAS):
                await start()
            await settled()
            await eventually(
                lambda: _steady([s for s, _ in live.values()], sim.store), timeout=30.0, what="a steady fleet"
            )
            gc.collect()
            warm_bytes = service_traced_bytes()
            warm_tasks = len(asyncio.all_tasks())

            stopped: list[tuple[str, weakref.ref[Service]]] = []
            for cycle in range(CYCLES):
                kill = cycle % 2 == 0
                leader = next(i for i, (s, _) in live.items() if s.journal.leading)
                identity = leader if kill else next(i for i in live if i != leader)
                service, stack = live.pop(identity)
                stopped.append((identity, weakref.ref(service)))
                if kill:
                    await service.kill()
                await stack.aclose()
                del service, stack
                await start()
                await settled()

            await eventually(
                lambda: _steady([s for s, _ in live.values()], sim.store), timeout=30.0, what="a steady fleet"
            )
            # Tasks of the stopped replicas (their last requests, a release) end on their own: wait for it.
            await eventually(
                lambda: len(asyncio.all_tasks()) <= warm_tasks,
                timeout=10.0,
                what=f"the asyncio tasks back to the warm fleet's {warm_tasks}",
            )
            gc.collect()
            alive = [identity for identity, ref in stopped if ref() is not None]
            end_bytes = service_traced_bytes()
            end_tasks = len(asyncio.all_tasks())
            print(
                f"\nservice traced memory: {REPLICAS} warm replicas {warm_bytes / 2**20:.2f} MiB, after "
                f"{CYCLES} stops/kills and replacements {end_bytes / 2**20:.2f} MiB; tasks {warm_tasks} -> "
                f"{end_tasks}; stopped replicas still alive: {alive}"
            )
            assert alive == []
            assert end_bytes <= 1.10 * warm_bytes, (warm_bytes, end_bytes)
            assert end_tasks <= warm_tasks
            for _, stack in list(live.values()):
                await stack.aclose()
    finally:
        if started_tracing:
            tracemalloc.stop()
