"""LoopPriority (app/kube/priority.py): while a scrape is being answered, watch ingestion's yields wait for
it (bounded), so the scrape is not interleaved with ingestion slices and its worker thread gets the GIL; and
once a request head has arrived, ingestion yields at its next line so that the request's task runs first."""

from __future__ import annotations

import asyncio
import time

from app.kube.priority import LoopPriority, call_after_due_timers, request_arrived
from tests.support.informer_fakes import Recorder, Thing, obj, running
from tests.support.informer_rig import Rig, line


async def test_without_urgent_work_a_yield_is_one_loop_turn() -> None:
    priority = LoopPriority(max_wait=10.0)
    await asyncio.wait_for(priority.yield_to_urgent(), 1.0)
    assert priority.deferred == 0


async def test_a_timer_due_during_a_slice_runs_before_the_next_slice() -> None:
    """asyncio runs what ``call_soon`` queued before it moves due timers to the ready queue: a ``sleep(0)``
    yield would run the next slice ahead of a timer that fell due during the last one (a Lease renewal, a
    probe's deadline waited two slices, bench P5). The yield resumes behind the due timers instead."""
    loop = asyncio.get_running_loop()
    priority = LoopPriority()
    order: list[str] = []

    async def bulk() -> None:
        for n in range(3):
            order.append(f"slice {n}")
            if n == 0:
                loop.call_at(loop.time() - 1.0, order.append, "timer")  # fell due during this slice
            await priority.yield_to_urgent()

    await asyncio.wait_for(bulk(), 1.0)
    assert order == ["slice 0", "timer", "slice 1", "slice 2"]


async def test_work_deferred_after_due_timers_runs_behind_them_as_a_step_of_its_own() -> None:
    loop = asyncio.get_running_loop()
    order: list[str] = []
    done = asyncio.Event()
    loop.call_at(loop.time() - 1.0, order.append, "timer")
    call_after_due_timers(lambda: (order.append("deferred"), done.set()))
    loop.call_soon(order.append, "soon")
    await asyncio.wait_for(done.wait(), 1.0)
    assert order == ["soon", "timer", "deferred"]


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


def test_wanted_follows_nudges_and_open_sections() -> None:
    priority = LoopPriority()
    assert not priority.wanted
    priority.nudge()
    assert priority.wanted
    with priority.urgent():
        assert priority.wanted
    assert priority.wanted  # the nudge is still pending: bulk work has not yielded since
    with priority.urgent():
        pass
    asyncio.run(priority.yield_to_urgent())  # the yield takes the nudge
    assert not priority.wanted


def test_a_request_head_nudges_every_live_priority() -> None:
    first, second = LoopPriority(), LoopPriority()
    request_arrived()
    assert first.wanted and second.wanted


class _Requesting(Recorder):
    """On one object, does what the HTTP protocol does when a request head arrives: queues the request's
    task and nudges ingestion. The task records how many objects had been applied when it first ran."""

    def __init__(self, on_key: str) -> None:
        super().__init__()
        self.on_key = on_key
        self.applied_when_served: list[int] = []

    def on_added(self, obj: Thing, initial: bool) -> None:
        super().on_added(obj, initial)
        if obj.key == self.on_key:

            async def request() -> None:
                self.applied_when_served.append(len(self.calls))

            asyncio.get_running_loop().create_task(request())
            request_arrived()


async def test_ingestion_lets_an_arrived_request_run_after_the_line_it_is_on() -> None:
    # A clock that never moves: only the line budget (64) or a nudge can end the reflector's slice, so the
    # request would otherwise run after all 60 lines of the chunk.
    recorder = _Requesting("ns/j9")
    rig = Rig(priority=LoopPriority(), clock=lambda: 0.0, recorder=recorder)
    async with running(rig.informer):
        await rig.start()
        await rig.lines(*(line("ADDED", obj(f"j{i}", 10 + i)) for i in range(60)), one_chunk=True)
    assert len(recorder.calls) == 60
    assert recorder.applied_when_served == [10]
