"""Fixtures for the simulated-cluster conformance suite: a live cluster, raw HTTP and kubernetes-asyncio."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from kubesim.apiserver.storage.store import Store
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS
from tests.support.auth_rig import api_server, registry  # noqa: F401 (fixtures of test_authn.py)


@pytest.fixture
def sim_options() -> dict[str, Any]:
    """Short watches and a quick "too large" wait for the conformance suite (tests/conftest.py: sim).
    Namespaces behave as on a real cluster: a write into a missing one is 404 (team1 exists)."""
    return {
        "watch_timeout": (5, 6),
        "bookmark_interval": 60.0,
        "too_large_wait": 0.05,
        "auto_namespaces": False,
        "namespaces": ("team1",),
    }


@pytest.fixture
async def http(sim: SimulatedCluster) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=sim.url) as session:
        yield session


@pytest.fixture
async def api(sim: SimulatedCluster, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


def trainjob(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }


def add_jobs(store: Store, n: int, namespace: str = "team1", prefix: str = "job") -> None:
    for i in range(n):
        store.create(TRAINJOBS, namespace, trainjob(f"{prefix}-{i:05d}"))
