"""Report watched namespaces that do not exist.

Listing TrainJobs in a namespace that does not exist is not an error for the API server: it answers an
empty list, so a typo in ``TRAINER_METRICS_NAMESPACES`` would leave the exporter ready and exporting
nothing for that namespace. This asks for each configured namespace (``GET /api/v1/namespaces/<name>``)
at start and then once a minute: a missing one is logged (once, and again when it appears) and exported as
``trainer_metrics_namespace_missing{namespace} 1``. Readiness is not affected: the namespace may be created
later, and the informers pick up its objects when it is.

The check needs ``get`` on namespaces. Without it (403) it says so once in the log and the gauge stays 0;
the Helm chart does not need it, because it creates a Role in each watched namespace, which fails at install
time when the namespace does not exist.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge

from app.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

CHECK_INTERVAL = 60.0
_REQUEST_TIMEOUT = 10.0


class NamespaceCheck:
    """Checks ``namespaces`` through ``client``; ``run()`` until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        namespaces: Sequence[str],
        registry: CollectorRegistry,
        *,
        interval: float = CHECK_INTERVAL,
    ) -> None:
        self._client = client
        self._namespaces = list(namespaces)
        self._interval = interval
        self.missing: set[str] = set()
        self._unknown_logged = False
        self._gauge = Gauge(
            "trainer_metrics_namespace_missing",
            "1 while a namespace in TRAINER_METRICS_NAMESPACES does not exist (nothing there is watched).",
            ("namespace",),
            registry=registry,
        )
        for ns in self._namespaces:
            self._gauge.labels(ns).set(0)

    async def check(self) -> None:
        """One round over every namespace."""
        for ns in self._namespaces:
            exists = await self._exists(ns)
            if exists is None:
                continue
            if not exists and ns not in self.missing:
                self.missing.add(ns)
                log.warning(
                    "namespace %s does not exist: nothing is watched there until it is created "
                    "(check TRAINER_METRICS_NAMESPACES)",
                    ns,
                )
            elif exists and ns in self.missing:
                self.missing.discard(ns)
                log.info("namespace %s exists now", ns)
            self._gauge.labels(ns).set(0 if exists else 1)

    async def _exists(self, ns: str) -> bool | None:
        """True/False, or None when the API does not say (no permission, unreachable)."""
        try:
            await self._client.request_json("GET", f"/api/v1/namespaces/{ns}", timeout=_REQUEST_TIMEOUT)
        except ApiError as exc:
            # A missing namespace is a 404 Status naming the kind; a 404 without it is an API server that
            # does not serve namespaces at all (a proxy, a partial fake): no conclusion.
            if exc.status == 404 and exc.details.get("kind") == "namespaces":
                return False
            if exc.status in (401, 403) and not self._unknown_logged:
                self._unknown_logged = True
                log.info(
                    "cannot check that the watched namespaces exist (%s); grant get on namespaces to have "
                    "missing ones reported",
                    exc.reason or exc.status,
                )
            return None
        return True

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # a bug here must not end the task: it only reports
                log.exception("checking the watched namespaces failed")
            await asyncio.sleep(self._interval)
