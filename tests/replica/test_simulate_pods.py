"""``trainer-metrics --simulate`` shows the pod series at once: its simulated cluster runs the pods of its
TrainJobs' JobSets (sim/kubesim/trainer/gen_pods.py), so ``/metrics`` soon has
``kubeflow_trainer_trainjob_pod_info`` and ``allocated_accelerators``, and the simulated dcgm-exporter it
starts serves per-GPU series for those pods; nobody creates a pod by hand."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_cli_e2e import start_cli, stop
from tests.support.prom import wait_for

DCGM_URL = re.compile(
    r"simulated dcgm-exporter \(GPU telemetry of the simulated pods\) at (http://\S+)/metrics"
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    workdir = tmp_path_factory.mktemp("simulate-pods")
    proc, port = start_cli(workdir)
    try:
        yield f"http://127.0.0.1:{port}", workdir / "trainer-metrics.log"
    finally:
        stop(proc)


def samples(text: str, name: str) -> list[dict[str, str]]:
    return [
        dict(s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_simulate_serves_pod_series_and_dcgm_gpu_series_of_the_simulated_pods(
    service: tuple[str, Path],
) -> None:
    url, log_path = service

    def pod_series() -> tuple[list[dict[str, str]], list[dict[str, str]]] | None:
        text = httpx.get(f"{url}/metrics", timeout=10.0).text
        info = samples(text, "kubeflow_trainer_trainjob_pod_info")
        allocated = samples(text, "kubeflow_trainer_trainjob_allocated_accelerators")
        return (info, allocated) if info and allocated else None

    info, allocated = wait_for(pod_series, timeout=90, what="pod_info and allocated_accelerators series")
    assert all(s["node"].startswith("sim-node-") and s["trainjob"] and s["pod"] for s in info)
    assert {s["accelerator_class"] for s in allocated} & {"nvidia.com/gpu", "google.com/tpu"}

    found = DCGM_URL.search(log_path.read_text(errors="replace"))
    assert found, "the simulated dcgm-exporter's address is logged"
    dcgm = found.group(1)

    def gpu_of_a_served_pod() -> dict[str, str] | None:
        text = httpx.get(f"{url}/metrics", timeout=10.0).text
        served = {
            (s["namespace"], s["pod"]): s["trainjob"]
            for s in samples(text, "kubeflow_trainer_trainjob_pod_info")
        }
        gpus = samples(httpx.get(f"{dcgm}/metrics", timeout=10.0).text, "DCGM_FI_DEV_FB_USED")
        return next((g for g in gpus if (g.get("namespace"), g.get("pod")) in served), None)

    gpu = wait_for(gpu_of_a_served_pod, timeout=60, what="a dcgm GPU series of a pod pod_info shows")
    assert gpu["UUID"].startswith("GPU-") and gpu["gpu"].isdigit() and gpu["container"]
