"""The README's "Install on a cluster", as written: three choices, each complete on its own. Each Helm
command is rendered with the real Helm engine from its own flags (release, namespace, -f, --set), linted
strictly and every object validated against the Kubernetes schemas; the kustomize block is run by bash as
written (in a scratch directory beside a copy of manifests/) and rendered with `kubectl kustomize`, its image
the registry's."""

from __future__ import annotations

import copy
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.docs.readme import commands, section, shell_blocks

from .chart import CHART_DIR, ROOT, load_yaml
from .test_manifests import CRD_KINDS, KUBE_VERSIONS, kustomize

REGISTRY_IMAGE = "registry.example.com/ml-platform/trainer-metrics"


def _install_blocks() -> list[str]:
    return shell_blocks(section("Install on a cluster"))


def _helm_installs() -> list[str]:
    found = [c for block in _install_blocks() for c in commands(block) if c.startswith("helm install ")]
    assert len(found) == 2, found  # Helm, and Helm hardened
    return found


def _set(values: dict[str, Any], dotted: str, raw: str) -> None:
    """``--set a.b=c`` as Helm reads it: true/false as booleans, the rest as strings (no numbers here)."""
    *parents, leaf = dotted.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = {"true": True, "false": False}.get(raw, raw)


def _parse(command: str) -> tuple[str, str, str, dict[str, Any], bool]:
    """(release, chart, namespace, values, --create-namespace) of a ``helm install`` line."""
    words = shlex.split(command)[2:]
    release, chart, rest = words[0], words[1], words[2:]
    namespace, create, values = "default", False, {}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "-n":
            namespace, i = rest[i + 1], i + 2
        elif word == "--create-namespace":
            create, i = True, i + 1
        elif word == "-f":
            values = {**values, **copy.deepcopy(load_yaml(ROOT / rest[i + 1]))}
            i += 2
        elif word == "--set":
            key, _, raw = rest[i + 1].partition("=")
            _set(values, key, raw)
            i += 2
        else:
            pytest.fail(f"a flag this test does not read: {word} in {command}")
    return release, chart, namespace, values, create


def _validate(objects: list[dict[str, Any]], what: str) -> int:
    checked = 0
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue  # the Prometheus Operator's and cert-manager's: checked in test_monitoring.py
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{what}: {obj['kind']}/{obj['metadata']['name']} ({version}): {exc.message}")
        checked += 1
    return checked


@pytest.mark.parametrize("index", [0, 1], ids=["helm", "helm-hardened"])
def test_each_helm_choice_renders_lints_and_validates(index: int, chart: helm.Chart) -> None:
    command = _helm_installs()[index]
    release, chart_path, namespace, values, create = _parse(command)
    assert (release, chart_path, namespace) == (
        "trainer-metrics",
        "helm/trainer-metrics",
        "kubeflow-monitoring",
    )
    assert ROOT / chart_path == CHART_DIR
    assert create, f"each choice creates its namespace: {command}"
    report = helm.lint(CHART_DIR, copy.deepcopy(values), strict=True, namespace=namespace)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert report["errors"] == [] and problems == [], report
    manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects = [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    assert _validate(objects, command) >= 5
    images = [
        c["image"]
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    assert images and all(i.startswith(REGISTRY_IMAGE + ":") for i in images), images


def test_the_choices_are_alternatives_not_a_sequence() -> None:
    # One release name for both Helm commands is right only because they are alternatives: the README says so.
    text = section("Install on a cluster")
    assert "**one** of these three, each complete on its own" in text


def test_the_kustomize_choice_as_written(tmp_path: Path) -> None:
    block = next(b for b in _install_blocks() if "kubectl apply -k" in b)
    lines = block.splitlines()
    apply_line = lines[-1]
    assert (
        apply_line == "kubectl create namespace kubeflow-monitoring && kubectl apply -k my-trainer-metrics"
    ), lines
    # Everything before the apply, by bash, in a scratch directory laid out as the repository root.
    shutil.copytree(ROOT / "manifests", tmp_path / "manifests")
    written = subprocess.run(
        ["bash", "-c", "\n".join(lines[:-1])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert written.returncode == 0, written.stderr
    objects = kustomize(tmp_path / "my-trainer-metrics")
    assert _validate(objects, "kustomize") >= 6
    images = [
        c["image"]
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    assert images == [f"{REGISTRY_IMAGE}:0.1.0"], images
    namespaces = {
        o["metadata"].get("namespace")
        for o in objects
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding")
    }
    assert namespaces == {"kubeflow-monitoring"}, namespaces  # the namespace the block creates
