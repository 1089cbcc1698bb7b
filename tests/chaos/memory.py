"""Memory of each trainer-metrics process in the chaos soak, measured in that process, not in the soak's.

The soak (tests/chaos/soak/, process mode) reads, for every replica process:

* its RSS (``VmRSS``, and ``RssAnon``: the heap, without the mapped files) from ``/proc/<pid>/status``
  every ``interval`` seconds;
* the sizes of what it remembers besides its informer caches (``/debug/snapshot``: ``remembered``, the
  terminal-dedup set, the informers' objects) every ``structures_every`` readings;
* with them, its allocator's figures (``GET /soak/memory``, tests/support/replica_instruments.py): glibc's
  heap, the part of it in use, and Python's allocated blocks, i.e. its live memory, apart from the free heap
  glibc keeps after a transient peak (the image's ``MALLOC_TRIM_THRESHOLD_`` keeps up to 128 MB of it);
* at the end, after the last raw readings, the same after a full collection and ``malloc_trim(0)``
  (``?trim=1``): what RSS would be without that free heap.

``summary`` turns one process's readings into the report: RSS at the warm-up point and at the end, its
growth, its peak, when its bounded structures were full (the tombstones at their cap, 4096), and the
least-squares slope of RSS (MB per minute) over the last ``window`` seconds,
counted only from the time they were full, and the slopes of the live memory over the same window.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

MB = 2**20
TOMBSTONES_MAX = 4096  # app/trainer/history.py EdgeHistory(max_tombstones), as the service builds it


def proc_status(pid: int) -> dict[str, int] | None:
    """VmRSS, RssAnon, RssFile and VmHWM of a process, in bytes; None once it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return out or None


def structures(snapshot: dict[str, Any]) -> dict[str, int]:
    """What ``/debug/snapshot`` says of a replica's bounded structures, flat."""
    out = {k: int(v) for k, v in snapshot.get("remembered", {}).items()}
    out["terminal_entries"] = int(snapshot.get("terminal_entries", 0))
    out["cached_objects"] = sum(int(i.get("objects", 0)) for i in snapshot.get("informers", []))
    return out


def full(sizes: dict[str, int]) -> bool:
    """The structures that fill over time are at their caps: the tombstones. The others follow the live
    TrainJobs, or the hand-over lag: the journal forgets what the Lease's watermark has passed
    (app/handover/journal.py, "Memory"), so it is at its size only while nothing is published."""
    return sizes.get("tombstones", 0) >= TOMBSTONES_MAX


def heap_trims(exposition: str) -> dict[str, float]:
    """The service's own periodic trims (app/replica/heap_trim.py) from its ``/metrics``: how many, their
    mean, and the bucket bound under which the longest fell (seconds)."""
    out: dict[str, float] = {"count": 0.0, "sum": 0.0, "max_le": 0.0}
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(exposition):
        if family.name != "trainer_metrics_heap_trim_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count"):
                out["count"] = sample.value
            elif sample.name.endswith("_sum"):
                out["sum"] = sample.value
            elif sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
    out["max_le"] = next((le for le, n in sorted(buckets) if n >= out["count"]), 0.0) if out["count"] else 0.0
    return out


