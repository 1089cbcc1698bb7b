"""Start the image that image/build.py built and check that it works, without a registry or a daemon.

1. The image's configuration: user 65532:65532, the entrypoint, the OCI labels (version = the project's,
   revision, source), no pip or setuptools and no shell inside, and the size within its budget.
2. `umoci unpack` makes an OCI runtime bundle; the service starts from it in --simulate mode (its embedded
   simulated Kubernetes API server and workload generator) with the image's entrypoint, environment (port
   8080) and user, a read-only root filesystem, a tmpfs /tmp, no capabilities, no-new-privileges and a
   network namespace of its own, as the Helm chart runs the pod:
   - with crun (an OCI runtime) when it works here,
   - else (or with --runtime chroot) the unpacked root filesystem under unshare + chroot as uid 65532.
3. From inside its network namespace (nsenter), GET /readyz answers 200 and /metrics carries
   trainer_metrics_build_info with the image's version and the Trainer metrics of the leader; the process runs
   as 65532 on a read-only root without capabilities; SIGTERM stops it cleanly.

    python3 image/check.py            # after python3 image/build.py; prints a JSON report
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image.build import DEFAULT_OUT, ENTRYPOINT, GID, PORT, PYTHON, SITE_PACKAGES, UID, project, read_image

# The goal for the image: 150 MB uncompressed (the layers as a node unpacks them).
SIZE_BUDGET_BYTES = 150_000_000
READY_TIMEOUT = 120.0  # start-up of the simulated cluster, informer sync and the first leadership
STOP_TIMEOUT = 30.0  # the chart's terminationGracePeriodSeconds
SIM_ARGS = ["--simulate", "--sim-seed", "7", "--sim-jobs", "40", "--sim-rate", "5"]


def log(msg: str) -> None:
    print(f"image-check: {msg}", file=sys.stderr, flush=True)


class CheckFailed(Exception):
    pass


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


# --- 1. static ---------------------------------------------------------------------------------------------


def check_config(layout: Path, tag: str, report: dict[str, Any]) -> dict[str, Any]:
    _, config = read_image(layout, tag)
    cfg = config["config"]
    labels = cfg.get("Labels") or {}
    expect(cfg.get("User") == f"{UID}:{GID}", f"image user is {cfg.get('User')!r}, want {UID}:{GID}")
    expect(cfg.get("Entrypoint") == ENTRYPOINT, f"entrypoint is {cfg.get('Entrypoint')!r}")
    expect(not cfg.get("Cmd"), f"a Cmd would be appended to every `args:` of the chart: {cfg.get('Cmd')!r}")
    for port in ("8080/tcp", "8081/tcp"):
        expect(port in (cfg.get("ExposedPorts") or {}), f"port {port} is not exposed")
    version = project()["project"]["version"]
    expect(labels.get("org.opencontainers.image.version") == version, f"version label != {version}")
    for key in ("revision", "source", "created", "title", "licenses"):
        expect(
            bool(labels.get(f"org.opencontainers.image.{key}")),
            f"label org.opencontainers.image.{key} missing",
        )
    expect(config.get("os") == "linux", f"os is {config.get('os')!r}")
    size = report["size_uncompressed_bytes"]
    expect(
        size <= SIZE_BUDGET_BYTES,
        f"image is {size / 1e6:.1f} MB uncompressed, budget {SIZE_BUDGET_BYTES / 1e6} MB",
    )
    return config


def check_rootfs(rootfs: Path) -> None:
    site = rootfs / SITE_PACKAGES.lstrip("/")
    for unwanted in ("pip", "setuptools", "wheel", "_distutils_hack"):
        expect(not (site / unwanted).exists(), f"{unwanted} is in the image's site-packages")
    for shell in ("bin/sh", "bin/bash", "usr/bin/dash"):
        expect(not (rootfs / shell).exists(), f"/{shell} is in the image: it ships no shell")
    for tool in ("usr/bin/dpkg", "usr/bin/apt", "usr/bin/pip", "usr/bin/pip3"):
        expect(not (rootfs / tool).exists(), f"/{tool} is in the image")
    expect((rootfs / "etc/passwd").read_text().count(f":{UID}:{GID}:") == 1, "uid 65532 not in /etc/passwd")
    expect((rootfs / "var/lib/dpkg/status").stat().st_size > 0, "no dpkg status for image scanners")
    stdlib_pyc = list((rootfs / "usr/lib" / PYTHON / "__pycache__").glob("*.pyc"))
    expect(len(stdlib_pyc) > 100, "the standard library is not byte-compiled")


# --- 2. runtime --------------------------------------------------------------------------------------------


def unpack(layout: Path, tag: str, bundle: Path) -> None:
    if bundle.exists():
        shutil.rmtree(bundle)
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], check=True)


def prepare_bundle(bundle: Path, args: list[str]) -> dict[str, Any]:
    """The runtime spec umoci derived from the image, changed to run the way the chart runs the pod."""
    spec: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    process = spec["process"]
    expect(process["user"]["uid"] == UID and process["user"]["gid"] == GID, f"spec user {process['user']}")
    process["args"] = [*process["args"], *args]
    # No Prometheus scrapes this replica, so a stopping leader would wait out the whole hand-over wait for a
    # last scrape (app/config.py handover_wait_seconds); this check is about stopping on SIGTERM at all.
    # An unknown TRAINER_METRICS_* variable is ignored by the service.
    process["env"] = [*process["env"], "TRAINER_METRICS_HANDOVER_WAIT_SECONDS=2"]
    process["terminal"] = False
    process["noNewPrivileges"] = True  # allowPrivilegeEscalation: false
    process["capabilities"] = {
        k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
    }
    spec["root"] = {"path": "rootfs", "readonly": True}  # readOnlyRootFilesystem: true
    spec["mounts"].append(
        {  # the chart's emptyDir /tmp
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", "size=64m"],
        }
    )
    # Its own network namespace, as a pod has (nothing on the host's ports); the check enters it to connect.
    expect(any(ns["type"] == "network" for ns in spec["linux"]["namespaces"]), "no network namespace")
    (bundle / "config.json").write_text(json.dumps(spec, indent=2))
    return spec


def cgroup_v2_hybrid() -> bool:
    """systemd's hybrid layout with controllers on the cgroup2 mount too: crun refuses it ("cgroups in hybrid
    mode not supported"); hiding that mount in a private mount namespace makes it a plain v1 host for crun."""
    unified = Path("/sys/fs/cgroup/unified")
    try:
        return os.path.ismount(unified) and bool((unified / "cgroup.controllers").read_text().strip())
    except OSError:
        return False


