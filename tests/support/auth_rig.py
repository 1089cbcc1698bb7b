"""The auth and TLS tests' rig (fixtures, imported by their conftest.py): a tiny API server with only the
review routes, a KubeClient on it, the service's real routes behind BearerAuth (stub state), and self-signed
certificates from openssl."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI

from app.api.auth import BearerAuth, KubeReviewer
from app.api.models import LeadershipResponse, SnapshotResponse, TerminalPage
from app.api.routes import install_routes
from app.kube.client import KubeClient
from kubesim.apiserver.http.authn import TokenRegistry, install_auth_routes
from kubesim.apiserver.http.kubeconfig import write_kubeconfig

PROM_TOKEN = "prom-token"  # allowed /metrics
ALICE_TOKEN = "alice-token"  # authenticated, no permission
OPS_TOKEN = "ops-token"  # group "ops": /debug/*
SERVICE_TOKEN = "exporter-sa-token"  # what the exporter itself uses against the API


class StubView:
    """Just enough of the service for the routes; debug endpoints off so an allowed /debug/* is a 404."""

    terminal_page_max = 10
    debug_endpoints = False

    def __init__(self, client: KubeClient | None = None) -> None:
        self.client = client

    def liveness_problems(self) -> list[str]:
        return []

    def readiness_problems(self) -> list[str]:
        return []

    async def render_metrics(
        self, accept: str | None, accept_encoding: str | None
    ) -> tuple[bytes, dict[str, str]]:
        return b"# HELP up ok\nup 1\n", {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    def snapshot(self) -> SnapshotResponse:
        raise AssertionError("debug endpoints are off")

    def terminal_page(self, limit: int, continue_token: str | None) -> TerminalPage:
        raise AssertionError("debug endpoints are off")

    def leadership(self) -> LeadershipResponse:
        raise AssertionError("debug endpoints are off")


def make_registry() -> TokenRegistry:
    registry = TokenRegistry()
    registry.add_service_account(PROM_TOKEN, "monitoring", "prometheus")
    registry.add_user(ALICE_TOKEN, "alice")
    registry.add_user(OPS_TOKEN, "bob", groups=["ops"])
    registry.allow(name="metrics-reader", paths=["/metrics"], service_accounts=["monitoring/prometheus"])
    registry.allow(name="debug-reader", paths=["/debug/*"], groups=["ops"])
    return registry


class ApiServer:
    """An aiohttp API server with only TokenReview and SubjectAccessReview, checking the caller's token."""

    def __init__(self, registry: TokenRegistry) -> None:
        self.registry = registry
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        @web.middleware
        async def caller_auth(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bearer {SERVICE_TOKEN}":
                return web.json_response(
                    {"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401
                )
            resp: web.StreamResponse = await handler(request)
            return resp

        app = web.Application(middlewares=[caller_auth])
        install_auth_routes(app, self.registry)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def registry() -> TokenRegistry:
    return make_registry()


@pytest.fixture
async def api_server(registry: TokenRegistry) -> AsyncIterator[ApiServer]:
    server = ApiServer(registry)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def connect(url: str, tmp_path: Path, token: str = SERVICE_TOKEN) -> KubeClient:
    path = write_kubeconfig(tmp_path / f"kubeconfig-{token}", url, token=token)
    return await KubeClient.connect(str(path))


@pytest.fixture
async def kube(api_server: ApiServer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await connect(api_server.url, tmp_path)
    try:
        yield client
    finally:
        await client.close()


def protected_app(reviewer: Any, view: Any = None) -> FastAPI:
    """The service's real routes behind BearerAuth, with a stub service view (no lifespan needed)."""
    app = FastAPI()
    install_routes(app)
    app.state.service = view if view is not None else StubView()
    app.add_middleware(BearerAuth, reviewer=reviewer)
    return app


@dataclass
class Harness:
    reviewer: KubeReviewer
    http: httpx.AsyncClient


@pytest.fixture
async def harness(kube: KubeClient) -> AsyncIterator[Harness]:
    reviewer = KubeReviewer(kube, cache_seconds=30)
    app = protected_app(reviewer)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://exporter") as http:
        yield Harness(reviewer, http)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------------------------- certificates

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path
    serial: int

    @property
    def cert_pem(self) -> str:
        return self.cert.read_text()


def make_cert(directory: Path, serial: int, cn: str = "localhost") -> CertPair:
    """A self-signed P-256 certificate for 127.0.0.1/localhost (fast to generate, valid one day)."""
    if OPENSSL is None:
        pytest.skip("openssl CLI not available")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [
            OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={cn}",
            "-set_serial", str(serial), "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return CertPair(cert, key, serial)
