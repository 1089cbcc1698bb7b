"""Auth end to end: the real create_app (lifespan, Service, KubeClient) against a SimulatedCluster
carrying the TokenReview and SubjectAccessReview routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from app.config import Settings
from app.main import create_app
from kubesim.apiserver.http.authn import install_auth_routes
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.auth_rig import ALICE_TOKEN, PROM_TOKEN, SERVICE_TOKEN, bearer, make_registry


async def test_create_app_with_auth_against_simulated_cluster(tmp_path: Path) -> None:
    registry = make_registry()

    @contextlib.asynccontextmanager
    async def cluster(settings: Settings) -> AsyncIterator[str]:
        sim = SimulatedCluster(token=SERVICE_TOKEN)
        install_auth_routes(sim.server, registry)
        async with sim:
            yield str(sim.write_kubeconfig(tmp_path / "kubeconfig"))

    settings = Settings(auth_enabled=True, leader_election=False, auth_cache_seconds=30)
    app = create_app(settings, cluster=cluster)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://exporter") as http,
    ):
        assert (await http.get("/livez")).status_code == 200
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers=bearer(ALICE_TOKEN))).status_code == 403
        ok = await http.get("/metrics", headers=bearer(PROM_TOKEN))
        assert ok.status_code == 200
        assert ok.text.startswith("#")
        assert (await http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
        assert registry.counters == {"tokenreviews": 2, "subjectaccessreviews": 2}
