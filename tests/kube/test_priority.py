"""LoopPriority (app/kube/priority.py): while a scrape is being answered, watch ingestion's yields wait for
it (bounded), so the scrape is not interleaved with ingestion slices and its worker thread gets the GIL."""

from __future__ import annotations

import asyncio
import time

from app.kube.priority import LoopPriority


async def test_without_urgent_work_a_yield_is_one_loop_turn() -> None:
    priority = LoopPriority(max_wait=10.0)
    await asyncio.wait_for(priority.yield_to_urgent(), 1.0)
    assert priority.deferred == 0


async def test_a_yield_waits_for_the_urgent_section_to_close() -> None:
    priority = LoopPriority(max_wait=10.0)
    with priority.urgent():
        waiting = asyncio.create_task(priority.yield_to_urgent())
        for _ in range(20):  # many loop turns: still waiting, however fast the machine
            await asyncio.sleep(0)
        assert not waiting.done()
        assert priority.urgent_open == 1
    await asyncio.wait_for(waiting, 1.0)
    assert priority.deferred == 1 and priority.urgent_open == 0


async def test_nested_sections_release_the_yield_only_when_the_last_closes() -> None:
    priority = LoopPriority(max_wait=10.0)
    with priority.urgent():
        with priority.urgent():
            waiting = asyncio.create_task(priority.yield_to_urgent())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done()
    await asyncio.wait_for(waiting, 1.0)


async def test_a_section_that_never_closes_delays_each_yield_by_max_wait_only() -> None:
    priority = LoopPriority(max_wait=0.05)
    with priority.urgent():
        started = time.monotonic()
        await asyncio.wait_for(priority.yield_to_urgent(), 5.0)  # the bound, not the 5 s guard, ends it
        assert time.monotonic() - started >= 0.04  # the loop may run a timer up to its clock resolution early
