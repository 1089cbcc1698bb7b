"""Discovery documents of the simulated apiserver: /version, /api, /apis and the group and resource lists.

kubernetes-asyncio and kubectl read these before anything else; they list only the kinds the store
serves (the core group's namespaces and events too), with the status subresource where the CRD declares
one. Newer clients (kubectl >= 1.26, client-go) ask /api and /apis for the aggregated form instead.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Final

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.storage.store import Store

Document = dict[str, Any]

VERSION: Document = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def discovery_document(store: Store, parts: list[str], server_address: str) -> Document | None:
    """The document at the path made of ``parts``; None if there is none (404)."""
    if parts == ["version"]:
        return VERSION
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }
    groups = _groups(store)
    if parts == ["apis"]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [_group(g, vs) for g, vs in groups.items()],
        }
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
        return dict(_group(parts[1], groups[parts[1]]), kind="APIGroup", apiVersion="v1")
    if (len(parts) == 3 and parts[0] == "apis") or parts == ["api", "v1"]:
        group, version = (parts[1], parts[2]) if parts[0] == "apis" else ("", "v1")
        resources = [r for r in store.resources if r.group == group and r.version == version]
        if not resources and group:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [e for r in resources for e in _api_resources(store, r)],
        }
    return None


# Aggregated discovery (KEP-3352): one document for /api and one for /apis, when the client asks for it.
AGGREGATED_V2: Final = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1: Final = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


def aggregated_document(store: Store, core: bool, version: str) -> Document:
    """APIGroupDiscoveryList for /api (``core``) or /apis, in apidiscovery.k8s.io ``version``."""
    by_group: dict[str, dict[str, list[ResourceKind]]] = {}
    for r in store.resources:
        if (r.group == "") == core:
            by_group.setdefault(r.group, {}).setdefault(r.version, []).append(r)
    items = []
    for group, versions in by_group.items():
        meta: Document = {"creationTimestamp": None}
        if group:
            meta = {"name": group, "creationTimestamp": None}
        items.append(
            {
                "metadata": meta,
                "versions": [
                    {
                        "version": v,
                        "resources": [_aggregated_resource(store, r) for r in rs],
                        "freshness": "Current",
                    }
                    for v, rs in versions.items()
                ],
            }
        )
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


def _aggregated_resource(store: Store, r: ResourceKind) -> Document:
    schema = store.schema(r)
    kind = {"group": r.group, "version": r.version, "kind": r.kind}
    out: Document = {
        "resource": r.plural,
        "responseKind": kind,
        "scope": "Namespaced" if r.namespaced else "Cluster",
        "singularResource": schema.singular or r.kind.lower(),
        "verbs": list(VERBS),
    }
    if schema.short_names:
        out["shortNames"] = list(schema.short_names)
    if schema.categories:
        out["categories"] = list(schema.categories)
    subresources = []
    if schema.status_subresource:
        subresources.append(
            {"subresource": "status", "responseKind": kind, "verbs": ["get", "patch", "update"]}
        )
    if subresources:
        out["subresources"] = subresources
    return out


VERBS: Final = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _groups(store: Store) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for r in store.resources:
        if r.group:
            versions = groups.setdefault(r.group, [])
            if r.version not in versions:
                versions.append(r.version)
    return groups


def _group(name: str, versions: list[str]) -> Document:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def _api_resources(store: Store, r: ResourceKind) -> list[Document]:
    schema = store.schema(r)
    main: Document = {
        "name": r.plural,
        "singularName": schema.singular or r.kind.lower(),
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": list(VERBS),
    }
    if schema.short_names:
        main["shortNames"] = list(schema.short_names)
    if schema.categories:
        main["categories"] = list(schema.categories)
    main["storageVersionHash"] = _storage_hash(r)
    out: list[Document] = [main]
    if schema.status_subresource:
        out.append(
            {
                "name": f"{r.plural}/status",
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    return out


def _storage_hash(r: ResourceKind) -> str:
    """apiserver: base64 of the first 8 bytes of sha256("group/version/kind") of the storage version."""
    digest = hashlib.sha256(f"{r.group}/{r.version}/{r.kind}".encode()).digest()[:8]
    return base64.b64encode(digest).decode()
