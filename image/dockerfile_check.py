"""Build the Dockerfile without a daemon and prove it makes the image image/build.py made, file for file.

`docker build` cannot run here, so buildah (Debian's package) builds the Dockerfile instead: chroot
isolation, every RUN step with Docker's default capabilities only (no CAP_SYS_ADMIN: no mounts, no
namespaces), a storage of its own under --out that is removed afterwards. The builder's base is
`debian:bookworm-slim` from a registry with --builder-image; by default a stand-in made here with mmdebstrap
(Debian's minbase, as the slim image is made, plus the build host's local certificate authorities for a
proxy), so no registry is needed.

Then both images are unpacked and compared: every path, its type, mode, owner, size, time, link target and
content (sha256), and the configuration (user, entrypoint, environment, ports, stop signal, labels but the
ones a build sets: created, source). Any difference fails, named.

    python3 image/dockerfile_check.py      # after python3 image/build.py; prints a JSON report
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image.build import DEFAULT_OUT, MIRRORS, ROOT, SUITE, git, read_image, revision, source_date_epoch

# Docker's default capabilities of a build step (moby's oci/caps/defaults.go).
DOCKER_CAPABILITIES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
]
LOCAL_BUILDER = f"localhost/trainer-metrics-builder:{SUITE}-slim"
LOCAL_CA = Path("/usr/local/share/ca-certificates")
# Labels that say how and when an image was built rather than what it holds.
BUILD_LABELS = {"org.opencontainers.image.created", "org.opencontainers.image.source", "io.buildah.version"}


def log(msg: str) -> None:
    print(f"dockerfile-check: {msg}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kwargs)


class Buildah:
    """buildah with a storage of its own (vfs: no overlay mounts), nothing in /var/lib/containers."""

    def __init__(self, work: Path) -> None:
        self.base = ["buildah", "--root", str(work / "storage"), "--runroot", str(work / "run")]
        self.base += ["--storage-driver", "vfs"]

    def __call__(self, *args: str | Path, quiet: bool = False) -> str:
        cmd = [*self.base, *(str(a) for a in args)]
        if not quiet:
            log("$ " + " ".join(cmd))
        return subprocess.run(cmd, check=True, text=True, capture_output=quiet).stdout or ""


def local_builder(buildah: Buildah, work: Path) -> str:
    """A stand-in for debian:bookworm-slim: Debian's minbase of the same release, from the same archive."""
    tar = work / "builder.tar"
    run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            "--skip=chroot/mount",
            SUITE,
            tar,
            *MIRRORS,
        ]
    )
    ctr = buildah("from", "scratch", quiet=True).strip()
    try:
        buildah("add", ctr, tar, "/", quiet=True)
        if LOCAL_CA.is_dir() and any(LOCAL_CA.iterdir()):
            # A proxy's authority, as the build host trusts it (the builder fetches from PyPI over TLS).
            buildah("copy", ctr, LOCAL_CA, str(LOCAL_CA), quiet=True)
        buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", ctr)
        buildah("commit", "--quiet", ctr, LOCAL_BUILDER, quiet=True)
    finally:
        buildah("rm", ctr, quiet=True)
    tar.unlink()
    return LOCAL_BUILDER


def build_dockerfile(buildah: Buildah, builder: str, tag: str, layout: Path) -> float:
    started = time.monotonic()
    caps = [f"--cap-add=CAP_{c}" for c in DOCKER_CAPABILITIES]
    buildah(
        "build",
        "--isolation",
        "chroot",
        "--layers=false",
        "--cap-drop=ALL",
        *caps,
        "--build-arg",
        f"BUILDER_IMAGE={builder}",
        "--build-arg",
        f"REVISION={revision()}",
        "--build-arg",
        f"SOURCE_DATE_EPOCH={source_date_epoch()}",
        "--build-arg",
        f"DEBIAN_LOCK={os.environ.get('IMAGE_DEBIAN_LOCK', 'enforce')}",
        "--tag",
        f"localhost/trainer-metrics:{tag}",
        "--file",
        ROOT / "Dockerfile",
        ROOT,
    )
    seconds = time.monotonic() - started
    if layout.exists():
        shutil.rmtree(layout)
    buildah("push", "--quiet", f"localhost/trainer-metrics:{tag}", f"oci:{layout}:{tag}")
    return seconds


