"""Write the kustomize base in manifests/base from the Helm chart, rendered by the real Helm engine.

    .venv/bin/python helm/render_manifests.py            # rewrite manifests/base
    .venv/bin/python helm/render_manifests.py --check    # exit 1 if manifests/base is not what this writes
    .venv/bin/python helm/render_manifests.py --overlay tls   # print what manifests/overlays/tls must render

It needs helm-python-sdk (the `test` extra), as tests/deploy does. The base is the chart with BASE_VALUES,
released as `trainer-metrics` in `kubeflow-monitoring`, made kustomize-friendly by `normalize`: no Helm
labels, no `helm test` Pod, and monitors without a namespaceSelector (a ServiceMonitor selects its own
namespace, so a `namespace:` in an overlay above moves it with the Service). The overlays in
manifests/overlays are small patches written by hand; each must render (`kubectl kustomize`) what the chart
renders with its OVERLAYS values, which tests/deploy/test_manifests.py checks.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "trainer-metrics"
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
RELEASE = "trainer-metrics"
NAMESPACE = "kubeflow-monitoring"

Obj = dict[str, Any]

# What the base holds: the exporter, its RBAC and Service, and the Prometheus Operator and Grafana objects.
BASE_VALUES: dict[str, Any] = {
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "testFramework": {"enabled": False},  # a Helm hook: kustomize has no `helm test`
}
# The chart values each overlay stands for, over BASE_VALUES.
OVERLAYS: dict[str, dict[str, Any]] = {
    # Roles in the watched namespace only: no ClusterRole, ClusterTrainingRuntimes not watched.
    "namespaced": {
        "watchNamespaces": ["kubeflow-user-example-com"],
        "watchClusterRuntimes": False,
        "rbac": {"useClusterRole": False},
    },
    # HTTPS with a certificate from cert-manager (Kubeflow's self-signing ClusterIssuer), checked by the
    # ServiceMonitor against the Secret's ca.crt.
    "tls": {
        "tls": {
            "enabled": True,
            "certManager": {
                "enabled": True,
                "issuerRef": {"name": "kubeflow-self-signing-issuer", "kind": "ClusterIssuer"},
            },
        }
    },
}
# The base's files, in the order the kustomization lists them, and the kinds each holds.
FILES: dict[str, tuple[str, ...]] = {
    "serviceaccount.yaml": ("ServiceAccount",),
    "rbac.yaml": ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
    "service.yaml": ("Service",),
    "deployment.yaml": ("Deployment", "PodDisruptionBudget"),
    "servicemonitor.yaml": ("ServiceMonitor",),
    "prometheusrule.yaml": ("PrometheusRule",),
    "dashboard.yaml": ("ConfigMap",),
}
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HEADER = (
    "# Generated from helm/trainer-metrics: do not edit; change the chart and run\n"
    "#   .venv/bin/python helm/render_manifests.py\n"
)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render(values: dict[str, Any]) -> list[Obj]:
    """The chart's objects for ``values``, as `helm template` prints them, without NOTES and hooks."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[Obj] = []
    for path, text in sorted(manifests.items()):
        if not path.endswith(".yaml") or "/templates/tests/" in path:
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def normalize(objects: list[Obj]) -> list[Obj]:
    """What kustomize users get: the same objects without what only Helm means."""
    out = []
    for obj in copy.deepcopy(objects):
        if obj.get("metadata", {}).get("annotations", {}).get("helm.sh/hook"):
            continue
        for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata", {})):
            for label in HELM_LABELS:
                meta.get("labels", {}).pop(label, None)
        if obj["kind"] in ("ServiceMonitor", "PodMonitor"):
            obj["spec"].pop("namespaceSelector", None)
        out.append(obj)
    return out


def expected(overlay: str | None = None) -> list[Obj]:
    """What the base (``None``) or an overlay must render."""
    values = BASE_VALUES if overlay is None else merge(BASE_VALUES, OVERLAYS[overlay])
    return normalize(render(values))


class _Dumper(yaml.SafeDumper):
    """Block style with indented lists (as the chart's YAML), multi-line strings as literal blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[Obj]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=1_000_000, explicit_start=True)


def base_files() -> dict[str, str]:
    """File name -> content of manifests/base."""
    objects = expected()
    files: dict[str, str] = {}
    placed: set[int] = set()
    for name, kinds in FILES.items():
        mine = [o for o in objects if o["kind"] in kinds]
        placed.update(id(o) for o in mine)
        if mine:
            files[name] = HEADER + dump(mine)
    stray = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if id(o) not in placed]
    if stray:
        raise SystemExit(f"no file of manifests/base for {stray}: add their kinds to FILES")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
    }
    files["kustomization.yaml"] = HEADER + yaml.dump(kustomization, Dumper=_Dumper, sort_keys=False)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if manifests/base is out of date")
    parser.add_argument("--overlay", choices=sorted(OVERLAYS), help="print what the overlay must render")
    args = parser.parse_args(argv)
    if args.overlay:
        print(dump(expected(args.overlay)), end="")
        return 0
    files = base_files()
    present = {p.name for p in BASE.glob("*.yaml")} if BASE.is_dir() else set()
    if args.check:
        stale = sorted(
            name
            for name in files.keys() | present
            if name not in files or not (BASE / name).is_file() or (BASE / name).read_text() != files[name]
        )
        if stale:
            print(f"manifests/base is out of date ({', '.join(stale)}): run helm/render_manifests.py")
            return 1
        return 0
    BASE.mkdir(parents=True, exist_ok=True)
    for name in present - files.keys():
        (BASE / name).unlink()
    for name, text in files.items():
        (BASE / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