@dataclass
class Running:
    runtime: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    container_id: str = ""

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_crun(bundle: Path, log_path: Path) -> Running:
    container_id = f"trainer-metrics-check-{os.getpid()}"
    cmd = ["crun", "run", "--bundle", str(bundle), container_id]
    if cgroup_v2_hybrid():
        cmd = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'umount /sys/fs/cgroup/unified && exec "$@"',
            "sh",
            *cmd,
        ]
    log("$ " + " ".join(cmd))
    out = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    return Running("crun", proc, log_path, container_id)


def start_chroot(bundle: Path, spec: dict[str, Any], log_path: Path) -> Running:
    """The unpacked root filesystem in private mount and PID namespaces: read-only bind of the root, /proc,
    /dev, a tmpfs /tmp, then chroot as the image's user with the image's environment and nothing else."""
    rootfs = bundle / "rootfs"
    process = spec["process"]
    env = [e for e in process["env"] if not e.startswith("TERM=")]
    script = (
        'set -e; r="$1"; shift; ip link set lo up; '
        'mount --bind "$r" "$r"; mount -o remount,bind,ro "$r" "$r"; '
        'mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; '
        'mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m tmpfs "$r/tmp"; '
        'exec env -i "$@"'
    )
    cmd = [
        "unshare",
        "--mount",
        "--pid",
        "--net",
        "--fork",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(rootfs),
    ]
    cmd += [*env, "setpriv", "--no-new-privs", "--inh-caps=-all"]
    cmd += ["chroot", f"--userspec={UID}:{GID}", str(rootfs), *process["args"]]
    log("$ " + " ".join(cmd))
    out = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    return Running("chroot", proc, log_path)


