"""FastAPI application factory. The lifespan starts and stops everything the service runs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from app import __version__
from app.api.auth import install_auth
from app.api.docs import install_docs
from app.api.routes import install_routes
from app.config import Settings
from app.replica.extra_telemetry import service_extras
from app.replica.service import Service
from app.serving.tls import CertificateReloader

log = logging.getLogger(__name__)

# Yields the path of a kubeconfig to use instead of the configured one (the embedded simulated cluster).
ClusterFactory = Callable[[Settings], AbstractAsyncContextManager[str]]


def create_app(
    settings: Settings,
    *,
    cluster: ClusterFactory | None = None,
    tls: CertificateReloader | None = None,
    owns_process: bool = False,
) -> FastAPI:
    """``owns_process``: this app's replica is the only one in the process (the CLI), see Service."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if tls is not None:
                await stack.enter_async_context(tls.watching())
            effective = settings
            if cluster is not None:
                kubeconfig = await stack.enter_async_context(cluster(settings))
                effective = settings.model_copy(update={"kubeconfig": kubeconfig})
            service = Service(effective, owns_process=owns_process)
            stack.push_async_callback(service.stop)
            await service.start()
            # The HTTP server's and the auth reviewer's telemetry, and the namespace-existence check.
            await stack.enter_async_context(service_extras(app, service))
            app.state.service = service
            try:
                yield
            finally:
                app.state.service = None
                log.info("shutting down")

    app = FastAPI(
        title="trainer-metrics",
        version=__version__,
        description="Prometheus exporter for Kubeflow Trainer: TrainJobs, TrainingRuntimes and "
        "ClusterTrainingRuntimes, from informer caches, exported by the elected leader.",
        lifespan=lifespan,
        # FastAPI's own /docs and /redoc load their scripts from a CDN (blank in an air-gapped cluster):
        # install_docs serves a self-contained page instead.
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = None
    install_routes(app)
    install_docs(app)
    install_auth(app, settings)
    return app
