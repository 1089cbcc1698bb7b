"""The GPU rules (helm/trainer-metrics/files/gpu.yaml): NVIDIA dcgm-exporter's per-GPU series joined to
TrainJobs through kubeflow_trainer_trainjob_pod_info, unit-tested by ``promtool test rules`` in both scrape
modes, and carried by the chart's PrometheusRule with prometheusRule.gpu.

dcgm-exporter's names, from NVIDIA/dcgm-exporter (main, d5e5f51; release 4.5.3-4.8.2):
- etc/default-counters.csv: DCGM_FI_DEV_GPU_UTIL (gauge, %), DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE
  (gauge, MiB), DCGM_FI_PROF_GR_ENGINE_ACTIVE (gauge, ratio; a profiling field, off on GPUs or setups without
  DCGM profiling);
- internal/pkg/rendermetrics/render_metrics.go: every GPU series has gpu, UUID, pci_bus_id, device, modelName,
  GPU_I_PROFILE and GPU_I_ID on a MIG instance only, and the host as `Hostname` (4.5.3-4.8.2 and before) or
  `hostname` (main);
- internal/pkg/transformation/const.go and kubernetes.go (the pod mapper): a device held by a pod gets `pod`,
  `namespace`, `container` (and `pod_uid`); with honor_labels false Prometheus renames these `exported_pod`,
  `exported_namespace`, `exported_container`, and `pod`/`namespace`/`container` are the dcgm-exporter pod's.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from .chart import CHART_DIR, ROOT, RenderFn, load_yaml
from .test_monitoring import (
    ALERTS_FILE,
    DASHBOARD_FILE,
    PROMETHEUS_RULE_SCHEMA,
    RECORDED_SERIES,
    RUNBOOK_TOKEN,
    RUNBOOKS,
    SELECTOR_TOKEN,
    alert_rules,
    all_panels,
    github_anchors,
    matchers,
    promtool,
    selectors_and_groupings,
)

GPU_FILE = CHART_DIR / "files" / "gpu.yaml"
DCGM_TOKEN = 'job="nvidia-dcgm-exporter"'
ON_TOKEN = "on (cluster, "
GPU_ALERTS = ("KubeflowTrainJobGPUsIdle", "KubeflowTrainJobNoGPUTelemetry", "KubeflowTrainJobStalled")
# The literals of each alert's expr the chart rewrites from prometheusRule.gpu, with their defaults.
THRESHOLDS = {
    "KubeflowTrainJobGPUsIdle": {"< 0.05": ("idle", "busyBelow")},
    "KubeflowTrainJobNoGPUTelemetry": {},
    "KubeflowTrainJobStalled": {
        "> 0.5": ("stalled", "busyAbove"),
        "> 1800": ("stalled", "trainerStatusAgeSeconds"),
    },
}
FOR_VALUES = {
    "KubeflowTrainJobGPUsIdle": "idle",
    "KubeflowTrainJobNoGPUTelemetry": "noTelemetry",
    "KubeflowTrainJobStalled": "stalled",
}
R1 = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"
R2 = "trainer.kubeflow.org/TrainingRuntime/team-b/deepspeed"

# --- input series ------------------------------------------------------------------------------------------

Mode = Literal["honor", "exported"]


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _exporter(replica: str, job: str = "trainer-metrics") -> dict[str, str]:
    """Target labels of one exporter replica (honorLabels: the series' own namespace and pod win)."""
    return {"job": job, "instance": f"10.1.0.{ord(replica) - 96}:8080", "container": "trainer-metrics"}


@dataclass
class Cluster:
    """Builds the input series of one scenario: the exporter's and dcgm-exporter's, as Prometheus stores them
    in one scrape mode."""

    mode: Mode
    host_label: str = "Hostname"
    exporter_job: str = "trainer-metrics"
    dcgm_job: str = "nvidia-dcgm-exporter"
    extra: dict[str, str] = field(default_factory=dict)  # e.g. a global ruler's cluster label
    series: list[dict[str, str]] = field(default_factory=list)

    def pod_info(
        self,
        trainjob: str,
        pod: str,
        values: str,
        *,
        ns: str = "team-a",
        runtime: str = R1,
        replica: str = "a",
    ) -> None:
        labels = {
            **_exporter(replica, self.exporter_job),
            **self.extra,
            "namespace": ns,
            "trainjob": trainjob,
            "pod": pod,
            "node": f"node-{pod[-1]}",
            "replicated_job": "node",
            "runtime_ref": runtime,
        }
        self.series.append(_series("kubeflow_trainer_trainjob_pod_info", labels, values))

    def _job_series(self, replica: str, ns: str, trainjob: str) -> dict[str, str]:
        # Per-TrainJob series have no pod label of their own: `pod` is the replica's target label.
        return {
            **_exporter(replica, self.exporter_job),
            **self.extra,
            "pod": f"tm-trainer-metrics-{replica}",
            "namespace": ns,
            "trainjob": trainjob,
        }

    def state(
        self, trainjob: str, values: str, *, state: str = "running", ns: str = "team-a", replica: str = "a"
    ) -> None:
        labels = {**self._job_series(replica, ns, trainjob), "state": state}
        self.series.append(_series("kubeflow_trainer_trainjob_status_state", labels, values))

    def allocated(
        self,
        trainjob: str,
        values: str,
        *,
        cls: str = "nvidia.com/gpu",
        ns: str = "team-a",
        replica: str = "a",
    ) -> None:
        labels = {**self._job_series(replica, ns, trainjob), "accelerator_class": cls}
        self.series.append(_series("kubeflow_trainer_trainjob_allocated_accelerators", labels, values))

    def trainer_updated(self, trainjob: str, values: str, *, ns: str = "team-a", replica: str = "a") -> None:
        labels = self._job_series(replica, ns, trainjob)
        self.series.append(
            _series("kubeflow_trainer_trainjob_status_trainer_updated_timestamp_seconds", labels, values)
        )

    def job_gauge(
        self, metric: str, trainjob: str, values: str, *, ns: str = "team-a", replica: str = "a"
    ) -> None:
        self.series.append(_series(metric, self._job_series(replica, ns, trainjob), values))

    def dcgm(
        self,
        metric: str,
        uuid: str,
        values: str,
        *,
        pod: str | None,
        ns: str = "team-a",
        gi: str | None = None,
        node: str = "node-0",
    ) -> None:
        """One DCGM series of one device (a MIG instance with gi), held by `pod` (None: by no pod)."""
        labels = {
            "gpu": "0",
            "UUID": uuid,
            "pci_bus_id": "00000000:07:00.0",
            "device": "nvidia0",
            "modelName": "NVIDIA A100-SXM4-80GB",
            self.host_label: node,
            **self.extra,
        }
        if gi is not None:
            labels |= {"GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": gi}
        target = {
            "job": self.dcgm_job,
            "instance": f"{node}:9400",
            "namespace": "gpu-operator",
            "pod": f"nvidia-dcgm-exporter-{node}",
            "container": "nvidia-dcgm-exporter",
        }
        if pod is None:
            labels |= target
        elif self.mode == "honor":
            workload = {"pod": pod, "namespace": ns, "container": "pytorch", "pod_uid": f"uid-{pod}"}
            labels |= {**target, **workload}
        else:
            workload = {"exported_pod": pod, "exported_namespace": ns, "exported_container": "pytorch"}
            labels |= {**target, **workload, "pod_uid": f"uid-{pod}"}
        self.series.append(_series(metric, labels, values))

    def gpu(
        self,
        pod: str | None,
        uuid: str,
        *,
        engine: str | None = None,
        util: str | None = None,
        used: str | None = None,
        free: str | None = None,
        ns: str = "team-a",
        gi: str | None = None,
        node: str = "node-0",
    ) -> None:
        for metric, values in (
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", engine),
            ("DCGM_FI_DEV_GPU_UTIL", util),
            ("DCGM_FI_DEV_FB_USED", used),
            ("DCGM_FI_DEV_FB_FREE", free),
        ):
            if values is not None:
                self.dcgm(metric, uuid, values, pod=pod, ns=ns, gi=gi, node=node)


Sample = tuple[dict[str, str], float]


@dataclass
class Case:
    name: str
    series: list[dict[str, str]]
    # (eval time, expression, expected samples: labels and value), exact
    samples: list[tuple[str, str, list[Sample]]] = field(default_factory=list)
    # (eval time, alert, expected label sets)
    alerts: list[tuple[str, str, list[dict[str, str]]]] = field(default_factory=list)


def _labels_text(expr: str, labels: dict[str, str]) -> str:
    """How promtool writes a result's labels: with the name when the expression is a bare series name."""
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    name = expr if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) else ""
    return f"{name}{{{inner}}}"