# Run inside the container's network namespace (nsenter): status, a newline, then the body.
_GET = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as resp:
        status, body = resp.status, resp.read()
except urllib.error.HTTPError as exc:
    status, body = exc.code, exc.read()
sys.stdout.write(f"{status}\\n{body.decode(errors='replace')}")
"""


def http_get(pid: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT<path> from inside the network namespace of process ``pid``."""
    out = subprocess.run(
        [
            "nsenter",
            "--target",
            str(pid),
            "--net",
            sys.executable,
            "-I",
            "-c",
            _GET,
            f"http://127.0.0.1:{PORT}{path}",
        ],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    if out.returncode != 0:
        raise OSError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc {out.returncode}")
    status, _, body = out.stdout.partition("\n")
    return int(status), body


def wait_until(running: Running, what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if running.proc.poll() is not None:
            raise CheckFailed(f"the container exited ({running.proc.returncode}) before {what}")
        try:
            value = check()
        except (OSError, subprocess.TimeoutExpired) as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(0.5)
    raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def service_process(marker: str) -> int:
    """The pid of the service (the entrypoint's Python) started with ``--identity marker``, from /proc."""
    want = f"--identity\0{marker}\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        named = re.search(r"^Name:\s+(trainer-metrics|python)", status, re.M)
        if named and ENTRYPOINT[0] in cmdline and want in cmdline:
            return int(entry.name)
    raise OSError(f"no process of {ENTRYPOINT[0]} --identity {marker} yet")


def proc_facts(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    uid = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
    gid = re.search(r"^Gid:\s+(\d+)\s+(\d+)", status, re.M)
    rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    cap = re.search(r"^CapEff:\s+([0-9a-f]+)", status, re.M)
    nnp = re.search(r"^NoNewPrivs:\s+(\d)", status, re.M)
    root_ro = False
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            root_ro = "ro" in fields[5].split(",")
    assert uid and gid and rss and cap and nnp, status
    return {
        "uid": int(uid[1]),
        "gid": int(gid[1]),
        "rss_mb": round(int(rss[1]) / 1024, 1),
        "capabilities": cap[1],
        "no_new_privs": nnp[1] == "1",
        "root_read_only": root_ro,
    }


def stop(running: Running) -> int | None:
    if running.proc.poll() is None:
        if running.runtime == "crun":
            subprocess.run(["crun", "kill", running.container_id, "TERM"], check=False)
        else:
            # `unshare --fork` does not forward signals: send SIGTERM to its child, the service (`sh`, `env`,
            # `setpriv` and `chroot` all exec'ed into it).
            for pid in _children(running.proc.pid) or [running.proc.pid]:
                os.kill(pid, signal.SIGTERM)
        try:
            return running.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            if running.runtime == "crun":
                subprocess.run(["crun", "kill", running.container_id, "KILL"], check=False)
            running.proc.kill()
            running.proc.wait(timeout=10)
            return None
    return running.proc.returncode


def _children(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in children]


def exercise(running: Running, marker: str, version: str) -> dict[str, Any]:
    started = time.monotonic()
    pid: int = wait_until(running, "the service's process", lambda: service_process(marker), READY_TIMEOUT)
    wait_until(running, "/readyz to answer 200", lambda: http_get(pid, "/readyz")[0] == 200, READY_TIMEOUT)
    ready_after = round(time.monotonic() - started, 1)

    def leader_metrics() -> str | None:
        code, body = http_get(pid, "/metrics")
        return body if code == 200 and "kubeflow_trainer_runtime_info{" in body else None

    body: str = wait_until(running, "the leader's Trainer metrics on /metrics", leader_metrics, 60.0)
    build_info = re.search(r"^trainer_metrics_build_info\{([^}]*)\} 1\.0$", body, re.M)
    expect(build_info is not None, "no trainer_metrics_build_info on /metrics")
    assert build_info is not None
    expect(f'version="{version}"' in build_info[1], f"build_info is {build_info[0]}, want version {version}")
    expect("process_resident_memory_bytes" in body, "no process_* metrics: /proc is not readable")
    facts = proc_facts(pid)
    expect(facts["uid"] == UID and facts["gid"] == GID, f"the service runs as {facts['uid']}:{facts['gid']}")
    expect(facts["root_read_only"], "the root filesystem is writable")
    expect(facts["no_new_privs"], "no_new_privs is off")
    expect(int(facts["capabilities"], 16) == 0, f"effective capabilities {facts['capabilities']}")
    series = sum(1 for line in body.splitlines() if line.startswith("kubeflow_trainer_"))
    return {
        "ready_after_seconds": ready_after,
        "build_info": build_info[0],
        "kubeflow_trainer_samples": series,
        "process": facts,
    }


def run_check(out: Path, runtime: str) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("image-check: run as root (umoci unpack, crun or chroot need it)")
    report = json.loads((out / "report.json").read_text())
    layout, tag = Path(report["layout"]), report["tag"]
    check_config(layout, tag, report)
    bundle = out / "bundle"
    unpack(layout, tag, bundle)
    check_rootfs(bundle / "rootfs")
    # The image's own host and port (0.0.0.0:8080); --identity only marks the process for this check.
    marker = f"image-check-{os.getpid()}"
    spec = prepare_bundle(bundle, [*SIM_ARGS, "--identity", marker])
    runtimes = (
        [runtime] if runtime != "auto" else (["crun", "chroot"] if shutil.which("crun") else ["chroot"])
    )
    notes: list[str] = []
    for name in runtimes:
        log_path = out / f"check-{name}.log"
        running = start_crun(bundle, log_path) if name == "crun" else start_chroot(bundle, spec, log_path)
        try:
            result = exercise(running, marker, tag)
        except CheckFailed as exc:
            stop(running)
            notes.append(f"{name}: {exc}")
            log(f"{name}: {exc}\n--- output ---\n{running.output()[-4000:]}")
            if running.runtime == "crun" and "crun" in running.output() and len(runtimes) > 1:
                continue  # crun itself could not run here: try the unpacked root filesystem
            raise CheckFailed("; ".join(notes)) from exc
        code = stop(running)
        output = running.output()
        expect(code == 0, f"{name}: the service exited with {code} on SIGTERM\n{output[-2000:]}")
        # The service's first line names its version, namespaces, auth and TLS state (app/cli.py).
        startup = [line for line in output.splitlines() if f"trainer-metrics {tag} starting:" in line]
        expect(bool(startup), f"{name}: no start-up line naming version {tag} in the output")
        shutil.rmtree(bundle)
        return {
            "runtime": name,
            "notes": notes,
            "exit_code_on_sigterm": code,
            "startup_log": startup[:3],
            **result,
            "size_uncompressed_mb": round(report["size_uncompressed_bytes"] / 1e6, 1),
            "size_compressed_mb": round(report["size_compressed_bytes"] / 1e6, 1),
            "user": report["user"],
            "entrypoint": report["entrypoint"],
            "labels": report["labels"],
        }
    raise CheckFailed("; ".join(notes))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="image/build.py's output directory")
    p.add_argument("--runtime", choices=["auto", "crun", "chroot"], default="auto")
    args = p.parse_args(argv)
    try:
        result = run_check(args.out.resolve(), args.runtime)
    except CheckFailed as exc:
        log(f"FAILED: {exc}")
        return 1
    print(json.dumps(result, indent=2))
    log(
        f"OK with {result['runtime']}: ready in {result['ready_after_seconds']} s, "
        f"{result['kubeflow_trainer_samples']} Trainer samples, uid {result['process']['uid']}, "
        f"read-only root, {result['size_uncompressed_mb']} MB uncompressed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
