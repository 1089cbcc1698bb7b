"""The real exporter (``python -m app.cli --simulate``) in a subprocess, for tests that must change what
the process is allowed (a lowered file limit) or that attack it hard: the pytest process stays untouched."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.config import ENV_PREFIX
from tests.support.waiting import wait_for

_SERVING = re.compile(r"serving https? on port (\d+)(?:, probes \(http\) on port (\d+))?")


@dataclass
class Exporter:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int
    probe_port: int | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def probe_url(self) -> str:
        assert self.probe_port is not None
        return f"http://127.0.0.1:{self.probe_port}"

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


# The child lowers its own file limit (soft and hard, so it cannot raise it again), then runs the CLI.
_LAUNCH = (
    "import resource, runpy, sys\n"
    "n = int(sys.argv.pop(1))\n"
    "if n:\n"
    "    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))\n"
    "runpy.run_module('app.cli', run_name='__main__')\n"
)


@contextlib.contextmanager
def exporter(
    tmp_path: Path, *, settings: Mapping[str, str] = {}, nofile: int | None = None, timeout: float = 30.0
) -> Iterator[Exporter]:
    """Start the exporter on 127.0.0.1 (free ports, embedded simulated cluster) and wait until ready."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(
        {
            f"{ENV_PREFIX}SIMULATE": "true",
            f"{ENV_PREFIX}HOST": "127.0.0.1",
            f"{ENV_PREFIX}PORT": "0",
            f"{ENV_PREFIX}PROBE_PORT": "0",
            f"{ENV_PREFIX}SIM_JOBS": "20",
            f"{ENV_PREFIX}SIM_RATE": "2",
            f"{ENV_PREFIX}SIM_SEED": "7",
            f"{ENV_PREFIX}LEADER_ELECTION": "false",
        }
    )
    env.update({ENV_PREFIX + k.upper(): v for k, v in settings.items()})
    log_path = tmp_path / "exporter.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(nofile or 0)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def serving() -> tuple[int, int | None] | None:
            assert proc.poll() is None, f"exporter exited {proc.returncode}: {log_path.read_text()[-2000:]}"
            found = _SERVING.search(log_path.read_text(errors="replace"))
            if found is None:
                return None
            return int(found[1]), int(found[2]) if found[2] else None

        port, probe_port = wait_for(serving, timeout=timeout, what="the exporter's 'serving' line")
        ex = Exporter(proc, log_path, port, probe_port)
        ready_url = (ex.probe_url if probe_port is not None else ex.url) + "/readyz"
        wait_for(
            lambda: httpx.get(ready_url, timeout=2).status_code == 200,
            timeout=timeout,
            what="/readyz 200",
            ignoring=(httpx.HTTPError,),
        )
        yield ex
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
