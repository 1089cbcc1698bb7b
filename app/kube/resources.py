"""Kubernetes resource coordinates: which URL paths a collection lives at.

Generic: the kinds an application watches are defined with it; only the Lease, which leader election
needs, is here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceKind:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        """Collection URL; ``namespace=None`` means all namespaces (or a cluster-scoped resource)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        return f"{self.collection_path(namespace)}/{name}"


LEASES = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
