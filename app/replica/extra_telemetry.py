"""Self-telemetry of the parts that outlive one Service: the HTTP server's guards and the bearer-token
reviewer are built with the app, the Service (and its registry) only in the lifespan.

They register a ``Collector`` on the app here; the lifespan adds every such collector to each Service's
registry (app/main.py), so their series are in /metrics next to the rest of ``trainer_metrics_*``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector
from starlette.applications import Starlette

from app.replica.namespaces import NamespaceCheck
from app.replica.service import Service


def register_collector(app: Starlette, collector: Collector) -> None:
    collectors: list[Collector] | None = getattr(app.state, "extra_collectors", None)
    if collectors is None:
        collectors = app.state.extra_collectors = []
    collectors.append(collector)


def attach_collectors(app: Starlette, registry: CollectorRegistry) -> None:
    for collector in getattr(app.state, "extra_collectors", None) or []:
        registry.register(collector)


@contextlib.asynccontextmanager
async def service_extras(app: Starlette, service: Service) -> AsyncIterator[None]:
    """For the lifespan, once ``service`` has started: its registry gets the app's collectors, and the
    configured namespaces are checked for existence (app/replica/namespaces.py) while it runs."""
    attach_collectors(app, service.registry)
    task: asyncio.Task[None] | None = None
    if service.settings.namespaces and service.client is not None:
        check = NamespaceCheck(service.client, service.settings.namespaces, service.registry)
        task = asyncio.create_task(check.run(), name="namespace check")
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
