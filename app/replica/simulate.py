"""``trainer-metrics --simulate``: the embedded simulated cluster and its workload generator.

Kept apart from the service's core: the service only ever sees a kubeconfig that points at a real
HTTP API server, exactly as it would in a cluster. The only module of ``app`` that imports the simulated
cluster (``kubesim``, a distribution of its own: ``pip install ./sim``); a deployed exporter does not have it,
and ``--simulate`` then stops with one line saying how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config import Settings

if TYPE_CHECKING:
    from kubesim.trainer.cluster import SimulatedCluster
    from kubesim.trainer.settings import SimSettings

log = logging.getLogger(__name__)

# dcgm-exporter's own port: a local Prometheus scrapes the simulated one at 127.0.0.1:9400 (README, "GPU use
# per TrainJob, locally"); when it is taken, a free port, logged.
DCGM_PORT = 9400

NOT_INSTALLED = (
    "--simulate needs the simulated cluster, which is not installed "
    "(from a checkout: pip install ./sim; a production image leaves it out)"
)


class SimulateError(Exception):
    """``--simulate`` cannot start: the simulated cluster is not installed, or a setting of its workload is
    invalid. The message is one line."""


def load_simulation(**overrides: Any) -> SimSettings:
    """The demo workload's settings (TRAINER_METRICS_SIM_* and ``overrides``); raises
    :class:`SimulateError`."""
    try:
        from kubesim.trainer.settings import SimSettingsError, load_sim_settings
    except ImportError as exc:
        raise SimulateError(NOT_INSTALLED) from exc
    try:
        return load_sim_settings(**overrides)
    except SimSettingsError as exc:
        raise SimulateError(str(exc)) from None


@contextlib.asynccontextmanager
async def embedded_cluster(settings: Settings, sim_settings: SimSettings | None = None) -> AsyncIterator[str]:
    """Run a simulated cluster on loopback with a generator; yield the kubeconfig path for the service.

    ``sim_settings`` default to the TRAINER_METRICS_SIM_* environment.
    """
    from kubesim.trainer.cluster import SimulatedCluster
    from kubesim.trainer.generator import WorkloadGenerator
    from kubesim.trainer.settings import unknown_sim_env_vars

    workload = sim_settings if sim_settings is not None else load_simulation()
    for name in unknown_sim_env_vars():
        log.warning("ignoring %s: no such simulate-mode setting", name)
    with tempfile.TemporaryDirectory(prefix="trainer-metrics-sim-") as tmp:
        sim = SimulatedCluster(host="127.0.0.1", port=0)
        if settings.auth_enabled:
            _install_demo_auth(sim)
        async with sim:
            kubeconfig = sim.write_kubeconfig(Path(tmp) / "kubeconfig")
            # No references to unregistered runtime kinds (a bypassed webhook's odd jobs): each would be
            # logged as a warning, the first lines a newcomer reads.
            # The pods of the jobs' JobSets too: the pod series and the dcgm-exporter's GPUs show at once.
            generator = WorkloadGenerator(
                sim.store,
                seed=workload.seed,
                max_jobs=max(1, workload.jobs),
                unregistered_ratio=0.0,
                pods=True,
            )
            runtimes = generator.load_runtimes()
            # Some jobs exist before the service starts (its initial list), the rest arrive live.
            generator.populate(workload.jobs // 2)
            log.info(
                "simulated cluster at %s: %d runtimes, %d TrainJobs, generator at %.1f steps/s",
                sim.url,
                len(runtimes),
                workload.jobs // 2,
                workload.rate,
            )
            stop = asyncio.Event()
            task = None
            if workload.rate > 0:
                task = asyncio.create_task(generator.run(workload.rate, stop), name="sim generator")
            try:
                async with _dcgm_exporter(sim):
                    yield str(kubeconfig)
            finally:
                stop.set()
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task


@contextlib.asynccontextmanager
async def _dcgm_exporter(sim: SimulatedCluster) -> AsyncIterator[None]:
    """The simulated cluster's NVIDIA dcgm-exporter (GPU telemetry of its pods) on DCGM_PORT, else on a free
    port; its address logged, for a local Prometheus to scrape beside the service."""
    from kubesim.dcgm import SimulatedDcgmExporter

    dcgm = SimulatedDcgmExporter(sim.store, "127.0.0.1", DCGM_PORT)
    try:
        await dcgm.start()
    except OSError as exc:
        log.info(
            "port %d is taken (%s): the simulated dcgm-exporter takes a free one", DCGM_PORT, exc.strerror
        )
        dcgm = SimulatedDcgmExporter(sim.store, "127.0.0.1", 0)
        await dcgm.start()
    log.info("simulated dcgm-exporter (GPU telemetry of the simulated pods) at %s/metrics", dcgm.url)
    try:
        yield
    finally:
        await dcgm.stop()


DEMO_SCRAPER_TOKEN = "demo-scraper-token"


def _install_demo_auth(sim: SimulatedCluster) -> None:
    """With auth on, the simulated cluster reviews tokens too: one demo token may read everything."""
    from kubesim.apiserver.http.authn import TokenRegistry, install_auth_routes

    registry = TokenRegistry()
    registry.add_service_account(DEMO_SCRAPER_TOKEN, "monitoring", "prometheus")
    registry.allow(paths=["/metrics", "/debug/*"], service_accounts=["monitoring/prometheus"])
    install_auth_routes(sim.server, registry)
    log.info("auth is on: try curl -H 'Authorization: Bearer %s' .../metrics", DEMO_SCRAPER_TOKEN)
