"""`SimulatedDcgmExporter`: NVIDIA dcgm-exporter for the simulated cluster, on a real socket.

``/metrics`` serves, at each request, the devices of the pods the API server's storage holds now
(``kubesim.dcgm.devices``: whoever created them), each reading its TrainJob's profile
(``kubesim.dcgm.profiles``); ``/truth`` the values per TrainJob the chart's GPU rules must compute from it
(``kubesim.dcgm.telemetry``). Runs on the store's event loop (the store is not thread-safe).
"""

from __future__ import annotations

import json
import logging
from types import TracebackType
from typing import Self

from aiohttp import web

from kubesim.apiserver.core import PODS
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.store import Store
from kubesim.dcgm.devices import devices
from kubesim.dcgm.exposition import CONTENT_TYPE, render
from kubesim.dcgm.profiles import PROFILE_ANNOTATION, Profile, parse_profile
from kubesim.dcgm.telemetry import Read, job_truths, readings
from kubesim.trainer.kinds import TRAINJOBS

log = logging.getLogger(__name__)


class SimulatedDcgmExporter:
    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        profiling: bool = True,
        host_label: str = "Hostname",
    ) -> None:
        """``profiling``: serve DCGM_FI_PROF_GR_ENGINE_ACTIVE (off: as on GPUs or setups without DCGM
        profiling). ``host_label``: ``Hostname`` (dcgm-exporter 4.x) or ``hostname`` (its main branch)."""
        self.store = store
        self.host = host
        self.port = port
        self.profiling = profiling
        self.host_label = host_label
        self._bad_annotations: set[tuple[str, str, str]] = set()
        self.app = web.Application()
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/truth", self._truth)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("SimulatedDcgmExporter is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # --- what it serves ------------------------------------------------------------------------------
    def lookup(self, namespace: str, trainjob: str) -> Profile | None:
        """The profile the TrainJob's annotation names (None: no such TrainJob, no or a bad annotation; a
        bad one is logged once per value)."""
        try:
            job = self.store.get(TRAINJOBS, namespace, trainjob, copy=False)
        except StoreError:
            return None
        annotations = (job.get("metadata") or {}).get("annotations")
        value = annotations.get(PROFILE_ANNOTATION) if isinstance(annotations, dict) else None
        profile = parse_profile(value)
        if (
            value is not None
            and profile is None
            and (key := (namespace, trainjob, str(value))) not in (self._bad_annotations)
        ):
            self._bad_annotations.add(key)
            log.warning(
                "TrainJob %s/%s: %s=%r names no profile (%s); using its hashed one",
                namespace,
                trainjob,
                PROFILE_ANNOTATION,
                value,
                ", ".join(p.value for p in Profile),
            )
        return profile

    def _read(self) -> list[Read]:
        return readings(devices(e.obj for e in self.store.entries(PODS, None)), self.lookup)

    def exposition(self) -> str:
        read = self._read()
        reported = [(d, r) for d, _p, r in read if r is not None]
        return render(reported, profiling=self.profiling, host_label=self.host_label)

    def truth(self) -> dict[str, object]:
        read = self._read()
        return {
            "profiling": self.profiling,
            "trainjobs": [t.as_json() for t in job_truths(read, profiling=self.profiling)],
        }

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.exposition().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _truth(self, _request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(self.truth()).encode(), content_type="application/json")

    # --- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.debug("simulated dcgm-exporter listening on %s", self.url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