def run_cases(rules: dict[str, Any], cases: list[Case], tmp_path: Path) -> None:
    """One `promtool test rules` run of every case (its failure output names the failing expression)."""
    rules = copy.deepcopy(rules)
    for rule in alert_rules(rules):
        rule.pop("annotations", None)  # checked by `promtool check rules`; compare labels here
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rules))
    tests = []
    for case in cases:
        tests.append(
            {
                "interval": "1m",
                "input_series": case.series,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": at,
                        "exp_samples": [
                            {"labels": _labels_text(expr, labels), "value": value}
                            for labels, value in expected
                        ],
                    }
                    for at, expr, expected in case.samples
                ],
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": labels} for labels in expected],
                    }
                    for at, alert, expected in case.alerts
                ],
            }
        )
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": tests})
    )
    out = subprocess.run(
        [promtool(), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- scenarios ---------------------------------------------------------------------------------------------

BUSY = "namespace_trainjob:kubeflow_trainer_gpu_busy:avg"
REPORTING = "namespace_trainjob:kubeflow_trainer_gpus_reporting:count"
MEMORY = "namespace_trainjob:kubeflow_trainer_gpu_memory_used:ratio"
DEVICE_BUSY = "namespace_trainjob_gpu:kubeflow_trainer_gpu_busy:ratio"
POD_INFO = "namespace_pod:kubeflow_trainer_trainjob_pod_info:max"
ALLOCATED = "namespace_runtime_ref:kubeflow_trainer_accelerators_allocated:sum"
BUSY_GPUS = "namespace_runtime_ref:kubeflow_trainer_gpus_busy:sum"
UNTIL = 90  # minutes of input


def samples_in_range(minutes: int) -> int:
    """One-minute samples a `[<minutes>m]` range holds: Prometheus 3 left-opened ranges (the sample at the
    range's start is out); before it, both ends are in."""
    out = subprocess.run([promtool(), "--version"], capture_output=True, text=True, timeout=60, check=True)
    match = re.search(r"version (\d+)\.", out.stdout + out.stderr)
    assert match, out.stdout + out.stderr
    return minutes if int(match[1]) >= 3 else minutes + 1


def _job(ns: str, trainjob: str) -> dict[str, str]:
    return {"namespace": ns, "trainjob": trainjob}


def _warning(ns: str, trainjob: str) -> dict[str, str]:
    return {**_job(ns, trainjob), "severity": "warning"}


def healthy_case(mode: Mode, host_label: str) -> Case:
    """A busy job with trainerStatus updated every minute: every recording, no alert. Next to it a notebook's
    GPU in the same namespace and an unassigned GPU, which join no TrainJob."""
    c = Cluster(mode, host_label)
    for pod in ("train-node-0-0-aaaaa", "train-node-0-1-bbbbb"):
        c.pod_info("train", pod, f"1x{UNTIL}")
    c.state("train", f"1x{UNTIL}")
    c.allocated("train", f"2x{UNTIL}")
    c.trainer_updated("train", f"0+60x{UNTIL}")  # updated at every scrape
    # DCGM_FI_PROF_GR_ENGINE_ACTIVE wins over DCGM_FI_DEV_GPU_UTIL where a device has both.
    c.gpu(
        "train-node-0-0-aaaaa",
        "GPU-a0",
        engine=f"0.75x{UNTIL}",
        util=f"10x{UNTIL}",
        used=f"1024x{UNTIL}",
        free=f"3072x{UNTIL}",
        node="node-0",
    )
    c.gpu(
        "train-node-0-1-bbbbb",
        "GPU-b0",
        engine=f"0.25x{UNTIL}",
        util=f"90x{UNTIL}",
        used=f"3072x{UNTIL}",
        free=f"1024x{UNTIL}",
        node="node-1",
    )
    c.gpu(
        "notebook-0",
        "GPU-c0",
        engine=f"0x{UNTIL}",
        util=f"0x{UNTIL}",
        used=f"0x{UNTIL}",
        free=f"4096x{UNTIL}",
        node="node-1",
    )
    c.gpu(
        None,
        "GPU-d0",
        engine=f"0x{UNTIL}",
        util=f"0x{UNTIL}",
        used=f"0x{UNTIL}",
        free=f"4096x{UNTIL}",
        node="node-1",
    )
    job = _job("team-a", "train")
    return Case(
        "healthy",
        c.series,
        samples=[
            ("60m", BUSY, [(job, 0.5)]),
            ("60m", REPORTING, [(job, 2)]),
            ("60m", MEMORY, [(job, 0.5)]),
            (
                "60m",
                DEVICE_BUSY,
                [
                    ({**job, "runtime_ref": R1, "UUID": "GPU-a0"}, 0.75),
                    ({**job, "runtime_ref": R1, "UUID": "GPU-b0"}, 0.25),
                ],
            ),
            (
                "60m",
                POD_INFO,
                [
                    ({**job, "pod": "train-node-0-0-aaaaa", "runtime_ref": R1}, 1),
                    ({**job, "pod": "train-node-0-1-bbbbb", "runtime_ref": R1}, 1),
                ],
            ),
            (
                "60m",
                ALLOCATED,
                [({"namespace": "team-a", "runtime_ref": R1, "accelerator_class": "nvidia.com/gpu"}, 2)],
            ),
            ("60m", BUSY_GPUS, [({"namespace": "team-a", "runtime_ref": R1}, 1.0)]),
            # GPU-hours over any range: one sample a minute, so sum_over_time(...[R]) / 60. 30 minutes of 2
            # held GPUs are 1 GPU-hour; of 1 busy GPU (0.75 + 0.25), half of one (one minute more before
            # Prometheus 3, whose ranges include their start).
            (
                "60m",
                f"sum_over_time({ALLOCATED}[30m]) / 60",
                [
                    (
                        {"namespace": "team-a", "runtime_ref": R1, "accelerator_class": "nvidia.com/gpu"},
                        2 * samples_in_range(30) / 60,
                    )
                ],
            ),
            (
                "60m",
                f"sum_over_time({BUSY_GPUS}[30m]) / 60",
                [({"namespace": "team-a", "runtime_ref": R1}, samples_in_range(30) / 60)],
            ),
        ],
        alerts=[(f"{UNTIL}m", alert, []) for alert in GPU_ALERTS],
    )


def fallback_cases(mode: Mode, host_label: str) -> list[Case]:
    """Profiling off (GPU_UTIL only); a device without GR_ENGINE_ACTIVE next to one with it; MIG instances,
    each a device of its own, of two jobs on one GPU."""
    off = Cluster(mode, host_label)
    off.pod_info("noprof", "noprof-node-0-0-aaaaa", f"1x{UNTIL}")
    off.gpu("noprof-node-0-0-aaaaa", "GPU-a0", util=f"50x{UNTIL}", used=f"1024x{UNTIL}", free=f"1024x{UNTIL}")
    off.gpu("noprof-node-0-0-aaaaa", "GPU-a1", util=f"25x{UNTIL}", used=f"0x{UNTIL}", free=f"2048x{UNTIL}")
    mixed = Cluster(mode, host_label)
    mixed.pod_info("mixed", "mixed-node-0-0-aaaaa", f"1x{UNTIL}")
    mixed.pod_info("mixed", "mixed-node-0-1-bbbbb", f"1x{UNTIL}")
    mixed.gpu("mixed-node-0-0-aaaaa", "GPU-h100", engine=f"0.75x{UNTIL}", util=f"10x{UNTIL}", node="node-0")
    mixed.gpu("mixed-node-0-1-bbbbb", "GPU-t4", util=f"25x{UNTIL}", node="node-1")
    mig = Cluster(mode, host_label)
    mig.pod_info("mig", "mig-node-0-0-aaaaa", f"1x{UNTIL}")
    mig.pod_info("mig", "mig-node-0-1-bbbbb", f"1x{UNTIL}")
    mig.pod_info("other", "other-node-0-0-ccccc", f"1x{UNTIL}", ns="team-b", runtime=R2)
    mig.allocated("mig", f"2x{UNTIL}", cls="nvidia.com/mig-1g.10gb")
    mig.allocated("other", f"1x{UNTIL}", cls="nvidia.com/mig-1g.10gb", ns="team-b")
    # MIG instances report the profiling fields, not GPU_UTIL (DCGM has no per-instance GPU_UTIL).
    for pod, gi, engine, ns in (
        ("mig-node-0-0-aaaaa", "1", "0.5", "team-a"),
        ("mig-node-0-1-bbbbb", "2", "0.25", "team-a"),
        ("other-node-0-0-ccccc", "3", "1", "team-b"),
    ):
        mig.gpu(
            pod,
            "GPU-a100",
            gi=gi,
            ns=ns,
            engine=f"{engine}x{UNTIL}",
            used=f"1024x{UNTIL}",
            free=f"9216x{UNTIL}",
        )
    return [
        Case(
            "profiling-off",
            off.series,
            samples=[
                ("30m", BUSY, [(_job("team-a", "noprof"), 0.375)]),
                ("30m", REPORTING, [(_job("team-a", "noprof"), 2)]),
                ("30m", MEMORY, [(_job("team-a", "noprof"), 0.25)]),
            ],
        ),
        Case(
            "per-device-fallback",
            mixed.series,
            samples=[
                ("30m", BUSY, [(_job("team-a", "mixed"), 0.5)]),
                ("30m", REPORTING, [(_job("team-a", "mixed"), 2)]),
            ],
        ),
        Case(
            "mig-instances",
            mig.series,
            samples=[
                ("30m", BUSY, [(_job("team-a", "mig"), 0.375), (_job("team-b", "other"), 1)]),
                ("30m", REPORTING, [(_job("team-a", "mig"), 2), (_job("team-b", "other"), 1)]),
                ("30m", MEMORY, [(_job("team-a", "mig"), 0.1), (_job("team-b", "other"), 0.1)]),
                (
                    "30m",
                    DEVICE_BUSY,
                    [
                        (
                            {**_job("team-a", "mig"), "runtime_ref": R1, "UUID": "GPU-a100", "GPU_I_ID": "1"},
                            0.5,
                        ),
                        (
                            {**_job("team-a", "mig"), "runtime_ref": R1, "UUID": "GPU-a100", "GPU_I_ID": "2"},
                            0.25,
                        ),
                        (
                            {
                                **_job("team-b", "other"),
                                "runtime_ref": R2,
                                "UUID": "GPU-a100",
                                "GPU_I_ID": "3",
                            },
                            1,
                        ),
                    ],
                ),
                (
                    "30m",
                    ALLOCATED,
                    [
                        (
                            {
                                "namespace": "team-a",
                                "runtime_ref": R1,
                                "accelerator_class": "nvidia.com/mig-1g.10gb",
                            },
                            2,
                        ),
                        (
                            {
                                "namespace": "team-b",
                                "runtime_ref": R2,
                                "accelerator_class": "nvidia.com/mig-1g.10gb",
                            },
                            1,
                        ),
                    ],
                ),
            ],
        ),
    ]


def alert_cases(mode: Mode, host_label: str) -> list[Case]:
    idle = Cluster(mode, host_label)
    idle.pod_info("idle", "idle-node-0-0-aaaaa", f"1x{UNTIL}")
    idle.state("idle", f"1x{UNTIL}")
    idle.allocated("idle", f"1x{UNTIL}")
    idle.gpu("idle-node-0-0-aaaaa", "GPU-a0", engine=f"0.03125x{UNTIL}")
    # Running since 0: the condition holds from 2m (the start guard), and `for: 30m` later it fires.
    idle_case = Case(
        "gpus-idle",
        idle.series,
        samples=[("20m", BUSY, [(_job("team-a", "idle"), 0.03125)])],
        alerts=[
            ("31m", "KubeflowTrainJobGPUsIdle", []),
            ("33m", "KubeflowTrainJobGPUsIdle", [_warning("team-a", "idle")]),
            ("60m", "KubeflowTrainJobStalled", []),
            ("60m", "KubeflowTrainJobNoGPUTelemetry", []),
        ],
    )

    blind = Cluster(mode, host_label)
    for trainjob, cls in (("blind", "nvidia.com/gpu"), ("amd", "amd.com/gpu")):
        blind.pod_info(trainjob, f"{trainjob}-node-0-0-aaaaa", f"1x{UNTIL}")
        blind.state(trainjob, f"1x{UNTIL}")
        blind.allocated(trainjob, f"2x{UNTIL}", cls=cls)
    blind.gpu(None, "GPU-a0", engine=f"0x{UNTIL}")  # the node's GPUs report, but to no pod of the job
    blind_case = Case(
        # A job holding nvidia.com devices, none reporting: fires; one holding AMD GPUs, which DCGM does not
        # report: never.
        "no-gpu-telemetry",
        blind.series,
        samples=[("20m", REPORTING, [])],
        alerts=[
            ("16m", "KubeflowTrainJobNoGPUTelemetry", []),
            ("18m", "KubeflowTrainJobNoGPUTelemetry", [_warning("team-a", "blind")]),
            ("60m", "KubeflowTrainJobNoGPUTelemetry", [_warning("team-a", "blind")]),
            ("60m", "KubeflowTrainJobGPUsIdle", []),
        ],
    )

    hung = Cluster(mode, host_label)
    for trainjob in ("hung", "progressing", "nostatus"):
        hung.pod_info(trainjob, f"{trainjob}-node-0-0-aaaaa", f"1x{UNTIL}")
        hung.state(trainjob, f"1x{UNTIL}")
        hung.gpu(f"{trainjob}-node-0-0-aaaaa", f"GPU-{trainjob}", engine=f"0.875x{UNTIL}")
    hung.trainer_updated("hung", f"0x{UNTIL}")  # last updated at 0: 1800 s old at 30m
    hung.trainer_updated("progressing", f"0+60x{UNTIL}")
    stalled_case = Case(
        # Busy, trainerStatus older than 1800 s from 31m, `for: 5m`: fires at 36m. The job whose status moves
        # and the job without trainerStatus never fire.
        "stalled",
        hung.series,
        alerts=[
            ("35m", "KubeflowTrainJobStalled", []),
            ("37m", "KubeflowTrainJobStalled", [_warning("team-a", "hung")]),
            ("80m", "KubeflowTrainJobStalled", [_warning("team-a", "hung")]),
            ("80m", "KubeflowTrainJobGPUsIdle", []),
        ],
    )

    finished = Cluster(mode, host_label)
    finished.pod_info("done", "done-node-0-0-aaaaa", f"1x{UNTIL}")
    finished.state("done", "1x10 stale")
    finished.state("done", f"_x11 1x{UNTIL - 11}", state="succeeded")
    finished.gpu("done-node-0-0-aaaaa", "GPU-a0", engine=f"0x{UNTIL}")
    finished.allocated("done", f"1x{UNTIL}")
    only_running = Case(
        # Only running TrainJobs: a job that succeeded (idle GPUs, say, while its pods linger) never fires.
        "only-running-jobs",
        finished.series,
        alerts=[("60m", alert, []) for alert in GPU_ALERTS],
    )
    return [idle_case, blind_case, stalled_case, only_running]


def leader_change_cases(mode: Mode, host_label: str) -> list[Case]:
    """Leader a serves the exporter's series until 14m; leader b from 10m (both copies for five scrapes), or
    from 15m after a's staleness marker at 13m (a gap of two scrapes). The recordings stay one series per
    pod and per job, no rule errors ("many-to-many"), and the alerts' `for:` clocks do not restart: they fire
    when they would have without the change."""
    cases = []
    for name, a_values, b_values in (
        ("leader-change-overlap", "1x14 stale", f"_x10 1x{UNTIL - 10}"),
        ("leader-change-gap", "1x12 stale", f"_x15 1x{UNTIL - 15}"),
    ):
        c = Cluster(mode, host_label)
        for replica, values in (("a", a_values), ("b", b_values)):
            c.pod_info("idle", "idle-node-0-0-aaaaa", values, replica=replica)
            c.pod_info("idle", "idle-node-0-1-bbbbb", values, replica=replica)
            c.pod_info("blind", "blind-node-0-0-ccccc", values, replica=replica)
            c.state("idle", values, replica=replica)
            c.state("blind", values, replica=replica)
            c.allocated("idle", values.replace("1x", "2x"), replica=replica)
            c.allocated("blind", values, replica=replica)
        c.gpu(
            "idle-node-0-0-aaaaa",
            "GPU-a0",
            engine=f"0.03125x{UNTIL}",
            used=f"512x{UNTIL}",
            free=f"1536x{UNTIL}",
        )
        c.gpu(
            "idle-node-0-1-bbbbb",
            "GPU-b0",
            engine=f"0.03125x{UNTIL}",
            used=f"512x{UNTIL}",
            free=f"1536x{UNTIL}",
        )
        idle = _job("team-a", "idle")
        pods = [
            ({**idle, "pod": "idle-node-0-0-aaaaa", "runtime_ref": R1}, 1),
            ({**idle, "pod": "idle-node-0-1-bbbbb", "runtime_ref": R1}, 1),
            ({**_job("team-a", "blind"), "pod": "blind-node-0-0-ccccc", "runtime_ref": R1}, 1),
        ]
        cases.append(
            Case(
                name,
                c.series,
                samples=[
                    (at, expr, expected)
                    for at in ("12m", "14m", "16m")
                    for expr, expected in (
                        (POD_INFO, pods),
                        (BUSY, [(idle, 0.03125)]),
                        (REPORTING, [(idle, 2)]),
                        (MEMORY, [(idle, 0.25)]),
                    )
                ],
                alerts=[
                    ("16m", "KubeflowTrainJobNoGPUTelemetry", []),
                    ("18m", "KubeflowTrainJobNoGPUTelemetry", [_warning("team-a", "blind")]),
                    ("31m", "KubeflowTrainJobGPUsIdle", []),
                    ("33m", "KubeflowTrainJobGPUsIdle", [_warning("team-a", "idle")]),
                ],
            )
        )
    return cases


def two_clusters_case(mode: Mode, host_label: str) -> Case:
    """A global ruler sees two clusters with the same namespace and pod names: joined per cluster, one
    series and one alert each."""
    series: list[dict[str, str]] = []
    for cluster, engine in (("east", "0.03125"), ("west", "0.5")):
        c = Cluster(mode, host_label, extra={"cluster": cluster})
        c.pod_info("train", "train-node-0-0-aaaaa", f"1x{UNTIL}")
        c.state("train", f"1x{UNTIL}")
        c.gpu("train-node-0-0-aaaaa", "GPU-a0" + cluster, engine=f"{engine}x{UNTIL}")
        series += c.series
    job = _job("team-a", "train")
    return Case(
        "two-clusters",
        series,
        samples=[("40m", BUSY, [({**job, "cluster": "east"}, 0.03125), ({**job, "cluster": "west"}, 0.5)])],
        alerts=[("40m", "KubeflowTrainJobGPUsIdle", [{**_warning("team-a", "train"), "cluster": "east"}])],
    )


def all_cases(mode: Mode, host_label: str) -> list[Case]:
    return [
        healthy_case(mode, host_label),
        *fallback_cases(mode, host_label),
        *alert_cases(mode, host_label),
        *leader_change_cases(mode, host_label),
        two_clusters_case(mode, host_label),
    ]


# --- the plain file ----------------------------------------------------------------------------------------


def gpu_rules() -> dict[str, Any]:
    rules: dict[str, Any] = load_yaml(GPU_FILE)
    return rules


def test_promtool_check_rules_accepts_the_gpu_file() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(GPU_FILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("mode", "host_label"),
    [("honor", "Hostname"), ("exported", "hostname")],
    ids=["honor_labels-true", "honor_labels-false"],
)
def test_promtool_unit_tests_of_the_gpu_rules(tmp_path: Path, mode: Mode, host_label: str) -> None:
    """Every recording and alert, with the DCGM series as each scrape mode stores them (and either host
    label name: the rules never use it)."""
    run_cases(gpu_rules(), all_cases(mode, host_label), tmp_path)


def test_the_promtool_cases_check_every_recording_and_alert() -> None:
    records = {r["record"] for g in gpu_rules()["groups"] for r in g["rules"] if "record" in r}
    cases = all_cases("honor", "Hostname")
    checked = {expr for case in cases for _, expr, _ in case.samples}
    # The two per-device framebuffer recordings are checked through the memory ratio.
    assert (
        records
        - {
            "namespace_trainjob_gpu:kubeflow_trainer_gpu_memory_used:mib",
            "namespace_trainjob_gpu:kubeflow_trainer_gpu_memory_free:mib",
        }
        <= checked
    )
    assert {alert for case in cases for _, alert, _ in case.alerts} == set(GPU_ALERTS)
    # The labels test_monitoring.py knows the recordings by are the ones they have.
    seen: dict[str, set[str]] = {}
    for case in cases:
        for _, expr, expected in case.samples:
            for labels, _ in expected:
                if expr in RECORDED_SERIES:
                    seen.setdefault(expr, set()).update(set(labels) - {"cluster"})
    for name, labels in seen.items():
        assert labels == RECORDED_SERIES[name], name
    assert set(RECORDED_SERIES) == records


def test_gpu_selectors_joins_and_aggregations_carry_the_literals_the_chart_rewrites() -> None:
    doc = gpu_rules()
    (group,) = doc["groups"]
    assert group["interval"] == "1m"  # GPU-hours are sum_over_time(...) / 60
    records = [r["record"] for r in group["rules"] if "record" in r]
    exporter = matchers(selectors_and_groupings(f"x{{{SELECTOR_TOKEN}}}")[0][0])
    dcgm = matchers(selectors_and_groupings(f"x{{{DCGM_TOKEN}}}")[0][0])
    seen_records: set[str] = set()
    for rule in group["rules"]:
        where = rule.get("record") or rule["alert"]
        expr = rule["expr"]
        selectors, groupings = selectors_and_groupings(expr)
        for sel in selectors:
            if sel.name.startswith("DCGM_"):
                assert dcgm <= matchers(sel), f"{where}: {sel.name} lacks {DCGM_TOKEN}"
            elif sel.name.startswith("kubeflow_trainer_"):
                assert exporter <= matchers(sel), f"{where}: {sel.name} lacks {SELECTOR_TOKEN}"
            else:
                # A recording of this file, recorded before (a group evaluates its rules in order).
                assert sel.name in seen_records, f"{where}: {sel.name} is not recorded above it"
        for labels in groupings:
            assert labels[0] == "cluster", f"{where}: by {labels} does not start with cluster"
            assert not {"Hostname", "hostname", "instance"} & set(labels), where
        assert expr.count("by (") == expr.count("by (cluster, "), where
        assert expr.count("on (") == expr.count(ON_TOKEN), where
        for joined in re.findall(r"on \(([^)]*)\)", expr):
            assert not {"Hostname", "hostname", "instance"} & {x.strip() for x in joined.split(",")}, where
        if "record" in rule:
            seen_records.add(rule["record"])
        else:
            assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_TOKEN}#{rule['alert'].lower()}"
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert len(records) == len(set(records)) == 9
    assert [r["alert"] for r in group["rules"] if "alert" in r] == list(GPU_ALERTS)


def test_gpu_alerts_only_for_running_jobs_past_the_start_guard() -> None:
    for rule in alert_rules(gpu_rules()):
        flat = " ".join(rule["expr"].split())
        running = 'kubeflow_trainer_trainjob_status_state{job="trainer-metrics", state="running"}'
        assert f"last_over_time({running}[3m]))" in flat, rule["alert"]
        assert f"last_over_time({running}[3m] offset 2m))" in flat, rule["alert"]
    stalled = next(r for r in alert_rules(gpu_rules()) if r["alert"] == "KubeflowTrainJobStalled")
    assert "kubeflow_trainer_trainjob_status_trainer_updated_timestamp_seconds" in stalled["expr"]
    telemetry = next(r for r in alert_rules(gpu_rules()) if r["alert"] == "KubeflowTrainJobNoGPUTelemetry")
    assert 'accelerator_class=~"nvidia.com/.+"' in telemetry["expr"]


def test_runbooks_have_a_section_per_gpu_alert() -> None:
    anchors = github_anchors(RUNBOOKS.read_text())
    for alert in GPU_ALERTS:
        assert alert.lower() in anchors, f"docs/runbooks.md has no section for {alert}"


def test_gpu_docs_name_every_recording_and_alert() -> None:
    text = (ROOT / "docs" / "gpu.md").read_text()
    for rule in gpu_rules()["groups"][0]["rules"]:
        assert f"`{rule.get('record') or rule['alert']}`" in text, rule.get("record") or rule["alert"]


# --- the chart ---------------------------------------------------------------------------------------------

VALUES = load_yaml(CHART_DIR / "values.yaml")


def test_the_defaults_are_the_literals_of_the_file() -> None:
    """The chart rewrites each alert's `for:` and thresholds from prometheusRule.gpu: its defaults are the
    file's own values, and each literal it replaces is in its alert's expression exactly once."""
    gpu = VALUES["prometheusRule"]["gpu"]
    assert gpu["enabled"] is False  # until the exporter serves the pod series
    assert gpu["dcgmSelector"] == DCGM_TOKEN
    for rule in alert_rules(gpu_rules()):
        assert rule["for"] == gpu[FOR_VALUES[rule["alert"]]]["for"], rule["alert"]
        for literal, (section, key) in THRESHOLDS[rule["alert"]].items():
            assert rule["expr"].count(literal) == 1, (rule["alert"], literal)
            assert literal.split()[1] == str(gpu[section][key]), (rule["alert"], literal)


def test_gpu_rules_are_off_by_default(render: RenderFn) -> None:
    rule = render({"prometheusRule": {"enabled": True}}).one("PrometheusRule")
    assert rule["spec"]["groups"] == load_yaml(ALERTS_FILE)["groups"]


def test_prometheus_rule_carries_the_gpu_file_unchanged(render: RenderFn) -> None:
    rule = render({"prometheusRule": {"enabled": True, "gpu": {"enabled": True}}}).one("PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["spec"]["groups"] == load_yaml(ALERTS_FILE)["groups"] + gpu_rules()["groups"]


CUSTOM = {
    "enabled": True,
    "selector": 'job="tm", cluster=~"eu-.*"',
    "extraAggregationLabels": ["cluster", "region"],
    "runbookBaseURL": "https://wiki.example.com/ml/runbooks.md",
    "gpu": {
        "enabled": True,
        "dcgmSelector": 'job="dcgm", cluster=~"eu-.*"',
        "idle": {"busyBelow": 0.1, "for": "1m"},
        "noTelemetry": {"for": "2m"},
        "stalled": {"busyAbove": 0.75, "trainerStatusAgeSeconds": 600, "for": "3m"},
    },
}


def _gpu_rules_of(rule: dict[str, Any]) -> list[dict[str, Any]]:
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "kubeflow-trainer.gpu"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def test_prometheus_rule_rewrites_the_gpu_selectors_joins_and_thresholds(
    render: RenderFn, tmp_path: Path
) -> None:
    rule = render({"prometheusRule": CUSTOM}).one("PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    exporter = matchers(selectors_and_groupings('x{job="tm", cluster=~"eu-.*"}')[0][0])
    dcgm = matchers(selectors_and_groupings('x{job="dcgm", cluster=~"eu-.*"}')[0][0])
    rules = _gpu_rules_of(rule)
    for r in rules:
        selectors, groupings = selectors_and_groupings(r["expr"])
        for sel in selectors:
            if sel.name.startswith("DCGM_"):
                assert matchers(sel) >= dcgm and ("job", "=", "nvidia-dcgm-exporter") not in matchers(sel)
            elif sel.name.startswith("kubeflow_trainer_"):
                assert matchers(sel) >= exporter and ("job", "=", "trainer-metrics") not in matchers(sel)
        for labels in groupings:
            assert labels[:2] == ["cluster", "region"] and labels.count("cluster") == 1, labels
        for joined in re.findall(r"on \(([^)]*)\)", r["expr"]):
            assert joined.startswith("cluster, region, ") and joined.count("cluster") == 1, joined
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert [alerts[a]["for"] for a in GPU_ALERTS] == ["1m", "2m", "3m"]
    assert "< 0.1\n" in alerts["KubeflowTrainJobGPUsIdle"]["expr"]
    assert "> 0.75\n" in alerts["KubeflowTrainJobStalled"]["expr"]
    assert "> 600\n" in alerts["KubeflowTrainJobStalled"]["expr"]
    assert "0.05" not in alerts["KubeflowTrainJobGPUsIdle"]["expr"]
    assert "1800" not in alerts["KubeflowTrainJobStalled"]["expr"]
    for a in alerts.values():
        assert (
            a["annotations"]["runbook_url"] == f"https://wiki.example.com/ml/runbooks.md#{a['alert'].lower()}"
        )
    # No extra labels: plain `by (namespace, ...)` and `on (namespace, ...)`.
    plain = render(
        {"prometheusRule": {"enabled": True, "extraAggregationLabels": [], "gpu": {"enabled": True}}}
    ).one("PrometheusRule")
    for r in _gpu_rules_of(plain):
        assert "cluster" not in r["expr"], r.get("record") or r.get("alert")
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_rendered_gpu_rules_with_short_durations_keep_the_start_guard(
    render: RenderFn, tmp_path: Path
) -> None:
    """The chart's rendering with its own selectors, thresholds and `for: 0m` everywhere: three jobs start
    running at 10m, one idle by the chart's threshold (0.078125 < 0.1; not below the file's 0.05), one holding
    an nvidia.com GPU that reports nothing, one busy above 0.75 with a trainerStatus left from before its
    start. None fires before 12m, two minutes after the start; each does at 12m."""
    values = copy.deepcopy(CUSTOM)
    gpu = values["gpu"]
    gpu["idle"]["for"] = gpu["noTelemetry"]["for"] = gpu["stalled"]["for"] = "0m"
    gpu["stalled"]["trainerStatusAgeSeconds"] = 60
    rule = render({"prometheusRule": values}).one("PrometheusRule")
    c = Cluster("exported", exporter_job="tm", dcgm_job="dcgm", extra={"cluster": "eu-1"})
    start = f"_x10 1x{UNTIL - 10}"
    for trainjob in ("idle", "blind", "hung"):
        c.pod_info(trainjob, f"{trainjob}-node-0-0-aaaaa", start)
        c.state(trainjob, start)
        c.allocated(trainjob, start)
    c.gpu("idle-node-0-0-aaaaa", "GPU-a0", engine=f"_x10 0.078125x{UNTIL - 10}")
    c.gpu("hung-node-0-0-aaaaa", "GPU-b0", engine=f"_x10 0.875x{UNTIL - 10}")
    c.trainer_updated("hung", f"0x{UNTIL}")  # a trainerStatus left from before the start
    fired = {"cluster": "eu-1", "severity": "warning"}
    case = Case(
        "start-guard",
        c.series,
        alerts=[
            check
            for alert, trainjob in zip(GPU_ALERTS, ("idle", "blind", "hung"), strict=True)
            for check in (
                ("10m", alert, []),
                ("11m", alert, []),
                ("12m", alert, [{**fired, **_job("team-a", trainjob)}]),
            )
        ],
    )
    run_cases({"groups": rule["spec"]["groups"]}, [case], tmp_path)


def test_disabled_alerts_can_name_the_gpu_alerts(render: RenderFn) -> None:
    rule = render(
        {
            "prometheusRule": {
                "enabled": True,
                "gpu": {"enabled": True},
                "disabledAlerts": ["KubeflowTrainJobStalled"],
                "additionalAlertLabels": {"team": "ml"},
            }
        }
    ).one("PrometheusRule")
    rules = _gpu_rules_of(rule)
    assert [r["alert"] for r in rules if "alert" in r] == [
        "KubeflowTrainJobGPUsIdle",
        "KubeflowTrainJobNoGPUTelemetry",
    ]
    assert all(r["labels"]["team"] == "ml" for r in rules if "alert" in r)
    assert all("labels" not in r for r in rules if "record" in r)


def test_dashboard_gpu_row_queries_answer(tmp_path: Path) -> None:
    """Each query of the dashboard's GPU row, its variables at All and a 30-minute time range, on a busy job
    (team-a) and one whose two GPUs idle or report nothing (team-b): the numbers the panels show."""
    c = Cluster("exported")
    c.pod_info("train", "train-node-0-0-aaaaa", f"1x{UNTIL}")
    c.pod_info("train", "train-node-0-1-bbbbb", f"1x{UNTIL}")
    c.allocated("train", f"2x{UNTIL}")
    c.gpu(
        "train-node-0-0-aaaaa", "GPU-a0", engine=f"0.75x{UNTIL}", used=f"1024x{UNTIL}", free=f"3072x{UNTIL}"
    )
    c.gpu(
        "train-node-0-1-bbbbb", "GPU-b0", engine=f"0.25x{UNTIL}", used=f"3072x{UNTIL}", free=f"1024x{UNTIL}"
    )
    c.job_gauge("kubeflow_trainer_trainjob_status_progress_percent", "train", f"40x{UNTIL}")
    c.job_gauge("kubeflow_trainer_trainjob_status_estimated_remaining_seconds", "train", f"600x{UNTIL}")
    c.job_gauge("kubeflow_trainer_trainjob_restarts", "train", f"1x{UNTIL}")
    c.pod_info("idle", "idle-node-0-0-ccccc", f"1x{UNTIL}", ns="team-b", runtime=R2)
    c.allocated("idle", f"2x{UNTIL}", ns="team-b")
    c.gpu(
        "idle-node-0-0-ccccc",
        "GPU-c0",
        ns="team-b",
        util=f"0x{UNTIL}",
        used=f"0x{UNTIL}",
        free=f"4096x{UNTIL}",
    )
    n = samples_in_range(30)
    train, idle = _job("team-a", "train"), _job("team-b", "idle")
    wanted: dict[tuple[str, str], list[Sample]] = {
        ("GPU efficiency (busy / held GPU-hours)", "A"): [({}, 0.25)],
        ("Idle GPU-hours", "A"): [({}, 3 * n / 60)],
        ("Cluster GPU efficiency (busy / held GPUs)", "A"): [({}, 0.25)],
        ("Cluster GPU efficiency (busy / held GPUs)", "B"): [({}, 4)],
        ("Cluster GPU efficiency (busy / held GPUs)", "C"): [({}, 1)],
        ("Idle GPU-hours by namespace and runtime_ref", "A"): [
            ({"namespace": "team-a", "runtime_ref": R1}, n / 60),
            ({"namespace": "team-b", "runtime_ref": R2}, 2 * n / 60),
        ],
        ("Top TrainJobs by idle GPUs", "A"): [(train, 1), (idle, 2)],
    }
    table = "TrainJobs holding GPUs: held, reporting, busy, memory, progress, ETA, restarts"
    for ref, expected in {
        "A": [(train, 2), (idle, 2)],
        "B": [(train, 2), (idle, 1)],
        "C": [(train, 0.5), (idle, 0)],
        "D": [(train, 0.5), (idle, 0)],
        "E": [(train, 40)],
        "F": [(train, 600)],
        "G": [(train, 1)],
    }.items():
        wanted[(table, ref)] = expected
    variables = {"cluster": ".*", "job": "trainer-metrics", "namespace": ".*", "runtime_ref": ".*"}
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    (row,) = [p for p in dashboard["panels"] if p["type"] == "row" and "GPU" in p["title"]]
    samples = []
    for panel in all_panels(row):
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__range", "30m")
            expr = re.sub(r"\$(\w+)", lambda m: variables[m[1]], expr)
            samples.append(("60m", expr, wanted.pop((panel["title"], target["refId"]))))
    assert not wanted, f"no such panel queries: {sorted(wanted)}"
    run_cases(gpu_rules(), [Case("dashboard", c.series, samples=samples)], tmp_path)
