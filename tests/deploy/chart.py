"""Helpers for the deployment tests: render the chart with the real Helm engine (helm-python-sdk binds
Helm's Go SDK through libhelm_c, no helm binary), parse what it renders, and look objects up."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "trainer-metrics"
RELEASE = "tm"
NAMESPACE = "obs"
FULLNAME = "tm-trainer-metrics"  # <release>-<chart>, the release name not containing the chart name
SERVICE_ACCOUNT = FULLNAME

Obj = dict[str, Any]


def helm_script(name: str) -> ModuleType:
    """helm/<name>.py, loaded by path: helm/ is not a Python package (and must not shadow anything named
    helm)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "helm" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def production_values() -> dict[str, Any]:
    values: dict[str, Any] = load_yaml(CHART_DIR / "values-production.yaml")
    return values


CI_DIR = CHART_DIR / "ci"


def ci_values() -> dict[str, dict[str, Any]]:
    """The chart-testing values files (ci/<name>-values.yaml) by name: what `ct lint` renders, and what the
    deployment tests render, lint and validate one by one."""
    return {
        path.name.removesuffix("-values.yaml"): load_yaml(path) or {}
        for path in sorted(CI_DIR.glob("*-values.yaml"))
    }


@dataclass
class Rendered:
    """What `helm template` would print: manifests by template path, and their parsed objects."""

    manifests: dict[str, str]

    @property
    def notes(self) -> str:
        return next((text for path, text in self.manifests.items() if path.endswith("NOTES.txt")), "")

    @property
    def objects(self) -> list[Obj]:
        out: list[Obj] = []
        for path, text in sorted(self.manifests.items()):
            if not path.endswith((".yaml", ".yml")):
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    assert isinstance(doc, dict), f"{path}: not an object: {doc!r}"
                    out.append(doc)
        return out

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        )
        return found[0]

    def kinds(self) -> set[str]:
        return {o["kind"] for o in self.objects}

    @property
    def container(self) -> Obj:
        """The service's container (extraContainers may add sidecars after it)."""
        containers = self.one("Deployment")["spec"]["template"]["spec"]["containers"]
        assert containers[0]["name"] == "trainer-metrics", [c["name"] for c in containers]
        container: Obj = containers[0]
        return container

    def env(self, pod_name: str = "tm-trainer-metrics-5d8f-abcde") -> dict[str, str]:
        """The container's environment as the kubelet builds it: downward-API fields resolved and
        $(VAR) references expanded from the variables defined before them."""
        fields = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE}
        env: dict[str, str] = {}
        for var in self.container.get("env", []):
            if "valueFrom" in var:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                value = var.get("value", "")
                assert isinstance(value, str), f"env {var['name']} is not a string: {value!r}"
                env[var["name"]] = re.sub(
                    r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value
                )
        return env


# render(values=None, *, name=RELEASE, namespace=NAMESPACE) -> Rendered (the `render` fixture)
RenderFn = Callable[..., Rendered]


def iter_rules(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for obj in objects:
        if obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj.get("rules") or []:
                yield obj, rule


# --- the Dockerfile ---------------------------------------------------------------------------------------

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instr in instructions():
        if instr[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instr)
    return result
