"""Read a collection exactly as it was at one resourceVersion (paginated LIST, resourceVersionMatch=Exact).

Served from etcd, not the watch cache, and only while that revision has not been compacted away (five
minutes by default on a real cluster); older revisions get 410 Expired, raised as ApiError like any failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from app.kube.client import KubeClient
from app.kube.resources import ResourceKind

__all__ = ["list_at"]


async def list_at(
    client: KubeClient,
    resource: ResourceKind,
    namespace: str | None,
    resource_version: int,
    *,
    page_size: int,
    timeout: float,
    label_selector: str | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Every item of the collection at ``resource_version`` (those ``label_selector`` selects, if given);
    each page bounded by ``timeout`` seconds."""
    path = resource.collection_path(namespace)
    selector = {"labelSelector": label_selector} if label_selector else {}
    query = {
        "limit": str(page_size),
        "resourceVersion": str(resource_version),
        "resourceVersionMatch": "Exact",
        **selector,
    }
    while True:
        body = await client.request_json("GET", path, query=query, timeout=timeout)
        if not isinstance(body, dict):
            return
        for item in body.get("items") or ():
            if isinstance(item, dict):
                yield item
        cont = (body.get("metadata") or {}).get("continue")
        if not cont:
            return
        # The token pins the snapshot; the server rejects resourceVersion together with continue.
        # The token does not carry the selector: each page asks for it again (as client-go's pager does).
        query = {"limit": str(page_size), "continue": cont, **selector}
