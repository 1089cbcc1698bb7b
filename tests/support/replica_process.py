"""One replica of the service in a process of its own: the process runner.

``python -m tests.support.replica_process [--nofile N] [--listen-fd N] [--ready-line] [--lag-probe]
[--memory] [--tap-fd M]`` runs ``app.cli.main``, the CLI itself: its settings are the ``TRAINER_METRICS_*``
variables of its environment (as the chart's Deployment passes them; ``environment`` writes them from the
in-process runner's options, the ``Settings`` fields), preflight, logging, TLS, ``--simulate``, the product's
``HttpServer`` and its SIGTERM hand-over included. The options change only what surrounds it:

* ``--nofile N``: the process lowers its own file limit (soft and hard, so it cannot raise it again) first;
* ``--listen-fd N``: the main listener is the inherited descriptor N (a slot's socket, bound by the parent
  and held for its whole run, tests/support/slots.py) instead of the one the server binds;
* ``--ready-line``: once both listeners are bound, one JSON line on stdout,
  ``{"ready": true, "port": P, "probe_port": Q|null, "import_seconds": S}``;
* ``--lag-probe``, ``--memory``, ``--tap-fd M``: the benchmarks' and the chaos soak's instrumentation
  (tests/support/replica_instruments.py).

``running`` starts one from a synchronous test, waits until it is ready, and sends it SIGTERM on leaving.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.config import ENV_PREFIX
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.support.replica_process"

# The exporter alone on 127.0.0.1 (ports the kernel picks) with its embedded simulated cluster, a small
# seeded workload, no election.
SIMULATED_ALONE: dict[str, Any] = {
    "simulate": True,
    "host": "127.0.0.1",
    "port": 0,
    "probe_port": 0,
    "sim_jobs": 20,
    "sim_rate": 2,
    "sim_seed": 7,
    "leader_election": False,
}


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""  # an optional setting left unset (probe_port: off)
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def environment(
    settings: Mapping[str, Any], *, extra: Mapping[str, str] = {}, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (this process's environment) without its ``TRAINER_METRICS_*``, then ``settings`` (Settings
    fields, or the CLI's ``sim_*``) as their variables, then ``extra`` (a value of "" unsets)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(ENV_PREFIX)}
    env.update({ENV_PREFIX + name.upper(): _env_value(value) for name, value in settings.items()})
    env.update(extra)
    return {k: v for k, v in env.items() if not (k in extra and v == "")}


def image_malloc_env() -> dict[str, str]:
    """The glibc malloc settings the image runs the service with (the Dockerfile's ``MALLOC_*`` ENV): they
    decide how much freed heap a process keeps, so its RSS, as in production."""
    with contextlib.suppress(OSError):
        text = (REPO / "Dockerfile").read_text()
        return dict(re.findall(r"\b(MALLOC_[A-Z_]+)=(\d+)", text))
    return {}


def command(
    *,
    python: str = sys.executable,
    nofile: int | None = None,
    listen_fd: int | None = None,
    ready_line: bool = False,
    lag_probe: bool = False,
    memory: bool = False,
    tap_fd: int | None = None,
) -> list[str]:
    """The argv of a replica process with these options (its settings go in its environment)."""
    argv = [python, "-m", MODULE]
    if nofile:
        argv += ["--nofile", str(nofile)]
    if listen_fd is not None:
        argv += ["--listen-fd", str(listen_fd)]
    if tap_fd is not None:
        argv += ["--tap-fd", str(tap_fd)]
    argv += [flag for flag, on in (("--ready-line", ready_line), ("--lag-probe", lag_probe)) if on]
    argv += ["--memory"] if memory else []
    return argv


@dataclass
class ReplicaProcess:
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


def ready_info(text: str) -> dict[str, Any] | None:
    """The ready line's fields, if ``text`` (a process's output) has it."""
    for line in text.splitlines():
        if line.startswith('{"ready"'):
            with contextlib.suppress(ValueError):
                info: dict[str, Any] = json.loads(line)
                return info
    return None


@contextlib.contextmanager
def running(
    log_path: Path,
    settings: Mapping[str, Any],
    *,
    nofile: int | None = None,
    timeout: float = 30.0,
    memory: bool = False,
    extra: Mapping[str, str] = {},
) -> Iterator[ReplicaProcess]:
    """Start a replica process (its output to ``log_path``), wait until its ``/readyz`` answers 200 (on the
    probe port if it has one), and on leaving stop it with SIGTERM (SIGKILL after 15 s). ``memory``: with
    ``--memory``; ``extra``: further environment variables (``environment``)."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command(nofile=nofile, ready_line=True, memory=memory),
            env=environment(settings, extra=extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:

        def ready() -> dict[str, Any] | None:
            assert proc.poll() is None, f"replica exited {proc.returncode}: {log_path.read_text()[-2000:]}"
            return ready_info(log_path.read_text(errors="replace"))

        info = wait_for(ready, timeout=timeout, what="the replica's ready line")
        rp = ReplicaProcess(proc, log_path, int(info["port"]), info["probe_port"])
        ready_url = (rp.probe_url if rp.probe_port is not None else rp.url) + "/readyz"
        wait_for(
            lambda: httpx.get(ready_url, timeout=2).status_code == 200,
            timeout=timeout,
            what="/readyz 200",
            ignoring=(httpx.HTTPError,),
        )
        yield rp
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- the child ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    t0 = time.monotonic()
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    p.add_argument("--nofile", type=int, default=0)
    p.add_argument("--listen-fd", type=int, default=None)
    p.add_argument("--ready-line", action="store_true")
    p.add_argument("--lag-probe", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--tap-fd", type=int, default=None)
    args = p.parse_args(argv)
    if args.nofile:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    from fastapi import FastAPI

    from app import cli
    from app.serving.listeners import GuardedListener
    from app.serving.server import HttpServer
    from tests.support import replica_instruments as instruments

    def before_serving(app: FastAPI, server: HttpServer) -> None:
        if args.listen_fd is not None:
            spare = server.main_socket
            listener = GuardedListener(socket.AF_INET, socket.SOCK_STREAM, 0, args.listen_fd)
            listener.setup(server.main_guard)
            server.main_socket = listener
            spare.close()
        if args.lag_probe:
            instruments.add_lag_probe(app)
        if args.memory:
            instruments.add_memory_route(app)
        if args.tap_fd is not None:
            instruments.install_soak_tap(args.tap_fd)
        if args.ready_line:
            ready = {
                "ready": True,
                "port": server.port,
                "probe_port": server.probe_port,
                "import_seconds": time.monotonic() - t0,
            }
            sys.stdout.write(json.dumps(ready) + "\n")
            sys.stdout.flush()

    return cli.main([], before_serving=before_serving)


if __name__ == "__main__":
    sys.exit(main())
