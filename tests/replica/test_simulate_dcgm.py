"""``--simulate`` serves the simulated cluster's dcgm-exporter on dcgm-exporter's port 9400, or on a free port
when 9400 is taken, and says where in its log."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from typing import Any

import httpx
import pytest

from app.replica import simulate
from kubesim.trainer.cluster import SimulatedCluster
from tests.e2e.gpu_pods import gpu_pod_manifest, run_pod, run_trainjob


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"load_runtimes": True}


async def test_simulate_serves_dcgm_exporter_on_a_free_port_when_9400_is_taken(
    sim: SimulatedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    run_trainjob(sim.store, "team-a", "llama", profile="busy", trainer_updated=None)
    run_pod(sim.store, "team-a", gpu_pod_manifest("llama", 0, gpus=1), "gpu-1")
    holder = socket.socket()
    with contextlib.suppress(OSError):  # already taken by someone else: the same case
        holder.bind(("127.0.0.1", simulate.DCGM_PORT))
        holder.listen()
    try:
        with caplog.at_level(logging.INFO, logger="app.replica.simulate"):
            async with simulate._dcgm_exporter(sim):
                urls = [
                    m[1]
                    for r in caplog.records
                    if (m := re.search(r"at (http://\S+)/metrics", r.getMessage()))
                ]
                assert len(urls) == 1 and not urls[0].endswith(f":{simulate.DCGM_PORT}"), urls
                async with httpx.AsyncClient() as http:
                    body = (await http.get(f"{urls[0]}/metrics")).text
                assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in body and 'pod="llama-node-0-0-x0000"' in body
    finally:
        holder.close()
