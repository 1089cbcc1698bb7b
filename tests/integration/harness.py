"""Run service replicas against a simulated cluster inside one test, and read their metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.main import create_app
from app.service import Service

FAST_TIMINGS: dict[str, Any] = {
    "lease_duration_seconds": 1.5,
    "renew_deadline_seconds": 1.0,
    "retry_period_seconds": 0.2,
    "watch_timeout_min_seconds": 20,
    "watch_timeout_max_seconds": 30,
    "watch_inactivity_timeout_seconds": 5.0,
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(
        v for (n, labels), v in samples.items() if n == name and all(dict(labels).get(k) == m for k, m in match.items())
    )


def by_labels(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            d = dict(labels)
            k = tuple(d.get(key, "") for key in keys)
            out[k] = out.get(k, 0.0) + v
    return out


@dataclass
class Replica:
    service: Service
    http: httpx.AsyncClient

    @property
    def identity(self) -> str:
        return self.service.settings.identity

    async def metrics_text(self) -> str:
        resp = await self.http.get("/metrics")
        resp.raise_for_status()
        return resp.text

    async def samples(self) -> Samples:
        return parse_samples(await self.metrics_text())

    async def exporting(self) -> bool:
        return "kubeflow_trainer_" in await self.metrics_text()

    async def ready(self) -> bool:
        return (await self.http.get("/readyz")).status_code == 200


def settings_for(kubeconfig: Path, identity: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "kubeconfig": str(kubeconfig),
        "identity": identity,
        "lease_namespace": "default",
        **FAST_TIMINGS,
    }
    values.update(overrides)
    return Settings(**values)


@asynccontextmanager
async def replica(kubeconfig: Path, identity: str = "replica-a", **overrides: Any) -> AsyncIterator[Replica]:
    settings = settings_for(kubeconfig, identity, **overrides)
    service = Service(settings)
    app = create_app(settings)
    await service.start()
    app.state.service = service
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
            yield Replica(service, http)
    finally:
        await service.stop()


async def eventually(
    check: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
