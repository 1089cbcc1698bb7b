"""The simulated dcgm-exporter's /metrics, parsed with prometheus_client's parser: dcgm-exporter's names and
labels (NVIDIA/dcgm-exporter etc/default-counters.csv, internal/pkg/rendermetrics/render_metrics.go), MIG
instances as devices of their own, the profiling fields off, the profiles, and /truth."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubesim.apiserver.core import PODS
from kubesim.dcgm import SimulatedDcgmExporter
from kubesim.trainer.cluster import SimulatedCluster
from tests.e2e.gpu_pods import finish_pod, gpu_pod_manifest, run_pod, run_trainjob

NS = "team-a"
GPU_LABELS = {
    "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
    "container", "namespace", "pod", "DCGM_FI_DRIVER_VERSION",
}  # fmt: skip
MIG_LABELS = GPU_LABELS | {"GPU_I_PROFILE", "GPU_I_ID"}
FIELDS = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
]


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"load_runtimes": True}


def families(dcgm: SimulatedDcgmExporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(dcgm.exposition()):
        assert family.type == "gauge", family.name
        out[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return out


def truth(dcgm: SimulatedDcgmExporter) -> dict[str, dict[str, Any]]:
    return {t["trainjob"]: t for t in dcgm.truth()["trainjobs"]}  # type: ignore[attr-defined]


async def test_names_and_labels_are_dcgm_exporters(sim: SimulatedCluster) -> None:
    run_trainjob(sim.store, NS, "llama", profile="busy", trainer_updated=None)
    pod = run_pod(sim.store, NS, gpu_pod_manifest("llama", 0, gpus=2), "gpu-node-1")
    dcgm = SimulatedDcgmExporter(sim.store)
    got = families(dcgm)
    assert list(got) == FIELDS
    for name in FIELDS:
        assert [set(labels) for labels, _ in got[name]] == [GPU_LABELS, GPU_LABELS], name
    labels = [labels for labels, _ in got["DCGM_FI_DEV_GPU_UTIL"]]
    assert [(x["gpu"], x["device"]) for x in labels] == [("0", "nvidia0"), ("1", "nvidia1")]
    assert len({x["UUID"] for x in labels}) == 2 and all(x["UUID"].startswith("GPU-") for x in labels)
    assert {(x["pod"], x["namespace"], x["container"], x["Hostname"]) for x in labels} == {
        (pod["metadata"]["name"], NS, "node", "gpu-node-1")
    }
    assert [v for _, v in got["DCGM_FI_DEV_GPU_UTIL"]] == [91, 91]
    assert [v for _, v in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] == [0.82, 0.82]
    used = [v for _, v in got["DCGM_FI_DEV_FB_USED"]]
    free = [v for _, v in got["DCGM_FI_DEV_FB_FREE"]]
    assert [u + f for u, f in zip(used, free, strict=True)] == [81920, 81920]
    # The label order of dcgm-exporter's template: device identity, host, the pod mapper's, attributes.
    line = next(x for x in dcgm.exposition().splitlines() if x.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    keys = [part.split("=")[0] for part in line[line.index("{") + 1 : line.index("}")].split('",')]
    assert keys == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "container", "namespace",
                    "pod", "DCGM_FI_DRIVER_VERSION"]  # fmt: skip
    assert truth(dcgm)["llama"] == {
        "namespace": NS,
        "trainjob": "llama",
        "profile": "busy",
        "devices_held": 2,
        "devices_reporting": 2,
        "busy_mean": 0.82,
        "memory_used_ratio": sum(used) / (sum(used) + sum(free)),
    }


async def test_mig_instances_are_devices_of_their_own(sim: SimulatedCluster) -> None:
    run_trainjob(sim.store, NS, "mig", profile="idle", trainer_updated=None)
    run_pod(sim.store, NS, gpu_pod_manifest("mig", 0, mig={"1g.10gb": 3}), "gpu-node-1")
    run_pod(sim.store, NS, gpu_pod_manifest("mig", 1, mig={"1g.10gb": 2}), "gpu-node-1")
    dcgm = SimulatedDcgmExporter(sim.store)
    got = families(dcgm)
    # NVML reports no utilisation per GPU instance: GPU_UTIL has no MIG series.
    assert got["DCGM_FI_DEV_GPU_UTIL"] == []
    active = got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert all(set(labels) == MIG_LABELS for labels, _ in active)
    # Five instances of one MIG-mode GPU (seven fit): one UUID, five GPU_I_IDs, two pods.
    assert len({labels["UUID"] for labels, _ in active}) == 1
    assert sorted(labels["GPU_I_ID"] for labels, _ in active) == ["1", "2", "3", "4", "5"]
    assert {labels["GPU_I_PROFILE"] for labels, _ in active} == {"1g.10gb"}
    assert len({labels["pod"] for labels, _ in active}) == 2
    assert [v for _, v in active] == [0.01] * 5
    t = truth(dcgm)["mig"]
    assert (t["devices_held"], t["devices_reporting"], t["busy_mean"]) == (5, 5, 0.01)


async def test_profiling_off_leaves_out_the_profiling_fields(sim: SimulatedCluster) -> None:
    run_trainjob(sim.store, NS, "full", profile="busy", trainer_updated=None)
    run_trainjob(sim.store, NS, "mig", profile="busy", trainer_updated=None)
    run_pod(sim.store, NS, gpu_pod_manifest("full", 0, gpus=4), "gpu-node-1")
    run_pod(sim.store, NS, gpu_pod_manifest("mig", 0, mig={"2g.20gb": 1}), "gpu-node-1")
    dcgm = SimulatedDcgmExporter(sim.store, profiling=False, host_label="hostname")
    got = families(dcgm)
    assert list(got) == FIELDS[:3]
    assert all("hostname" in labels and "Hostname" not in labels for labels, _ in got["DCGM_FI_DEV_FB_USED"])
    t = truth(dcgm)
    # GPU_UTIL / 100 without the profiling field; the MIG instance then has no busy value at all.
    assert (t["full"]["devices_reporting"], t["full"]["busy_mean"]) == (4, 0.91)
    assert (t["mig"]["devices_held"], t["mig"]["devices_reporting"], t["mig"]["busy_mean"]) == (1, 0, None)
    assert t["mig"]["memory_used_ratio"] == 0.75


async def test_only_bound_unfinished_pods_hold_devices(sim: SimulatedCluster) -> None:
    run_trainjob(sim.store, NS, "llama", profile="busy", trainer_updated=None)
    run_pod(sim.store, NS, gpu_pod_manifest("llama", 0, gpus=1), "n1")
    done = run_pod(sim.store, NS, gpu_pod_manifest("llama", 1, gpus=1), "n1")
    finish_pod(sim.store, NS, done["metadata"]["name"])
    failed = run_pod(sim.store, NS, gpu_pod_manifest("llama", 2, gpus=1), "n1")
    finish_pod(sim.store, NS, failed["metadata"]["name"], "Failed")
    sim.store.create(PODS, NS, gpu_pod_manifest("llama", 3, gpus=1))  # never bound
    # Requests win over limits; a shared GPU replica and a malformed quantity are no DCGM devices.
    odd = gpu_pod_manifest("llama", 4, gpus=8)
    odd["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "8", "nvidia.com/gpu.shared": "1", "nvidia.com/mig-bogus": "1"},
    }
    bad = {"name": "bad", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}
    odd["spec"]["containers"].append(bad)
    run_pod(sim.store, NS, odd, "n2")
    dcgm = SimulatedDcgmExporter(sim.store)
    used = families(dcgm)["DCGM_FI_DEV_FB_USED"]
    pods = sorted({(labels["pod"], labels["Hostname"]) for labels, _ in used})
    assert pods == [("llama-node-0-0-x0000", "n1"), ("llama-node-0-4-x0004", "n2")]
    assert truth(dcgm)["llama"]["devices_held"] == 3


async def test_profiles_choose_what_a_jobs_gpus_report(
    sim: SimulatedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    for name, profile in [("idle", "idle"), ("hung", "hung"), ("dark", "no-telemetry"), ("odd", "sleepy")]:
        run_trainjob(sim.store, NS, name, profile=profile, trainer_updated=None)
        run_pod(sim.store, NS, gpu_pod_manifest(name, 0, gpus=1), f"node-{name}")
    dcgm = SimulatedDcgmExporter(sim.store)
    with caplog.at_level(logging.WARNING, logger="kubesim.dcgm.server"):
        got = families(dcgm)
        t = truth(dcgm)
    busy = {labels["pod"].split("-")[0]: v for labels, v in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]}
    assert busy["idle"] == 0.01 and busy["hung"] == 0.97 and "dark" not in busy
    assert (t["dark"]["profile"], t["dark"]["devices_held"], t["dark"]["devices_reporting"]) == (
        "no-telemetry", 1, 0,
    )  # fmt: skip
    assert t["dark"]["busy_mean"] is None and t["dark"]["memory_used_ratio"] is None
    # An annotation naming no profile: the job's hashed one, and one warning however often it is read.
    assert t["odd"]["profile"] in {"busy", "idle", "hung", "no-telemetry"}
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "sleepy" in caplog.records[0].getMessage()


async def test_served_over_http(sim: SimulatedCluster) -> None:
    run_trainjob(sim.store, NS, "llama", profile="busy", trainer_updated=None)
    run_pod(sim.store, NS, gpu_pod_manifest("llama", 0, gpus=1), "n1")
    async with SimulatedDcgmExporter(sim.store) as dcgm, httpx.AsyncClient(base_url=dcgm.url) as http:
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "DCGM_FI_DEV_GPU_UTIL{" in metrics.text
        body = (await http.get("/truth")).json()
        assert body["profiling"] is True
        assert [(j["trainjob"], j["devices_reporting"]) for j in body["trainjobs"]] == [("llama", 1)]
