"""Bytes a piece of work leaves allocated, by tracemalloc (the per-object memory tests)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def traced_growth(work: Callable[[], object]) -> int:
    """Bytes traced after ``work()`` minus before it, each after a full collection: what the objects ``work``
    stores into structures that outlive it cost (whatever it returns is dropped first)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
