"""A watched namespace that does not exist is reported (log and trainer_metrics_namespace_missing) instead of
the exporter being silently ready with nothing for it; one that appears later is reported as found."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from app.config import Settings
from app.kube.client import KubeClient
from app.main import create_app
from app.replica.namespaces import NamespaceCheck
from kubesim.apiserver.http.kubeconfig import write_kubeconfig
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.waiting import eventually


class Namespaces:
    """GET /api/v1/namespaces/<name> on the simulated cluster, answered as the apiserver does."""

    def __init__(self, existing: set[str]) -> None:
        self.existing = existing

    def handler(self, name: str) -> web.Response | None:
        if name in self.existing:
            body = {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}}
            return web.Response(body=orjson.dumps(body), content_type="application/json")
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": f'namespaces "{name}" not found',
            "reason": "NotFound",
            "details": {"name": name, "kind": "namespaces"},
            "code": 404,
        }
        return web.Response(body=orjson.dumps(status), status=404, content_type="application/json")

    def install(self, sim: SimulatedCluster, names: list[str]) -> None:
        for name in names:

            async def handle(request: web.Request, name: str = name) -> web.StreamResponse:
                resp = self.handler(name)
                assert resp is not None
                return resp

            sim.server.add_route("GET", f"/api/v1/namespaces/{name}", handle)


def missing_gauge(text: str, ns: str) -> str | None:
    prefix = f'trainer_metrics_namespace_missing{{namespace="{ns}"}} '
    return next((line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)), None)


async def test_missing_namespace_is_logged_and_exported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    namespaces = Namespaces({"team-a"})

    @contextlib.asynccontextmanager
    async def cluster(settings: Settings) -> AsyncIterator[str]:
        sim = SimulatedCluster()
        namespaces.install(sim, ["team-a", "team-typo"])
        async with sim:
            yield str(sim.write_kubeconfig(tmp_path / "kubeconfig"))

    settings = Settings(namespaces=["team-a", "team-typo"], leader_election=False)
    app = create_app(settings, cluster=cluster)
    caplog.set_level(logging.INFO, logger="app.replica.namespaces")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://exporter") as http,
    ):

        async def metrics() -> str:
            return (await http.get("/metrics")).text

        text = await eventually(
            lambda: _when(metrics(), lambda t: missing_gauge(t, "team-typo") == "1.0"), what="missing gauge"
        )
        assert missing_gauge(text, "team-a") == "0.0"

        # Ready all the same (once its informers synced): the namespace may be created later.
        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await eventually(ready, what="ready with a namespace missing")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "namespace team-typo does not exist: nothing is watched there until it is created "
        "(check TRAINER_METRICS_NAMESPACES)"
    ]


async def _when(text: Awaitable[str], cond: Callable[[str], bool]) -> str | None:
    value = await text
    return value if cond(value) else None


@contextlib.asynccontextmanager
async def check_against(
    namespaces: Namespaces, names: list[str], tmp_path: Path
) -> AsyncIterator[NamespaceCheck]:
    sim = SimulatedCluster()
    namespaces.install(sim, names)
    async with sim:
        client = await KubeClient.connect(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            yield NamespaceCheck(client, names, CollectorRegistry())
        finally:
            await client.close()


async def test_namespace_created_later_is_reported_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.replica.namespaces")
    namespaces = Namespaces(set())
    async with check_against(namespaces, ["late"], tmp_path) as check:
        await check.check()
        await check.check()  # still missing: logged once
        assert check.missing == {"late"}
        namespaces.existing.add("late")
        await check.check()
        assert check.missing == set()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("does not exist" in m for m in messages) == 1
    assert "namespace late exists now" in messages


@pytest.mark.parametrize(
    ("status", "body", "logged"),
    [
        (404, "404 page not found", False),  # an API server (or proxy) that does not serve namespaces
        (403, '{"kind":"Status","reason":"Forbidden","code":403}', True),  # no `get` on namespaces
    ],
)
async def test_no_conclusion_without_the_api_or_the_permission(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int, body: str, logged: bool
) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=status, text=body)

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{name}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    caplog.set_level(logging.INFO, logger="app.replica.namespaces")
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        client = await KubeClient.connect(str(write_kubeconfig(tmp_path / "kubeconfig", url, token="t")))
        try:
            registry = CollectorRegistry()
            check = NamespaceCheck(client, ["team-a"], registry)
            await check.check()
            await check.check()
            assert check.missing == set()
            value = registry.get_sample_value("trainer_metrics_namespace_missing", {"namespace": "team-a"})
            assert value == 0
        finally:
            await client.close()
    finally:
        await runner.cleanup()
    cannot = [r for r in caplog.records if "cannot check" in r.getMessage()]
    assert len(cannot) == (1 if logged else 0)
