"""The chart's GPU rules and alerts (helm/trainer-metrics/files/gpu.yaml) in a real Prometheus, against the
simulated cluster's dcgm-exporter (sim/kubesim/dcgm) and the exporter's pod and per-TrainJob series: every
recorded value equals the simulated truth (/truth; constant profiles, so equal up to float rounding), in both
scrape modes of dcgm-exporter's series (honor_labels true: their own ``pod``/``namespace``; false:
``exported_pod``/``exported_namespace``), and the alerts of the idle, telemetry-less and stalled TrainJobs
fire while no healthy job's does.

The rules are the chart's own PrometheusRule, rendered by Helm with these values: the exporter's selector
``job="trainer-metrics"`` (prometheusRule.selector), dcgm-exporter's ``job="dcgm"``
(prometheusRule.gpu.dcgmSelector), each alert's ``for:`` 3s (prometheusRule.gpu.<alert>.for); thresholds
are the defaults. Two literals no value sets are rewritten for a test that lasts seconds, not minutes: the
group's ``interval: 1m`` becomes 1s (one evaluation per scrape), and the alerts' start guard ``offset 2m``
(no alert within two minutes of a job's start) becomes ``offset 2s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
import yaml

from kubesim.dcgm import SimulatedDcgmExporter
from tests.deploy.chart import CHART_DIR, Rendered
from tests.e2e.gpu_pods import gpu_pod_manifest, run_pod, run_trainjob
from tests.support.fleet import REPLICA_SETTINGS, Fleet
from tests.support.prom import Prometheus, requires_prometheus, wait_for

pytestmark = requires_prometheus

NS = "team-a"
DCGM_JOB = "dcgm"
VALUES: dict[str, Any] = {
    "prometheusRule": {
        "enabled": True,
        "selector": 'job="trainer-metrics"',
        "gpu": {
            "enabled": True,
            "dcgmSelector": f'job="{DCGM_JOB}"',
            "idle": {"for": "3s"},
            "noTelemetry": {"for": "3s"},
            "stalled": {"for": "3s"},
        },
    }
}
# (TrainJob, profile, seconds since its trainerStatus was updated, pods as (node, gpus, MIG instances))
JOBS: list[tuple[str, str, float, list[tuple[str, int, dict[str, int]]]]] = [
    ("busy", "busy", 0.0, [("gpu-1", 2, {}), ("gpu-2", 2, {})]),
    ("mig", "busy", 0.0, [("gpu-3", 0, {"1g.10gb": 2})]),
    ("idle", "idle", 0.0, [("gpu-4", 2, {})]),
    ("hung", "hung", 3600.0, [("gpu-5", 1, {})]),  # trainerStatus an hour old: past the 1800 s threshold
    ("dark", "no-telemetry", 0.0, [("gpu-6", 1, {})]),
]
EXPECTED_ALERTS = {
    ("KubeflowTrainJobGPUsIdle", "idle"),
    ("KubeflowTrainJobNoGPUTelemetry", "dark"),
    ("KubeflowTrainJobStalled", "hung"),
}
BUSY = "namespace_trainjob:kubeflow_trainer_gpu_busy:avg"
REPORTING = "namespace_trainjob:kubeflow_trainer_gpus_reporting:count"
MEMORY = "namespace_trainjob:kubeflow_trainer_gpu_memory_used:ratio"


def chart_gpu_rules() -> dict[str, Any]:
    """The GPU group of the chart's PrometheusRule, with the two test-only rewrites of the docstring."""
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = Rendered(chart.render(VALUES, name="tm", namespace="obs", is_install=True))
    groups = rendered.one("PrometheusRule")["spec"]["groups"]
    (group,) = [g for g in groups if g["name"] == "kubeflow-trainer.gpu"]
    assert group["interval"] == "1m"
    text = yaml.safe_dump({"groups": [{**group, "interval": "1s"}]})
    assert text.count("offset 2m") == 3
    loaded: dict[str, Any] = yaml.safe_load(text.replace("offset 2m", "offset 2s"))
    return loaded


