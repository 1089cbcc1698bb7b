"""`SimulatedAPIServer`: store + faults + HTTP server on a real socket, as one async context manager."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from aiohttp import web

from kubesim.apiserver.core import NAMESPACES
from kubesim.apiserver.crds import CrdInfo
from kubesim.apiserver.http.faults import Faults
from kubesim.apiserver.http.kubeconfig import write_kubeconfig
from kubesim.apiserver.http.server import SimServer
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.storage.store import Store

log = logging.getLogger(__name__)


class SimulatedAPIServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        watch_timeout: tuple[float, float] = (1800.0, 3600.0),
        bookmark_interval: float = 60.0,
        history_window: int = 10_000,
        crds: Mapping[tuple[str, str, str], CrdInfo] | None = None,
        resources: Iterable[ResourceKind] | None = None,
        token: str | None = None,
        store: Store | None = None,
        watch_queue_size: int = 10_000,
        too_large_wait: float = 0.2,
        watchlist_defaulting: bool = False,
        rv0_ignores_limit: bool = False,
        snapshot_ttl: float = 300.0,
        auto_namespaces: bool = True,
        namespaces: tuple[str, ...] = (),
    ) -> None:
        """``auto_namespaces``: HTTP writes into a missing namespace create it (for tests of clients that
        assume their namespace exists); False answers 404 like a real apiserver. ``namespaces``: created
        up front, besides the system ones (default, kube-system, kube-public, kube-node-lease).
        ``watchlist_defaulting``: a legacy watch (resourceVersion ""/"0", no sendInitialEvents) also ends
        its initial events with the k8s.io/initial-events-end bookmark; upstream sends it only when
        sendInitialEvents=true was asked for, so the default is False."""
        self.host = host
        self.port = port
        self.store = (
            store
            if store is not None
            else Store(
                crds=crds, resources=resources, history_window=history_window, snapshot_ttl=snapshot_ttl
            )
        )
        self.faults = Faults(self.store)
        self.faults.set_token(token)
        self.server = SimServer(
            self.store,
            self.faults,
            watch_timeout=watch_timeout,
            bookmark_interval=bookmark_interval,
            watch_queue_size=watch_queue_size,
            too_large_wait=too_large_wait,
            watchlist_defaulting=watchlist_defaulting,
            rv0_ignores_limit=rv0_ignores_limit,
            auto_namespaces=auto_namespaces,
        )
        for name in namespaces:
            if not self.store.has_namespace(name):
                self.store.create(NAMESPACES, None, {"metadata": {"name": name}}, field_manager="kubectl")
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("SimulatedCluster is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        self.server.reopen()  # a no-op on first start; after stop(), live events flow again
        # handler_cancellation: a client that goes away ends its watch handler at once (no leaked streams).
        runner = web.AppRunner(
            self.server.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        address = runner.addresses[0]
        self.port = int(address[1])
        self.server.server_address = f"{self.host}:{self.port}"
        log.debug("simulated cluster listening on %s", self.url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self.faults.clear()
        self.server.close()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def write_kubeconfig(
        self, path: str | Path, *, token: str | None = None, namespace: str = "default"
    ) -> Path:
        """A kubeconfig for this cluster; the token defaults to the one the cluster currently requires."""
        return write_kubeconfig(path, self.url, token=token or self.faults.token, namespace=namespace)
