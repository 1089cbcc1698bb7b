"""What the simulated API server serves: a collection's group, version, plural, kind and scope.

The server's own type, not a client's: a client names collections by URL path, and the store's callers (the
generator, tests) pass these. The store also accepts any object with the same ``group``, ``version`` and
``plural`` attributes (a client library's own resource type), so tests may name a collection as the
service does.
"""

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

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def coordinates(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural

    def collection_path(self, namespace: str | None = None) -> str:
        """The collection's URL path; ``namespace=None``: all namespaces (or a cluster-scoped kind)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"