class GpuPrometheus(Prometheus):
    """Scrapes the exporter (honor_labels true, as the chart's ServiceMonitor) and the simulated
    dcgm-exporter in one of its scrape modes, with the target labels of a dcgm-exporter pod."""

    def __init__(self, workdir: Path, exporter: str, dcgm: str, honor: bool, rules: Path) -> None:
        super().__init__(workdir, {"trainer-metrics": (exporter, {}), DCGM_JOB: (dcgm, {})})
        self.honor = honor
        self.rules = rules

    def config(self) -> dict[str, Any]:
        config = super().config()
        dcgm_target = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x", "container": "exporter"}
        for scrape in config["scrape_configs"]:
            if scrape["job_name"] == DCGM_JOB:
                scrape["honor_labels"] = self.honor
                scrape["static_configs"][0]["labels"] = dcgm_target
        config["rule_files"] = [str(self.rules)]
        return config


@dataclass
class Rig:
    exporter: str
    dcgm: str
    truth: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    fleet = Fleet(
        seed=39, slots=1, populate=0, max_jobs=1, settings=REPLICA_SETTINGS | {"per_trainjob_series": True}
    )
    fleet.start()
    try:
        fleet.add()

        async def start_dcgm() -> SimulatedDcgmExporter:
            assert fleet.sim is not None
            dcgm = SimulatedDcgmExporter(fleet.sim.store)
            await dcgm.start()
            return dcgm

        dcgm = fleet.run(start_dcgm)

        def create() -> None:
            assert fleet.sim is not None
            store, now = fleet.sim.store, time.time()
            for name, profile, age, pods in JOBS:
                run_trainjob(store, NS, name, profile=profile, trainer_updated=now - age)
                for index, (node, gpus, mig) in enumerate(pods):
                    run_pod(store, NS, gpu_pod_manifest(name, index, gpus=gpus, mig=mig), node)

        fleet.call(create)
        body = httpx.get(f"{dcgm.url}/truth", timeout=10).json()
        assert fleet.sockets is not None
        yield Rig(
            exporter=fleet.sockets.addresses[0],
            dcgm=dcgm.url.removeprefix("http://"),
            truth={t["trainjob"]: t for t in body["trainjobs"]},
        )
        fleet.run(dcgm.stop)
    finally:
        fleet.stop()


def recorded(prom: Prometheus, name: str, label: str) -> dict[str, float]:
    return {k[0]: v for k, v in prom.values(f'{name}{{namespace="{NS}"}}', label).items()}


@pytest.mark.parametrize("honor", [True, False], ids=["honor_labels", "exported_labels"])
def test_gpu_rules_equal_the_truth_and_the_right_alerts_fire(rig: Rig, honor: bool, tmp_path: Path) -> None:
    rules = tmp_path / "gpu.yaml"
    rules.write_text(yaml.safe_dump(chart_gpu_rules()))
    truth = rig.truth
    assert {t: truth[t]["profile"] for t in truth} == {name: profile for name, profile, _, _ in JOBS}
    reporting = {t: v for t, v in truth.items() if v["devices_reporting"]}
    prom = GpuPrometheus(tmp_path, rig.exporter, rig.dcgm, honor, rules)
    try:
        prom.start()
        wait_for(
            lambda: set(recorded(prom, REPORTING, "trainjob")) == set(reporting) or None,
            timeout=30,
            what="the recordings of every reporting TrainJob",
        )
        # The scrape mode is the one named: the workload's pod under its own name or renamed.
        renamed = prom.query(f'DCGM_FI_DEV_FB_USED{{job="{DCGM_JOB}", exported_pod!=""}}')
        assert bool(renamed) is not honor, renamed[:1]
        busy = recorded(prom, BUSY, "trainjob")
        count = recorded(prom, REPORTING, "trainjob")
        memory = recorded(prom, MEMORY, "trainjob")
        for name, t in reporting.items():
            assert count[name] == t["devices_reporting"], name
            assert busy[name] == pytest.approx(t["busy_mean"], abs=1e-12), name
            assert memory[name] == pytest.approx(t["memory_used_ratio"], abs=1e-12), name
        assert "dark" not in busy and "dark" not in memory  # no telemetry: no recorded value

        def firing() -> set[tuple[str, str]] | None:
            alerts = prom.query('ALERTS{alertstate="firing"}')
            got = {(a["metric"]["alertname"], a["metric"]["trainjob"]) for a in alerts}
            return got if got == EXPECTED_ALERTS else None

        wait_for(firing, timeout=40, what=f"exactly the alerts {sorted(EXPECTED_ALERTS)}")
        # No healthy job's alert, not even pending.
        healthy = {a["metric"]["trainjob"] for a in prom.query("ALERTS")} & {"busy", "mig"}
        assert not healthy, healthy
        print(f"recorded ({'honor' if honor else 'exported'}): busy={busy} reporting={count} memory={memory}")
    finally:
        prom.stop()
