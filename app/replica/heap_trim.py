"""Give the heap that glibc keeps after a transient back to the kernel, now and then.

Why: the image sets ``MALLOC_TRIM_THRESHOLD_`` to 128 MB so that multi-MB scrape bodies are reused from
the heap instead of being page-faulted in on every scrape (app/metrics/exposition.py). The price is that a
transient peak (a relist after an expired watch, a take-over, a burst of events) leaves freed pages
resident: glibc's own trimming only returns the top of the heap, and only above that threshold. RSS then
rises in steps that never come down, although the live heap is flat (docs/reliability.md, "The 60-minute
run"). ``malloc_trim(0)`` also releases the free pages inside the heap.

Cost: the call walks the free lists with the arena locked: 0.6 ms on average and under 2.5 ms each on this
service's heap in the 60-minute soak, up to ~50 ms on a heavily fragmented 700 MB synthetic heap. It runs
in a worker thread (ctypes releases the GIL), so the event loop only waits if it needs malloc's lock
meanwhile. The next large scrape body is faulted in once more after a trim, which at one trim per interval
is negligible.

Once a minute by default: with one trim every 5 minutes, the 60-minute soak showed RSS drop ~5 MB at each
trim and climb back by as much before the next one (docs/reliability.md), while each trim took 0.7 ms.

And within a second of each complete list (``transients``: the informers' lists applied, the first sync
included): a list's pages are MB-sized bodies decoded one after another, and glibc serves the later ones
from the heap (its mmap threshold rises to the largest block freed), so the freed pages stay resident.
After the first sync of 20,000 pods they were 0.4-0.7 KB a pod (two runs of a throwaway script), a fifth
to a third of the RSS the pods added, until the next periodic trim.

Only a process that runs this one replica trims (``Service(owns_process=True)``); the interval is the
setting ``heap_trim_interval_seconds`` (0: never). Without glibc (``malloc_trim`` missing) it is off.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import time
from collections.abc import Callable

__all__ = ["HeapTrimmer", "load_malloc_trim"]

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")


def load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the process's own symbols, or None where the C library has none."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


def resident_bytes() -> int:
    """This process's RSS (``/proc/self/statm``), 0 where there is no /proc."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Calls ``trim(0)`` every ``interval`` seconds in a worker thread; ``observe`` gets each call's
    duration in seconds (the trainer_metrics_heap_trim_duration_seconds histogram)."""

    def __init__(
        self,
        interval: float,
        trim: Callable[[int], int],
        observe: Callable[[float], None],
        *,
        transients: Callable[[], int] = lambda: 0,
        poll: float = 1.0,
    ) -> None:
        """``transients``: a count that changes when a transient peak has ended (the informers' complete
        lists, ``InformerTelemetry.lists_applied``), looked at every ``poll`` seconds: a change trims
        then, without waiting for the interval."""
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if poll <= 0:
            raise ValueError("poll must be > 0")
        self.interval = interval
        self._trim = trim
        self._observe = observe
        self._transients = transients
        self._poll = poll
        self.returned_bytes = 0  # RSS given back, as far as RSS shows it

    def trim_once(self) -> float:
        """One trim, on the calling thread; returns its duration in seconds."""
        before = resident_bytes()
        started = time.perf_counter()
        self._trim(0)
        took = time.perf_counter() - started
        returned = max(0, before - resident_bytes())
        self.returned_bytes += returned
        log.debug("gave %.1f MB of freed heap back to the kernel in %.1f ms", returned / 2**20, took * 1000)
        return took

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        seen = self._transients()
        due = loop.time() + self.interval
        while True:
            await asyncio.sleep(min(self._poll, max(0.0, due - loop.time())))
            now = self._transients()
            if now == seen and loop.time() < due:
                continue
            seen = now
            took = await asyncio.to_thread(self.trim_once)
            self._observe(took)
            due = loop.time() + self.interval