def unpack(layout: Path, tag: str, bundle: Path) -> Path:
    run(["umoci", "unpack", "--image", f"{layout}:{tag}", bundle], stdout=subprocess.DEVNULL)
    return bundle / "rootfs"


def tree(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every path under ``top``: (type, mode, uid, gid, then for files size, mtime and sha256, for links the
    target). Directory sizes and times depend on the file system, not on the image."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            key = str(path.relative_to(top))
            head = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISLNK(st.st_mode):
                out[key] = (*head, os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[key] = (*head, st.st_size, int(st.st_mtime), digest)
            else:
                out[key] = head
    return out


def compare_trees(a: dict[str, tuple[Any, ...]], b: dict[str, tuple[Any, ...]]) -> list[str]:
    diffs = [f"only in the Dockerfile's image: {p}" for p in sorted(a.keys() - b.keys())]
    diffs += [f"only in build.py's image: {p}" for p in sorted(b.keys() - a.keys())]
    diffs += [f"{p}: {a[p]} != {b[p]}" for p in sorted(a.keys() & b.keys()) if a[p] != b[p]]
    return diffs


def compare_configs(docker: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    diffs = []
    for key in ("User", "Entrypoint", "Env", "ExposedPorts", "WorkingDir", "StopSignal", "Cmd"):
        if docker.get(key) != ours.get(key):
            diffs.append(f"config {key}: Dockerfile {docker.get(key)!r}, build.py {ours.get(key)!r}")
    labels = [
        {k: v for k, v in (c.get("Labels") or {}).items() if k not in BUILD_LABELS} for c in (docker, ours)
    ]
    if labels[0] != labels[1]:
        diffs.append(f"labels: Dockerfile {labels[0]}, build.py {labels[1]}")
    return diffs


def check(out: Path, builder_image: str | None) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("dockerfile-check: run as root (buildah's chroot isolation, umoci unpack)")
    for tool in ("buildah", "umoci", "mmdebstrap"):
        if shutil.which(tool) is None:
            raise SystemExit(f"dockerfile-check: {tool} not found (apt-get install buildah umoci mmdebstrap)")
    started = time.monotonic()
    report = json.loads((out / "report.json").read_text())
    layout, tag = Path(report["layout"]), report["tag"]
    if report["labels"]["org.opencontainers.image.revision"] != revision():
        raise SystemExit(
            "dockerfile-check: build/image is not of this checkout: python3 image/build.py first"
        )
    docker_layout = out / "dockerfile-oci"
    with tempfile.TemporaryDirectory(prefix="trainer-metrics-dockerfile-", dir=out) as tmpdir:
        work = Path(tmpdir)
        buildah = Buildah(work)
        try:
            builder = builder_image or local_builder(buildah, work)
            build_seconds = build_dockerfile(buildah, builder, tag, docker_layout)
        finally:
            subprocess.run([*buildah.base, "rm", "--all"], check=False, capture_output=True)
        docker_tree = tree(unpack(docker_layout, tag, work / "docker"))
        our_tree = tree(unpack(layout, tag, work / "ours"))
    differences = compare_trees(docker_tree, our_tree)
    differences += compare_configs(
        read_image(docker_layout, tag)[1]["config"], read_image(layout, tag)[1]["config"]
    )
    return {
        "builder_image": builder_image or f"{LOCAL_BUILDER} (mmdebstrap minbase {SUITE}, made here)",
        "capabilities": DOCKER_CAPABILITIES,
        "dockerfile_layout": f"{docker_layout}:{tag}",
        "dockerfile_build_seconds": round(build_seconds, 1),
        "paths_compared": len(our_tree),
        "identical": not differences,
        "differences": differences[:50],
        "commit": git("rev-parse", "HEAD"),
        "check_seconds": round(time.monotonic() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="image/build.py's output directory")
    p.add_argument(
        "--builder-image",
        help="the Dockerfile's BUILDER_IMAGE, e.g. docker.io/library/debian:bookworm-slim (default: a "
        "stand-in made here with mmdebstrap, no registry needed)",
    )
    args = p.parse_args(argv)
    result = check(args.out.resolve(), args.builder_image)
    print(json.dumps(result, indent=2))
    if not result["identical"]:
        log(f"FAILED: the Dockerfile's image differs from build.py's ({len(result['differences'])} shown)")
        return 1
    log(
        f"OK in {result['check_seconds']} s: the Dockerfile (built by buildah with Docker's default "
        f"capabilities) makes build.py's image, {result['paths_compared']} paths identical"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
