"""A kubeconfig pointing at the simulated cluster, loadable by kubernetes-asyncio and kubectl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CLUSTER_NAME = "trainer-sim"


def kubeconfig_dict(url: str, *, token: str | None = None, namespace: str = "default") -> dict[str, Any]:
    user: dict[str, Any] = {"token": token} if token else {}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": url}}],
        "users": [{"name": CLUSTER_NAME, "user": user}],
        "contexts": [
            {
                "name": CLUSTER_NAME,
                "context": {"cluster": CLUSTER_NAME, "user": CLUSTER_NAME, "namespace": namespace},
            }
        ],
        "current-context": CLUSTER_NAME,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | Path, url: str, *, token: str | None = None, namespace: str = "default"
) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(kubeconfig_dict(url, token=token, namespace=namespace), sort_keys=False))
    return target
