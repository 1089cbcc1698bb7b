"""Shared helpers: statistics, self-announcing child processes, /proc readings, HTTP over loopback."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Figure:
    """One measured quantity over several runs."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def min(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def max(self) -> float:
        return max(self.values) if self.values else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "max": self.max, "runs": self.values}


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# P5's stall histogram: 33 log-spaced buckets from 0.05 ms to 100 ms (~10 per decade, each edge x1.26), plus
# one below (a 1 ms sleep that woke on time) and one at or above (a stall no target tolerates).
STALL_EDGES_MS: tuple[float, ...] = tuple(round(0.05 * 2000 ** (i / 33), 4) for i in range(34))


def log_histogram(samples_s: Sequence[float], edges_ms: Sequence[float] = STALL_EDGES_MS) -> list[int]:
    """Counts of ``samples_s`` (seconds) per bucket of ``edges_ms``: ``len(edges_ms) + 1`` counts, the first
    below ``edges_ms[0]``, the i-th in ``[edges_ms[i-1], edges_ms[i])``, the last at or above
    ``edges_ms[-1]``. A few dozen integers stand for thousands of samples in benchmarks.json."""
    counts = [0] * (len(edges_ms) + 1)
    for sample in samples_s:
        counts[bisect.bisect_right(edges_ms, sample * 1000.0)] += 1
    return counts


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on: its socket descriptors' inodes, looked up among the
    listening sockets of /proc/<pid>/net/tcp and tcp6. A child told to listen on port 0 holds the port
    the kernel picked, so nothing else can be reached under it (a port taken from a closed ``bind(0)``
    and bound again later can be given to two servers)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="utf-8") as handle:
        first = handle.readline().split()
        mem = f"{int(first[1]) // 1024} MiB"
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }


# --- /proc readings ---------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def runqueue_wait_seconds(pid: int) -> float:
    """Time the process's main thread spent runnable but waiting for a CPU (/proc/<pid>/schedstat, 2nd
    field, ns): the stalls the host's scheduler imposes, which no code in the process can avoid."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as handle:
        return int(handle.read().split()[1]) / 1e9


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * PAGE_SIZE


def peak_rss_bytes(pid: int) -> int:
    """The process's high-water RSS (VmHWM): what a sync needed at its peak, not what it kept."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# --- child processes ----------------------------------------------------------------------------------------


class Child:
    """A child process that prints one JSON line ``{"ready": ...}`` on stdout when it is ready."""

    def __init__(
        self, args: list[str], *, name: str, log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Block until the child's ready line (or fail with the tail of its log)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        buffer = b""
        while time.monotonic() < deadline:
            chunk = self.proc.stdout.read()
            if chunk:
                buffer += chunk
                for line in buffer.split(b"\n"):
                    if line.startswith(b"{"):
                        with contextlib.suppress(ValueError):
                            msg = json.loads(line)
                            if "ready" in msg:
                                self.info = dict(msg)
                                return self.info
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{self.name} did not become ready (exit {self.proc.returncode}):\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(Exception):
            self._log.close()


@contextlib.contextmanager
def running(child: Child, timeout: float) -> Iterator[Child]:
    try:
        child.wait_ready(timeout)
        yield child
    finally:
        child.stop()


# --- HTTP ---------------------------------------------------------------------------------------------------


async def wait_http(url: str, timeout: float, *, interval: float = 0.01) -> float:
    """Poll ``url`` until it answers 200; returns time.monotonic() of that answer."""
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as resp:
                    await resp.read()
                    if resp.status == 200:
                        return time.monotonic()
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(interval)
    raise TimeoutError(f"{url} not 200 within {timeout}s")
