"""The README's shell blocks, and the exporter started as a README line starts it: what the README-as-written
tests (quick start, kubectl loop, cluster install) share."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.config import ENV_PREFIX
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
_SERVING = re.compile(r"serving https? on port (\d+)")


def section(title: str) -> str:
    """The text of the README's ``## <title>`` section."""
    return README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[str]:
    """A block's commands, their trailing ``  # comments`` cut, continuation lines joined."""
    joined = block.replace("\\\n", " ")
    lines = [line for line in joined.splitlines() if line.strip()]
    return [re.split(r"\s{2,}#\s", line, maxsplit=1)[0].strip() for line in lines]


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def exporter_as_written(argv: list[str], log_path: Path, *, timeout: float = 60.0) -> Iterator[Running]:
    """``trainer-metrics <args>`` as a README line gives them (``argv`` without the program), with free ports
    instead of the README's; stopped by SIGINT, as Ctrl-C stops it, then SIGKILL if it lingers."""
    args = list(argv)
    for flag in ("--port", "--probe-port"):
        if flag in args:
            args[args.index(flag) + 1] = "0"
        else:
            args += [flag, "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(VENV_BIN / "trainer-metrics"), *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def serving() -> int | None:
            assert proc.poll() is None, f"exited {proc.returncode}: {log_path.read_text()[-3000:]}"
            found = _SERVING.search(log_path.read_text(errors="replace"))
            return int(found[1]) if found else None

        port = wait_for(serving, timeout=timeout, what="the exporter's 'serving' line")
        yield Running(proc, log_path, port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(command: str, *, env: dict[str, str] | None = None, port: int | None = None) -> str:
    """One README command through bash from the repository root; ``port`` replaces the README's port in
    ``localhost:<port>``."""
    if port is not None:
        command = re.sub(r"localhost:\d+", f"localhost:{port}", command)
    out = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # grep finding nothing exits 1: the caller judges the output.
    assert out.returncode in (0, 1), f"{command}:\n{out.stdout}{out.stderr}"
    return out.stdout


def argv_of(line: str, program: str) -> list[str]:
    """The arguments of ``program`` in a README line such as ``... && .venv/bin/trainer-metrics --simulate``
    or ``trainer-metrics --kubeconfig ... &``."""
    words = shlex.split(line.removesuffix("&"))
    at = max(i for i, w in enumerate(words) if w.endswith(program))
    return [w for w in words[at + 1 :] if w != "&&"]
