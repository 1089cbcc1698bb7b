"""The workload a test drives through the simulated cluster's generator, for every harness that runs one."""

from __future__ import annotations

import asyncio

from kubesim.trainer.generator import WorkloadGenerator


async def drive(gen: WorkloadGenerator, rate: float, stop: asyncio.Event, *, lifecycles: bool) -> int:
    """``rate`` random steps a second over the whole population, or (``lifecycles``) complete TrainJob
    lifecycles, eight interleaved at a time, at ``rate`` actions a second, until ``stop``; returns the
    actions taken. A random step moves one job one stage on (initializers, capacity, training...), so a
    short run finishes few jobs; lifecycles finish every job they create, with the controller's mix of
    outcomes."""
    if not lifecycles:
        return await gen.run(rate, stop)
    actions = 0
    while not stop.is_set():
        actions += await gen.run_lifecycles(8, concurrency=8, pause=1.0 / rate)
    return actions
