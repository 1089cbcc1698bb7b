"""The lock files and the registry-free image build: the Python locks pin, with hashes, versions inside
pyproject.toml's ranges; the Debian locks pin the image's packages by sha256; image/build.py (which the
Dockerfile runs) installs from them and nothing else; image/check.py runs the image as the chart runs the
pod. The build itself, and the start of the image, run in `.ci/run` (image/image-check.sh), not here: they
need root and a minute or two."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from image import build
from image.build import Locked, closure, normalise, parse_lock

from .chart import ROOT

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


def test_the_image_runs_as_the_chart_runs_it() -> None:
    # The Dockerfile's final stage is generated from these (tests/deploy/test_dockerfile.py).
    assert build.ENTRYPOINT == ["/opt/venv/bin/trainer-metrics"]
    assert build.ENV["PATH"].startswith("/opt/venv/bin:")
    from .chart import CHART_DIR, load_yaml

    values = load_yaml(CHART_DIR / "values.yaml")
    assert values["securityContext"]["runAsUser"] == build.UID
    assert values["containerPort"] == build.PORT


@pytest.mark.parametrize("arch", sorted(build.ARCH.values()))
def test_debian_lock_pins_every_package_of_the_image(arch: str) -> None:
    path = build.debian_lock_path(arch)
    debs = build.read_debian_lock(path)
    names = [d.name for d in debs]
    assert len(names) == len(set(names)) and len(debs) >= 20
    assert set(build.DEBIAN_PACKAGES) <= set(names)
    # Python and the libraries it links: no shell, no package manager, no interpreter besides Python.
    for absent in ("dash", "bash", "coreutils", "dpkg", "apt", "perl-base", "python3-pip", "tar"):
        assert absent not in names, absent
    assert f"--update-debian-lock --arch {arch}" in path.read_text().split("\n", 3)[2]


def test_both_architectures_lock_the_same_package_versions() -> None:
    amd64, arm64 = (build.read_debian_lock(build.debian_lock_path(a)) for a in ("amd64", "arm64"))
    assert [(d.name, d.version) for d in amd64] == [(d.name, d.version) for d in arm64]


def test_a_debian_update_stops_the_build_and_says_what_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "debian-amd64.lock"
    monkeypatch.setattr(build, "debian_lock_path", lambda arch: lock)
    monkeypatch.setattr(build, "ROOT", tmp_path)
    locked = [build.Deb("libc6", "2.36-9+deb12u13", "a" * 64), build.Deb("zlib1g", "1:1.2.13", "b" * 64)]
    build.write_debian_lock(lock, "amd64", locked)
    assert build.read_debian_lock(lock) == locked
    build.check_debian_lock(list(locked), "amd64")  # the same: passes
    fetched = [build.Deb("libc6", "2.36-9+deb12u14", "c" * 64), build.Deb("zlib1g", "1:1.2.13", "d" * 64)]
    with pytest.raises(SystemExit) as exc:
        build.check_debian_lock([*fetched, build.Deb("libnew1", "1.0", "e" * 64)], "amd64")
    message = str(exc.value)
    assert "libc6: 2.36-9+deb12u13 -> 2.36-9+deb12u14" in message
    assert "zlib1g 1:1.2.13: another file" in message and "libnew1: added" in message
    assert "--update-debian-lock" in message and "--debian-snapshot" in message
    # CI's mode: the same drift is said, and the build goes on (Debian keeps only the current versions).
    logged: list[str] = []
    monkeypatch.setattr(build, "log", logged.append)
    build.check_debian_lock(fetched, "amd64", "report")
    assert len(logged) == 1 and "libc6: 2.36-9+deb12u13 -> 2.36-9+deb12u14" in logged[0]


def test_ci_builds_the_image_reporting_debian_drift() -> None:
    """.ci/run must not fail because Debian published a security update since the lock was written."""
    ci = (build.ROOT / ".ci" / "run").read_text()
    assert "IMAGE_DEBIAN_LOCK=report bash image/image-check.sh" in ci
    assert "ARG DEBIAN_LOCK=enforce" in (build.ROOT / "Dockerfile").read_text()


def test_debian_snapshot_mirrors() -> None:
    assert build.mirrors(None) == build.MIRRORS
    snap = build.mirrors("20260711T000000Z")
    assert all("http://snapshot.debian.org/archive/debian" in m and "check-valid-until=no" in m for m in snap)
    assert [m.split()[-2] for m in snap] == ["bookworm", "bookworm-updates", "bookworm-security"]
    with pytest.raises(SystemExit):
        build.mirrors("2026-07-11")


def _dist(site: Path, name: str, version: str, record: str = "") -> Path:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(record)
    return info


def test_the_image_holds_the_lock_and_the_project_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    for entry in RUNTIME.values():
        _dist(site, entry.name, entry.version)
    _dist(site, "trainer-metrics", PYPROJECT["project"]["version"])
    build.check_distributions(site)
    sim = _dist(site, "trainer-metrics-sim", "0.1.0")
    with pytest.raises(SystemExit, match="extra \\['trainer-metrics-sim'\\]"):
        build.check_distributions(site)
    shutil.rmtree(sim)
    (site / "kubesim").mkdir()
    with pytest.raises(SystemExit, match="kubesim ended up"):
        build.check_distributions(site)


def test_no_path_of_the_build_is_left_in_the_records(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = _dist(
        site,
        "trainer-metrics",
        "0.1.0",
        "app/cli.py,sha256=x,1\n../../bin/trainer-metrics,sha256=y,2\n"
        "trainer_metrics-0.1.0.dist-info/direct_url.json,sha256=z,3\n",
    )
    (info / "direct_url.json").write_text('{"url": "file:///tmp/trainer-metrics-image-x/wheels/x.whl"}')
    build.forget_build_paths(site)
    assert (info / "RECORD").read_text() == "app/cli.py,sha256=x,1\n"
    assert not (info / "direct_url.json").exists()


def test_the_check_runs_the_image_as_the_chart_runs_the_pod(tmp_path: Path) -> None:
    """image/check.py's runtime spec: read-only root, no capabilities, the check's network namespace (where
    the simulated cluster listens) and the kubeconfig mounted read-only."""
    from image import check

    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    spec = {
        "process": {
            "user": {"uid": build.UID, "gid": build.GID},
            "args": list(build.ENTRYPOINT),
            "env": ["PATH=/opt/venv/bin"],
        },
        "root": {"path": "rootfs"},
        "mounts": [],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}]},
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    netns, kubeconfig = Path("/var/run/netns/x"), tmp_path / "kubeconfig"
    out = check.prepare_spec(bundle, netns, kubeconfig)
    assert out["root"] == {"path": "rootfs", "readonly": True}
    assert out["process"]["noNewPrivileges"] is True
    assert all(caps == [] for caps in out["process"]["capabilities"].values())
    assert {"type": "network", "path": str(netns)} in out["linux"]["namespaces"]
    (mount,) = [m for m in out["mounts"] if m["destination"] == check.KUBECONFIG_IN_IMAGE]
    assert mount["source"] == str(kubeconfig) and "ro" in mount["options"]
    assert (bundle / "rootfs" / check.KUBECONFIG_IN_IMAGE.lstrip("/")).is_file()


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
