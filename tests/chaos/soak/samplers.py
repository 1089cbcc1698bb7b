"""The soak's background readings while it runs: readiness, RSS, each replica process's memory, and the
truth's pruning."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from typing import TYPE_CHECKING, Any

import httpx

from tests.chaos.memory import heap_trims, structures
from tests.chaos.replicas import InProcessReplica, ReplicaHandle
from tests.chaos.soak.own_memory import rss_bytes, traced_by_part, trimmed_rss_bytes

if TYPE_CHECKING:
    from tests.chaos.soak.runner import Soak


async def sample_readiness(soak: Soak, stop: asyncio.Event) -> None:
    """Every replica's readiness (what /readyz answers: ``Service.readiness_problems``) every 0.1 s."""
    while not stop.is_set():
        t = soak.t()
        for identity, handle in list(soak.live.items()):
            soak.readiness.append((t, identity, 200 if handle.ready() else 503))
        await asyncio.sleep(soak.cfg.sample_interval)  # the sampler's period (scenario pacing)


def memory_point(soak: Soak) -> dict[str, Any]:
    """Sizes of the bounded structures (summed over the live in-process replicas) and, when tracing,
    the traced memory by part of the process."""
    services = [e.service for e in soak.live.values() if isinstance(e, InProcessReplica)]
    point: dict[str, Any] = {
        "t": soak.t(),
        "rss_mb": round(rss_bytes() / 2**20, 1),
        "replicas": len(services),
        "journal_entries": sum(len(s.journal._journal) for s in services),
        "tombstones": sum(s.state.history.tombstones for s in services),
        "cached_objects": sum(len(i) for s in services for i in s.informers),
        "sim_history_events": len(soak.sim.store._history),
    }
    if tracemalloc.is_tracing():
        point["traced_mb"] = {k: round(v / 2**20, 2) for k, v in traced_by_part().items()}
    return point


async def sample_rss(soak: Soak, stop: asyncio.Event) -> None:
    """This process's RSS every second (reported; in process mode it holds no replica), and the
    ratio of counted to true creations every five."""
    tick = 0
    while not stop.is_set():
        soak.rss.append((soak.t(), rss_bytes()))
        if "warm" not in soak.memory and soak.t() >= soak.cfg.warmup_seconds:
            if not soak.cfg.processes:  # compacts the simulated history: only where it shares the process
                soak.trimmed["warm"] = trimmed_rss_bytes(soak.sim)
            soak.memory["warm"] = memory_point(soak)
        if tick % 5 == 0:
            truth = sum(soak.gen.truth.created.values()) - soak.created_before
            soak.ratios.append((soak.t(), float(truth), soak.counted_created))
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def sample_processes(soak: Soak, stop: asyncio.Event) -> None:
    """Process mode: each replica process's RSS from /proc every ``memory_interval`` seconds, the sizes
    of its bounded structures and its live memory every ``structures_every`` readings (memory.py)."""
    tick = 0
    while not stop.is_set():
        t = soak.t()
        if soak.sampling_done:
            return
        live = {h.pid: h for h in soak.live.values() if h.pid is not None}
        for proc in soak.processes:
            if proc.stopped is None and proc.pid in live:
                proc.sample(t)
        if tick % soak.cfg.structures_every == 0:
            await read_structures(soak, live)
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), soak.cfg.memory_interval)


async def read_structures(soak: Soak, live: dict[int, ReplicaHandle]) -> None:
    """Each live process's bounded structures (/debug/snapshot) and live memory (/soak/memory)."""
    for proc in soak.processes:
        handle = live.get(proc.pid)
        if proc.stopped is not None or handle is None:
            continue
        with contextlib.suppress(httpx.HTTPError, ValueError):
            resp = await handle.http.get("/debug/snapshot")
            if resp.status_code == 200:
                proc.structures_read(soak.t(), structures(resp.json()))
            resp = await handle.http.get("/soak/memory")
            if resp.status_code == 200:
                proc.allocs.append((soak.t(), resp.json()))


async def read_trimmed(soak: Soak, point: str) -> None:
    """Each live process's figures after a full collection and malloc_trim(0)
    (tests/support/replica_instruments.py)."""
    for proc in soak.processes:
        handle = next((h for h in soak.live.values() if h.pid == proc.pid), None)
        if proc.stopped is not None or handle is None:
            continue
        with contextlib.suppress(httpx.HTTPError, ValueError):
            resp = await handle.http.get("/metrics")
            if resp.status_code == 200:
                proc.readings["heap_trims"] = heap_trims(resp.text)
            resp = await handle.http.get("/soak/memory", params={"trim": "1"})
            if resp.status_code == 200:
                proc.readings[point] = {"t": soak.t(), **resp.json()}


async def prune_truth(soak: Soak, stop: asyncio.Event) -> None:
    """The truth keeps a record per TrainJob ever created (for tests that diff snapshots); drop those of
    deleted jobs so that this process's memory measures the run, not the test oracle."""
    truth = soak.gen.truth
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)
        live = soak.gen.jobs
        for table in (truth.requests, truth.terminal):
            for uid in [u for u in table if u not in live]:
                del table[uid]
        soak.visibility.prune()
