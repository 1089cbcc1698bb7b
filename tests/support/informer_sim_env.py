"""The informer against the simulated cluster (kubesim): real HTTP and resourceVersions. ``Env`` starts an
informer over TrainJobs with a recording handler; ``informer_env`` gives one on a fresh cluster and stops
the informer afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from app.kube.client import KubeClient
from app.kube.informer import Informer, InformerOptions
from app.kube.informer_telemetry import InformerTelemetry
from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.informer_fakes import Projector, Recorder
from tests.support.waiting import eventually

__all__ = ["OPTS", "Env", "informer_env", "job", "options"]

OPTS = InformerOptions(
    page_size=500,
    watch_timeout_range=(30, 30),
    inactivity_timeout=1.5,
    max_object_bytes=64 * 1024,
    backoff_base=0.05,
    backoff_cap=0.3,
    list_timeout=3.0,
    connect_timeout=1.0,
    short_watch=0.05,
)


def options(**kw: Any) -> InformerOptions:
    values = {f: getattr(OPTS, f) for f in OPTS.__dataclass_fields__}
    values.update(kw)
    return InformerOptions(**values)


def job(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }


class Env:
    def __init__(self, sim: SimulatedCluster, client: KubeClient) -> None:
        self.sim = sim
        self.client = client
        self.recorder = Recorder()
        self.informer: Informer[Any] | None = None
        self.task: asyncio.Task[None] | None = None

    def start(
        self, opts: InformerOptions = OPTS, telemetry: InformerTelemetry | None = None
    ) -> Informer[Any]:
        self.informer = Informer(
            self.client, TRAINJOBS, None, Projector(), self.recorder, options=opts, telemetry=telemetry
        )
        self.task = asyncio.create_task(self.informer.run())
        return self.informer

    def create(self, name: str, ns: str = "team1", **spec: Any) -> dict[str, Any]:
        return self.sim.store.create(TRAINJOBS, ns, job(name, **spec))

    def modify(self, name: str, ns: str = "team1", **spec: Any) -> dict[str, Any]:
        current = self.sim.store.get(TRAINJOBS, ns, name)
        current["spec"].update(spec)
        return self.sim.store.update(TRAINJOBS, ns, current)

    def delete(self, name: str, ns: str = "team1") -> dict[str, Any]:
        return self.sim.store.delete(TRAINJOBS, ns, name)

    def calls(self) -> list[tuple[Any, ...]]:
        return self.recorder.calls

    def assert_matches_store(self) -> None:
        assert self.informer is not None
        expected = {
            f"{e.key[0]}/{e.key[1]}": e.obj["metadata"]["resourceVersion"]
            for e in self.sim.store.entries(TRAINJOBS, None)
        }
        assert {k: v.resource_version for k, v in self.informer.items()} == expected

    async def watching(self) -> None:
        inf = self.informer
        assert inf is not None
        await eventually(lambda: inf.synced and inf.watching)


E = TypeVar("E", bound=Env)


@contextlib.asynccontextmanager
async def informer_env(tmp_path: Path, make: Callable[[SimulatedCluster, KubeClient], E]) -> AsyncIterator[E]:
    """A simulated cluster (30 s watches, a bookmark every 0.5 s), a client, and ``make(sim, client)``."""
    async with SimulatedCluster(watch_timeout=(30.0, 30.0), bookmark_interval=0.5) as sim:
        client = await KubeClient.connect(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))
        e = make(sim, client)
        try:
            yield e
        finally:
            if e.task is not None:
                e.task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await e.task
            await client.close()
