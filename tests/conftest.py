"""Fixtures shared by the whole suite: the simulated cluster, its kubeconfig and a workload generator.

Configure them per module (or per directory conftest) by overriding the options fixtures::

    @pytest.fixture
    def sim_options() -> dict[str, Any]:
        return {"load_runtimes": True}

Helpers that are not fixtures (condition waits, service replicas, recording sinks) are in tests/support.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator


@pytest.fixture
def sim_options() -> dict[str, Any]:
    """Keyword arguments of ``SimulatedCluster`` for the ``sim`` fixture (defaults: a bare cluster)."""
    return {}


@pytest.fixture
async def sim(sim_options: dict[str, Any]) -> AsyncIterator[SimulatedCluster]:
    """A simulated Kubernetes API server on a free local port, for one test."""
    async with SimulatedCluster(**sim_options) as cluster:
        yield cluster


@pytest.fixture
def kubeconfig(sim: SimulatedCluster, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at ``sim``."""
    return sim.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def workload_options() -> dict[str, Any]:
    """Keyword arguments of ``WorkloadGenerator`` for the ``workload`` fixture, plus ``populate`` (TrainJobs
    written before the test starts, default 40) and ``load_runtimes`` (upstream runtimes, default True)."""
    return {}


@pytest.fixture
def workload(sim: SimulatedCluster, workload_options: dict[str, Any]) -> WorkloadGenerator:
    """A seeded workload generator writing into ``sim``'s store (seed 7 unless the options say otherwise)."""
    options = dict(workload_options)
    populate = int(options.pop("populate", 40))
    load_runtimes = bool(options.pop("load_runtimes", True))
    options.setdefault("seed", 7)
    gen = WorkloadGenerator(sim.store, **options)
    if load_runtimes:
        gen.load_runtimes()
    if populate:
        gen.populate(populate)
    return gen
