"""CustomResourceDefinitions as the API server reads them: list kinds, status subresources, printer columns,
the openAPIV3Schema and its `default:` values, and the YAML manifests they come in.

The simulated cluster applies the same structural defaults a real apiserver would, so that what a client
reads is what a real cluster stores (e.g. a Trainer ``spec.runtimeRef.kind: ClusterTrainingRuntime``).
Which CRDs are installed is the caller's: a :class:`~kubesim.apiserver.storage.store.Store` is given them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# libyaml makes loading the ~20k lines of CRDs ~10x faster; fall back to the pure-Python loader.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml_files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for child in sorted(path.rglob("*")):
        if child.suffix in (".yaml", ".yml") and child.is_file():
            yield child


def load_manifest_objects(path: str | Path) -> list[dict[str, Any]]:
    """Every Kubernetes object in a YAML file or a directory tree (sorted by path), kustomizations skipped."""
    objects: list[dict[str, Any]] = []
    for file in _yaml_files(Path(path)):
        with file.open("rb") as fh:
            for doc in yaml.load_all(fh, Loader=_Loader):
                if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
                    continue
                if doc["kind"] == "Kustomization":
                    continue
                objects.append(doc)
    return objects


@dataclass(slots=True)
class DefaultNode:
    """The parts of an openAPIV3Schema that carry defaults, pruned of everything else."""

    defaults: dict[str, tuple[Any, bool]] = field(default_factory=dict)  # property -> (default, nullable)
    properties: dict[str, DefaultNode] = field(default_factory=dict)
    items: DefaultNode | None = None
    additional: DefaultNode | None = None

    def empty(self) -> bool:
        return not (self.defaults or self.properties or self.items or self.additional)


def _compile(schema: dict[str, Any]) -> DefaultNode | None:
    node = DefaultNode()
    for name, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        if "default" in prop:
            node.defaults[name] = (prop["default"], bool(prop.get("nullable", False)))
        child = _compile(prop)
        if child is not None:
            node.properties[name] = child
    items = schema.get("items")
    if isinstance(items, dict):
        node.items = _compile(items)
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        node.additional = _compile(additional)
    return None if node.empty() else node


def apply_defaults(node: DefaultNode | None, value: Any) -> None:
    """Structural defaulting in place: absent (or null, unless nullable) fields get a copy of their default,
    then defaulting continues inside them, as the apiserver does."""
    if node is None:
        return
    if isinstance(value, dict):
        for name, (default, nullable) in node.defaults.items():
            if name not in value or (value[name] is None and not nullable):
                value[name] = copy.deepcopy(default)
        for name, child in node.properties.items():
            if name in value:
                apply_defaults(child, value[name])
        if node.additional is not None:
            for name, sub in value.items():
                if name not in node.properties:
                    apply_defaults(node.additional, sub)
    elif isinstance(value, list) and node.items is not None:
        for sub in value:
            apply_defaults(node.items, sub)


@dataclass(frozen=True, slots=True)
class CrdInfo:
    group: str
    version: str
    plural: str
    kind: str
    list_kind: str
    namespaced: bool
    status_subresource: bool
    defaults: DefaultNode | None
    schema: dict[str, Any] = field(default_factory=dict)  # openAPIV3Schema
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, Any], ...] = ()  # additionalPrinterColumns


def _crd_info(crd: dict[str, Any]) -> list[CrdInfo]:
    spec = crd["spec"]
    names = spec["names"]
    infos = []
    for version in spec.get("versions", []):
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        infos.append(
            CrdInfo(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                list_kind=names.get("listKind") or f"{names['kind']}List",
                namespaced=spec.get("scope") == "Namespaced",
                status_subresource="status" in (version.get("subresources") or {}),
                defaults=_compile(schema),
                schema=schema,
                singular=names.get("singular") or names["kind"].lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
            )
        )
    return infos


CrdRegistry = dict[tuple[str, str, str], CrdInfo]  # (group, version, plural) -> CrdInfo


def crd_registry(objects: Iterable[dict[str, Any]]) -> CrdRegistry:
    """Every served version of the CustomResourceDefinitions among ``objects`` (other kinds are skipped)."""
    registry: CrdRegistry = {}
    for obj in objects:
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        for info in _crd_info(obj):
            registry[(info.group, info.version, info.plural)] = info
    return registry
