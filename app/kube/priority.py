"""LoopPriority: latency-sensitive work (answering a scrape) runs ahead of bulk work (ingesting a watch)
on the one event loop.

Under a watch firehose the reflector yields every millisecond or so, but with ``sleep(0)`` it is ready
again at once: a scrape that needs the loop several times (its handler, the gzip thread's hand-back, the
write) waits a slice behind ingestion each time, and a worker thread waits up to the interpreter's switch
interval (5 ms) for the GIL, which the busy loop never releases on its own. While some ``urgent()`` section
is open, the reflector's yield instead waits for it to close (the loop is idle meanwhile, so the thread
gets the GIL at once), for at most ``max_wait`` per yield: ingestion keeps at least a slice per
``max_wait``, whatever a flood of requests does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

__all__ = ["LoopPriority"]


class LoopPriority:
    """Owned by one event loop; everything runs on it."""

    def __init__(self, *, max_wait: float = 0.005) -> None:
        self.max_wait = max_wait
        self._open = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.deferred = 0  # yields that waited for an urgent section (tests, debugging)

    @property
    def urgent_open(self) -> int:
        return self._open

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """Bulk work defers to the code inside (up to ``max_wait`` per yield) until it leaves."""
        self._open += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._open -= 1
            if not self._open:
                self._idle.set()

    async def yield_to_urgent(self) -> None:
        """Bulk work's yield point: ``sleep(0)``, or while an urgent section is open, wait for it."""
        if not self._open:
            await asyncio.sleep(0)
            return
        self.deferred += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_wait):
                await self._idle.wait()
