"""The memory of the soak's own process: RSS (raw and trimmed), and tracemalloc's bytes by part of it."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import tracemalloc
from pathlib import Path

from kubesim.trainer.cluster import SimulatedCluster


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trimmed_rss_bytes(sim: SimulatedCluster) -> int:
    """RSS with the simulated server's watch history compacted, after a full collection and glibc's
    ``malloc_trim(0)``, which returns free heap pages to the kernel. This is what the growth check uses;
    the raw RSS is reported next to it.

    The simulated server shares this process. Its history (up to ``history_window`` serialized events,
    ~7 KB each) is full or nearly empty depending on when the last compaction fault came, which moved
    the raw figure by up to ~25 MB either way at the two points. Without the trim, RSS keeps the
    high-water mark of every transient peak (relist pages, watch buffers), so a longer run ratchets up
    without any object being kept. The compaction (a fault like the soak's own) happens synchronously,
    before any replica can react; at the warm-up point they relist afterwards. It is not counted among
    the injected faults."""
    sim.store.compact()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


_REPO = Path(__file__).resolve().parents[3]
_APP, _SIM, _SIM_TRAINER, _TESTS = (
    f"{_REPO / d}{os.sep}" for d in ("app", "sim/kubesim", "sim/kubesim/trainer", "tests")
)
MEMORY_PARTS = ("service", "simulator", "generator/truth", "test bookkeeping", "libraries/interpreter")


def memory_part(filename: str) -> str:
    """The part of this process an allocation belongs to, by the file of the frame that made it: the
    service (``app/``), the simulated API server (``kubesim.apiserver``), the workload generator, the
    controller model and the truth (``kubesim.trainer``), the test's own bookkeeping (``tests/``), or no
    project frame at all (libraries, imports, and the event loop's socket callbacks, which read for the
    service's client and the simulated server alike)."""
    if filename.startswith(_SIM_TRAINER):
        return "generator/truth"
    if filename.startswith(_SIM):
        return "simulator"
    if filename.startswith(_APP):
        return "service"
    if filename.startswith(_TESTS):
        return "test bookkeeping"
    return "libraries/interpreter"


def traced_by_part() -> dict[str, int]:
    """tracemalloc's traced bytes by ``memory_part`` of each allocation's innermost frame (empty when not
    tracing). Reads the raw traces: ``take_snapshot()`` builds an object per allocation, ~10x slower here."""
    if not tracemalloc.is_tracing():
        return {}
    out = dict.fromkeys(MEMORY_PARTS, 0)
    parts: dict[int, str] = {}  # traceback tuples are shared between traces: classify each once
    for _domain, size, frames, *_ in tracemalloc._get_traces():  # type: ignore[attr-defined]
        part = parts.get(id(frames))
        if part is None:
            part = parts[id(frames)] = memory_part(frames[0][0]) if frames else "libraries/interpreter"
        out[part] += size
    return out


def service_traced_bytes() -> int:
    """Bytes traced by tracemalloc that the service's code allocated and that are still held."""
    return traced_by_part().get("service", 0)
