"""The lock files and the registry-free image build: the locks pin, with hashes, versions inside
pyproject.toml's ranges; CI, the Dockerfile and image/build.py install from them; the image built from
Debian packages runs like the Dockerfile's (user, port, environment, entrypoint). The build itself, and the
start of the image, run in `.ci/run` (image/image-check.sh), not here: they need root and a few minutes."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from image import build
from image.build import Locked, closure, normalise, parse_lock

from .chart import ROOT, stages

PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUNTIME = parse_lock(ROOT / "requirements.lock")
TEST = parse_lock(ROOT / "requirements-test.lock")
# The environments the locks must serve: CI and the image (Linux, CPython 3.11).
LINUX_311 = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11", "extra": ""}


def requirements(names: list[str]) -> list[Requirement]:
    return [Requirement(r) for r in names]


def applies(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**LINUX_311, "extra": extra})


def check_pinned_within_range(lock: dict[str, Locked], reqs: list[Requirement], lock_name: str) -> None:
    for req in reqs:
        name = normalise(req.name)
        assert name in lock, f"{lock_name} lacks {req}: run `bash image/lock.sh`"
        version = lock[name].version
        assert req.specifier.contains(version, prereleases=True), (
            f"{lock_name} pins {name}=={version}, outside pyproject.toml's {req}: run `bash image/lock.sh`"
        )


def test_runtime_lock_covers_the_dependencies_within_their_ranges() -> None:
    deps = requirements(PYPROJECT["project"]["dependencies"])
    check_pinned_within_range(RUNTIME, deps, "requirements.lock")
    # ... and holds nothing that the runtime does not need (no test tool sneaks into the image).
    needed = {e.name for e in closure(RUNTIME, {normalise(r.name) for r in deps})}
    assert needed == set(RUNTIME), f"not needed at run time: {sorted(set(RUNTIME) - needed)}"


def test_test_lock_covers_the_test_extra_and_the_build_backend() -> None:
    test_extra = requirements(PYPROJECT["project"]["optional-dependencies"]["test"])
    backend = requirements(PYPROJECT["build-system"]["requires"])
    runtime = requirements(PYPROJECT["project"]["dependencies"])
    check_pinned_within_range(TEST, test_extra + backend + runtime, "requirements-test.lock")


def test_both_locks_pin_the_same_runtime_versions() -> None:
    # The image (requirements.lock) and CI's tests (requirements-test.lock) run the same code.
    differ = {n: (e.version, TEST[n].version) for n, e in RUNTIME.items() if TEST[n].version != e.version}
    assert not differ, f"(requirements.lock, requirements-test.lock) differ: {differ}"


@pytest.mark.parametrize("lock_name", ["requirements.lock", "requirements-test.lock"])
def test_every_locked_file_has_a_hash_and_an_exact_version(lock_name: str) -> None:
    lock = parse_lock(ROOT / lock_name)
    assert len(lock) >= 20
    for entry in lock.values():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", entry.version), entry.requirement
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry.requirement), f"{entry.name} has no hash"
        spec = entry.requirement.split("--hash", 1)[0]
        if ";" in spec:  # a universal lock keeps markers (colorama on Windows); they must parse
            Marker(spec.split(";", 1)[1].strip())
    text = (ROOT / lock_name).read_text()
    assert "bash image/lock.sh" in text.splitlines()[1], "say how the lock is regenerated"
    assert "-c /tmp" not in text and "file://" not in text, "a lock must not name the build machine's files"


def test_ci_installs_from_the_lock_and_runs_the_image_check() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q --require-hashes -r requirements-test.lock" in ci
    assert "pip install -q --no-deps --no-build-isolation -e ." in ci
    assert "pip install -q -e '.[test]'" not in ci, "an unpinned install would undo the lock"
    assert "bash image/image-check.sh" in ci
    script = (ROOT / "image" / "image-check.sh").read_text()
    assert "python3 image/build.py" in script and "python3 image/check.py" in script


def test_image_build_installs_the_lock_with_hashes_and_no_pip() -> None:
    source = (ROOT / "image" / "build.py").read_text()
    assert '"--require-hashes"' in source and '"--no-compile"' in source
    assert build.LOCK == ROOT / "requirements.lock"
    # Wheels only, for the image's glibc (bookworm 2.36) whatever the build host has.
    args = build.platform_args("x86_64")
    assert "--only-binary=:all:" in args
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert "manylinux_2_36_x86_64" in platforms and "manylinux_2_37_x86_64" not in platforms
    assert build.SUITE == "bookworm" and build.PYTHON == "python3.11"
    assert "pip" not in " ".join(build.DEBIAN_PACKAGES)


def dockerfile_final_stage() -> dict[str, str]:
    final = stages()[-1]
    return {word: args for word, args in final if word in {"USER", "EXPOSE", "ENTRYPOINT"}}


def dockerfile_env() -> dict[str, str]:
    (env_args,) = [args for word, args in stages()[-1] if word == "ENV"]
    return dict(re.findall(r"(\w+)=(\S+)", env_args))


def test_the_debian_image_runs_like_the_dockerfile_image() -> None:
    final = dockerfile_final_stage()
    assert final["USER"] == f"{build.UID}:{build.GID}"
    assert final["EXPOSE"] == f"{build.PORT} {build.PROBE_PORT}"
    # Same program: the Dockerfile's `trainer-metrics` resolves through PATH to /opt/venv/bin.
    assert final["ENTRYPOINT"] == '["trainer-metrics"]'
    assert build.ENTRYPOINT == ["/opt/venv/bin/trainer-metrics"]
    assert build.ENV["PATH"].startswith("/opt/venv/bin:")
    docker_env = dockerfile_env()
    for key, value in docker_env.items():
        if key in {"PATH", "VIRTUAL_ENV"}:
            continue
        assert build.ENV.get(key) == value, f"{key}: Dockerfile {value!r}, build.py {build.ENV.get(key)!r}"
    assert set(build.ENV) - set(docker_env) == set()
    # The chart runs both as this user.
    from .chart import CHART_DIR, load_yaml

    values = load_yaml(CHART_DIR / "values.yaml")
    assert values["securityContext"]["runAsUser"] == build.UID
    assert values["containerPort"] == build.PORT


def test_image_labels_name_version_revision_and_source() -> None:
    labels = build.image_labels("1.2.3", "abc", "https://example.com/x", "2026-01-01T00:00:00Z")
    for key in ("version", "revision", "source", "created", "title", "licenses"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert labels["org.opencontainers.image.version"] == "1.2.3"


def test_parse_lock_reads_hashes_markers_and_via(tmp_path: Any) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text(
        "# This file was autogenerated by uv via the following command:\n"
        "#    bash image/lock.sh\n"
        "colorama==0.4.6 ; sys_platform == 'win32' \\\n"
        "    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n"
        "    # via click\n"
        "Click==8.1.0 \\\n"
        "    --hash=sha256:" + "c" * 64 + "\n"
        "    # via\n"
        "    #   -r requirements.in\n"
        "    #   uvicorn\n"
        "uvicorn==0.30.0 \\\n"
        "    --hash=sha256:" + "d" * 64 + "\n"
        "    # via trainer-metrics (pyproject.toml)\n"
    )
    parsed = parse_lock(lock)
    assert set(parsed) == {"colorama", "click", "uvicorn"}
    assert parsed["click"].version == "8.1.0" and parsed["click"].via == {"uvicorn"}
    assert parsed["colorama"].requirement.count("--hash=") == 2
    assert parsed["uvicorn"].via == set()
    assert [e.name for e in closure(parsed, {"uvicorn"})] == ["click", "colorama", "uvicorn"]


def test_sourceless_modules_are_never_called_by_the_service() -> None:
    """image/build.py ships kubernetes-asyncio's generated API and model classes as byte code only (22 MB of
    source): right only while the service imports none of them directly."""
    assert build.SOURCELESS == ["kubernetes_asyncio/client/api", "kubernetes_asyncio/client/models"]
    offenders = []
    for path in (ROOT / "app").rglob("*.py"):
        text = path.read_text()
        if re.search(
            r"kubernetes_asyncio\.client\.(api|models)\b|from kubernetes_asyncio\.client import .*Api\b", text
        ):
            offenders.append(str(path.relative_to(ROOT)))
        if re.search(r"from kubernetes_asyncio\.client import [^\n]*\bV1[A-Z]", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"these use generated classes; drop them from SOURCELESS (tracebacks): {offenders}"
