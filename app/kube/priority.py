"""LoopPriority: latency-sensitive work (answering a request) runs ahead of bulk work (ingesting a watch)
on the one event loop.

Under a watch firehose the reflector yields every millisecond or so, but it is ready again at once: a
request that needs the loop several times (its task's first step, its handler, the gzip thread's hand-back,
the write) waits a slice behind ingestion each time, and a worker thread waits up to the interpreter's
switch interval (5 ms) for the GIL, which the busy loop never releases on its own.

A plain yield (``sleep(0)``) would also queue ingestion's next slice ahead of the timers that fell due
during the last one: asyncio runs what ``call_soon`` queued before it moves due timers to the ready queue,
so a timer (a Lease renewal, a probe's deadline) waited for two slices, not one. Bulk work therefore
resumes through a zero-delay timer (``after_due_timers``), behind every timer due before it.

Two signals make bulk work step aside, both checked by the reflector before every line (``wanted``):

* ``nudge()``: the HTTP protocol parsed a request head (``request_arrived``, app/serving/protocol.py).
  The request's task is queued on the loop already; the reflector's next yield is a plain one, so that
  task runs first, without waiting for the rest of the slice;
* ``urgent()``: a section (a scrape's render) is open. The reflector's yield then waits for it to close
  (the loop is idle meanwhile, so a worker thread gets the GIL at once), for at most ``max_wait`` per
  yield: ingestion keeps at least a slice per ``max_wait``, whatever a flood of requests does.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterator

__all__ = ["LoopPriority", "after_due_timers", "call_after_due_timers", "request_arrived"]

# Every live LoopPriority: the HTTP protocol cannot know which replica's ingestion shares its loop (tests
# run several in one loop), and a nudge costs a priority with no ingestion running nothing.
_PRIORITIES: weakref.WeakSet[LoopPriority] = weakref.WeakSet()


def call_after_due_timers(callback: Callable[[], object]) -> None:
    """Run ``callback`` in the running loop's next turn, behind the timers due by then (a zero-delay
    timer: ``call_soon`` would run it ahead of them). Bulk work split off a slice (a metrics publish) goes
    this way, so that it never adds to the slice a due timer is already waiting for."""
    asyncio.get_running_loop().call_later(0, callback)


async def after_due_timers() -> None:
    """Yield the loop until the timers due now have run (see the module docstring)."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    loop.call_later(0, _release, waiter)
    await waiter


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled meanwhile
        waiter.set_result(None)


def request_arrived() -> None:
    """An HTTP request head was parsed: bulk work yields at its next line (``LoopPriority.nudge``)."""
    for priority in _PRIORITIES:
        priority.nudge()


class LoopPriority:
    """Owned by one event loop; everything runs on it (``request_arrived`` too: the protocol runs there)."""

    def __init__(self, *, max_wait: float = 0.005) -> None:
        self.max_wait = max_wait
        self._open = 0
        self._nudged = False
        # True while an urgent section is open or a nudge is pending: bulk work's per-line check.
        self.wanted = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.deferred = 0  # yields that waited for an urgent section (tests, debugging)
        _PRIORITIES.add(self)

    @property
    def urgent_open(self) -> int:
        return self._open

    def nudge(self) -> None:
        """Bulk work yields once at its next line, so that work queued on the loop runs first."""
        self._nudged = True
        self.wanted = True

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """Bulk work defers to the code inside (up to ``max_wait`` per yield) until it leaves."""
        self._open += 1
        self.wanted = True
        self._idle.clear()
        try:
            yield
        finally:
            self._open -= 1
            if not self._open:
                self._idle.set()
                self.wanted = self._nudged

    async def yield_to_urgent(self) -> None:
        """Bulk work's yield point: ``after_due_timers``, or while an urgent section is open, wait for it."""
        if self._nudged:
            self._nudged = False
            self.wanted = self._open > 0
        if not self._open:
            await after_due_timers()
            return
        self.deferred += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_wait):
                await self._idle.wait()