def slope_mb_per_minute(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of (seconds, bytes) points, in MB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_b = sum(b for _, b in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return None
    cov = sum((t - mean_t) * (b - mean_b) for t, b in points)
    return cov / var * 60 / MB


@dataclass
class ProcessMemory:
    """The readings of one replica process (times in soak seconds)."""

    identity: str
    slot: int
    pid: int
    resident: bool
    started: float
    stopped: float | None = None
    rss: list[tuple[float, int]] = field(default_factory=list)
    anon: list[tuple[float, int]] = field(default_factory=list)
    sizes: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    readings: dict[str, dict[str, Any]] = field(default_factory=dict)  # "end": /soak/memory?trim=1
    # (t, /soak/memory without trim): glibc's heap in use and Python's allocated blocks, the live memory
    allocs: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    full_at: float | None = None

    def sample(self, t: float) -> bool:
        """Read /proc now; False once the process is gone."""
        status = proc_status(self.pid)
        if status is None:
            return False
        self.rss.append((t, status.get("VmRSS", 0)))
        self.anon.append((t, status.get("RssAnon", 0)))
        return True

    def structures_read(self, t: float, sizes: dict[str, int]) -> None:
        self.sizes.append((t, sizes))
        if self.full_at is None and full(sizes):
            self.full_at = t

    def summary(self, warm_at: float, window: float) -> dict[str, Any]:
        end = self.stopped if self.stopped is not None else (self.rss[-1][0] if self.rss else self.started)
        warm = next(((t, b) for t, b in self.rss if t >= warm_at), None)
        last = self.rss[-1] if self.rss else None
        out: dict[str, Any] = {
            "identity": self.identity,
            "slot": self.slot,
            "pid": self.pid,
            "resident": self.resident,
            "started_s": round(self.started, 1),
            "stopped_s": None if self.stopped is None else round(self.stopped, 1),
            "life_s": round(end - self.started, 1),
            "readings": len(self.rss),
            "rss_first_mb": round(self.rss[0][1] / MB, 1) if self.rss else None,
            "rss_warm_mb": round(warm[1] / MB, 1) if warm else None,
            "rss_end_mb": round(last[1] / MB, 1) if last else None,
            "rss_peak_mb": round(max(b for _, b in self.rss) / MB, 1) if self.rss else None,
            "rss_growth": round((last[1] - warm[1]) / warm[1], 4)
            if warm and last and warm[0] < last[0]
            else None,
            "full_at_s": None if self.full_at is None else round(self.full_at, 1),
        }
        if self.sizes:
            out["structures_first"] = self.sizes[0][1]
            out["structures_end"] = self.sizes[-1][1]
        trims = self.readings.get("heap_trims")
        if trims:
            out["heap_trims"] = int(trims["count"])
            out["heap_trim_mean_ms"] = (
                round(trims["sum"] / trims["count"] * 1000, 2) if trims["count"] else None
            )
            out["heap_trim_max_le_ms"] = round(trims["max_le"] * 1000, 1)
        reading = self.readings.get("end")
        if reading:
            out["trimmed_end_mb"] = round(reading.get("VmRSS", 0) / MB, 1)
        start = end - window
        if self.full_at is not None:
            start = max(start, self.full_at)
        points = [(t, b) for t, b in self.rss if t >= start]
        out["slope_window_s"] = round(end - start, 1) if points else 0.0
        out["slope_from_full"] = self.full_at is not None and self.full_at <= start
        slope = slope_mb_per_minute(points)
        out["rss_slope_mb_per_min"] = None if slope is None else round(slope, 4)
        anon_slope = slope_mb_per_minute([(t, b) for t, b in self.anon if t >= start])
        out["anon_slope_mb_per_min"] = None if anon_slope is None else round(anon_slope, 4)
        # The live memory over the same window: glibc's heap in use (objects above 512 bytes, C buffers) and
        # Python's allocated blocks (smaller objects; a count, per minute).
        allocs = [(t, a) for t, a in self.allocs if t >= start]
        if allocs:
            first, last_alloc = allocs[0][1], allocs[-1][1]
            out["heap_mb_first_end"] = [
                round(first.get("heap", 0) / MB, 1),
                round(last_alloc.get("heap", 0) / MB, 1),
            ]
            out["heap_in_use_mb_first_end"] = [
                round(first.get("heap_in_use", 0) / MB, 1),
                round(last_alloc.get("heap_in_use", 0) / MB, 1),
            ]
            in_use = slope_mb_per_minute([(t, a.get("heap_in_use", 0)) for t, a in allocs])
            out["heap_in_use_slope_mb_per_min"] = None if in_use is None else round(in_use, 4)
            blocks = slope_mb_per_minute([(t, a.get("python_blocks", 0)) for t, a in allocs])
            out["python_blocks_per_min"] = None if blocks is None else round(blocks * MB)
            out["python_blocks_first_end"] = [first.get("python_blocks"), last_alloc.get("python_blocks")]

            def outside_heap(a: dict[str, int]) -> float:
                # Anonymous memory that is not glibc's: pymalloc's arenas (Python objects up to 512 bytes),
                # thread stacks, the interpreter's own mappings.
                return round((a.get("RssAnon", 0) - a.get("heap", 0) - a.get("mmapped", 0)) / MB, 1)

            out["anon_outside_heap_mb_first_end"] = [outside_heap(first), outside_heap(last_alloc)]
        if len(self.rss) > 1:
            # Every 10th reading, for the JSON report and the table.
            out["rss_mb_series"] = [(round(t), round(b / MB, 1)) for t, b in self.rss[::10]]
        return out


def plot(
    processes: list[ProcessMemory],
    ratios: list[tuple[float, float | None, float | None]],
    directory: Path,
    title: str,
) -> list[Path]:
    """Two PNGs: each service process's RSS over time (residents in bold), and counted / truth and
    PromQL-visible / truth (created TrainJobs, cumulative since the start of the faults) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for proc in processes:
        if not proc.rss:
            continue
        ts = [t / 60 for t, _ in proc.rss]
        mb = [b / MB for _, b in proc.rss]
        label = f"{proc.identity} (slot {proc.slot}{', resident' if proc.resident else ''})"
        ax.plot(ts, mb, linewidth=2.0 if proc.resident else 0.8, label=label if proc.resident else None)
        if proc.full_at is not None and proc.resident:
            ax.axvline(proc.full_at / 60, linestyle=":", linewidth=0.8, color="grey")
    ax.set_xlabel("minutes since the soak started")
    ax.set_ylabel("RSS (MB)")
    ax.set_title(f"{title}: RSS of each trainer-metrics process (dotted: its bounded structures full)")
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    path = directory / "rss.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(11, 4.5))
    counted = [(t / 60, r) for t, r, _ in ratios if r is not None]
    visible = [(t / 60, v) for t, _, v in ratios if v is not None]
    if counted:
        ax.plot(*zip(*counted, strict=True), label="counted by the leaders / truth")
    if visible:
        ax.plot(*zip(*visible, strict=True), label="PromQL-visible / truth")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xlabel("minutes since the soak started")
    ax.set_ylabel("created TrainJobs, cumulative")
    ax.set_title(f"{title}: counted vs truth")
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    path = directory / "counted-vs-truth.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(path)
    with contextlib.suppress(Exception):
        plt.close("all")
    return written
