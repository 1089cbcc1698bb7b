"""Monitoring objects: the alerts (a plain rules file checked and unit-tested by promtool, and carried by the
PrometheusRule), the ServiceMonitor, and the Grafana dashboard. Every expression must parse as PromQL and
name only metrics the service exports."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import promql_parser
import pytest
import yaml

from .chart import CHART_DIR, FULLNAME, NAMESPACE, ROOT, Obj, RenderFn, load_yaml, production_values

ALERTS_FILE = CHART_DIR / "files" / "alerts.yaml"
DASHBOARD_FILE = CHART_DIR / "files" / "dashboard.json"

# The metrics the service exports (product.md §3 and the self-telemetry); histograms also have _sum/_count.
TRAINER_METRICS = {
    "kubeflow_trainer_runtime_info": "gauge",
    "kubeflow_trainer_trainjob_created_total": "counter",
    "kubeflow_trainer_trainjob_finished_total": "counter",
    "kubeflow_trainer_trainjob_lifetime_seconds": "histogram",
    "kubeflow_trainer_trainjob_requested_training_nodes_per_job": "histogram",
    "kubeflow_trainer_trainjob_requested_accelerators": "histogram",
    "kubeflow_trainer_trainjob_startup_seconds": "histogram",
    "kubeflow_trainer_trainjob_admission_wait_seconds": "histogram",
    "kubeflow_trainer_trainjobs": "gauge",
    # The opt-in per-TrainJob series (app/metrics/per_job.py).
    "kubeflow_trainer_trainjob_info": "gauge",
    "kubeflow_trainer_trainjob_status_state": "gauge",
    "kubeflow_trainer_trainjob_created_timestamp_seconds": "gauge",
    "kubeflow_trainer_trainjob_status_progress_percent": "gauge",
    "kubeflow_trainer_trainjob_status_estimated_remaining_seconds": "gauge",
    "kubeflow_trainer_trainjob_status_trainer_metric": "gauge",
    "kubeflow_trainer_trainjob_status_trainer_updated_timestamp_seconds": "gauge",
    "trainer_metrics_leader": "gauge",
    "trainer_metrics_leader_transitions_total": "counter",
    "trainer_metrics_informer_synced": "gauge",
    "trainer_metrics_informer_stale": "gauge",
    "trainer_metrics_informer_last_event_age_seconds": "gauge",
    "trainer_metrics_informer_relists_total": "counter",
    "trainer_metrics_informer_watch_restarts_total": "counter",
    "trainer_metrics_limit_hits_total": "counter",
}
PROMETHEUS_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
GPU_FILE = CHART_DIR / "files" / "gpu.yaml"
# The pods watch's series and their labels: the contract the GPU rules (files/gpu.yaml) and the dashboard's
# GPU row join on (docs/gpu.md).
POD_SERIES = {
    "kubeflow_trainer_trainjob_pod_info": {
        "namespace",
        "trainjob",
        "pod",
        "node",
        "replicated_job",
        "runtime_ref",
    },
    "kubeflow_trainer_trainjob_allocated_accelerators": {"namespace", "trainjob", "accelerator_class"},
    "kubeflow_trainer_trainjob_restarts": {"namespace", "trainjob"},
}
# dcgm-exporter's series the GPU rules read and the labels they may carry in either scrape mode
# (tests/deploy/test_gpu_rules.py cites its source).
_DCGM_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "hostname",
    "pod_uid",
    "exported_pod",
    "exported_namespace",
    "exported_container",
}
DCGM_SERIES = {
    name: _DCGM_LABELS
    for name in (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
    )
}
# The recordings of files/gpu.yaml and their labels (besides `cluster`), as its promtool cases check them.
RECORDED_SERIES = {
    "namespace_pod:kubeflow_trainer_trainjob_pod_info:max": {"namespace", "pod", "trainjob", "runtime_ref"},
    "namespace_trainjob_gpu:kubeflow_trainer_gpu_busy:ratio": {
        "namespace",
        "trainjob",
        "runtime_ref",
        "UUID",
        "GPU_I_ID",
    },
    "namespace_trainjob_gpu:kubeflow_trainer_gpu_memory_used:mib": {
        "namespace",
        "trainjob",
        "UUID",
        "GPU_I_ID",
    },
    "namespace_trainjob_gpu:kubeflow_trainer_gpu_memory_free:mib": {
        "namespace",
        "trainjob",
        "UUID",
        "GPU_I_ID",
    },
    "namespace_trainjob:kubeflow_trainer_gpu_busy:avg": {"namespace", "trainjob"},
    "namespace_trainjob:kubeflow_trainer_gpus_reporting:count": {"namespace", "trainjob"},
    "namespace_trainjob:kubeflow_trainer_gpu_memory_used:ratio": {"namespace", "trainjob"},
    "namespace_runtime_ref:kubeflow_trainer_accelerators_allocated:sum": {
        "namespace",
        "runtime_ref",
        "accelerator_class",
    },
    "namespace_runtime_ref:kubeflow_trainer_gpus_busy:sum": {"namespace", "runtime_ref"},
}


def exporter_series_names() -> set[str]:
    names: set[str] = set()
    for name, kind in TRAINER_METRICS.items():
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names


def known_series_names() -> set[str]:
    return (
        PROMETHEUS_METRICS
        | exporter_series_names()
        | POD_SERIES.keys()
        | DCGM_SERIES.keys()
        | RECORDED_SERIES.keys()
    )


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def alert_rules(rules_doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rules_doc["groups"] for r in g["rules"] if "alert" in r]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`; .ci/run installs it)")
    return path


# --- alerts ------------------------------------------------------------------------------------------------


def test_promtool_check_rules_accepts_the_alerts_file() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS_FILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_alerts_are_valid_promql_on_exported_metrics() -> None:
    rules = alert_rules(load_yaml(ALERTS_FILE))
    assert len(rules) >= 8
    used: set[str] = set()
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= known_series_names(), (
            f"{rule['alert']}: unknown metrics {names - known_series_names()}"
        )
        used |= names
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]
        assert re.fullmatch(r"([0-9]+[smhd])+", rule["for"]), rule["alert"]
    assert len({r["alert"] for r in rules}) == len(rules), "duplicate alert names"
    # What an operator needs to be told about, at least.
    for needed in (
        "trainer_metrics_leader",
        "trainer_metrics_informer_synced",
        "trainer_metrics_informer_stale",
        "kubeflow_trainer_trainjob_finished_total",
        "kubeflow_trainer_trainjobs",
    ):
        assert needed in used


def test_alert_expressions_cover_the_operator_cases() -> None:
    exprs = {r["alert"]: " ".join(r["expr"].split()) for r in alert_rules(load_yaml(ALERTS_FILE))}
    sel = 'job="trainer-metrics"'
    assert exprs["TrainerMetricsAbsent"] == f"absent(trainer_metrics_leader{{{sel}}})"
    leaders = f"sum by (cluster, namespace, job) (trainer_metrics_leader{{{sel}}})"
    assert exprs["TrainerMetricsNoLeader"] == f"{leaders} == 0"
    assert exprs["TrainerMetricsMultipleLeaders"] == f"{leaders} > 1"
    assert exprs["TrainerMetricsInformerNotSynced"] == f"trainer_metrics_informer_synced{{{sel}}} == 0"
    assert exprs["TrainerMetricsInformerStale"] == f"trainer_metrics_informer_stale{{{sel}}} == 1"
    assert 'result="failed"' in exprs["KubeflowTrainJobFailureRatioHigh"]
    assert 'state="pending"' in exprs["KubeflowTrainJobsPendingTooLong"]
    assert 'state="suspended"' in exprs["KubeflowTrainJobsSuspendedTooLong"]


# The three literal strings of files/alerts.yaml that the chart rewrites (its header says why).
SELECTOR_TOKEN = 'job="trainer-metrics"'
BY_TOKEN = "by (cluster, "
RUNBOOK_TOKEN = "https://trainer-metrics.invalid/docs/runbooks.md"
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def selectors_and_groupings(expr: str) -> tuple[list[Any], list[list[str]]]:
    selectors: list[Any] = []
    groupings: list[list[str]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            selectors.append(node)
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            groupings.append(list(node.modifier.labels))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return selectors, groupings


_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def matchers(selector: Any) -> set[tuple[str, str, str]]:
    """(label, operator as PromQL writes it, value) of a vector selector's matchers."""
    return {(m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value) for m in selector.matchers.matchers}


def test_every_alert_selects_the_exporter_and_groups_by_cluster_first() -> None:
    """The chart's rewrite reaches every expression only if each has the literal tokens where they belong:
    every vector selector carries the selector, every `by (...)` starts with `cluster`."""
    text = ALERTS_FILE.read_text()
    default = matchers(selectors_and_groupings(f"x{{{SELECTOR_TOKEN}}}")[0][0])
    for rule in alert_rules(load_yaml(ALERTS_FILE)):
        selectors, groupings = selectors_and_groupings(rule["expr"])
        assert selectors, rule["alert"]
        for sel in selectors:
            assert default <= matchers(sel), f"{rule['alert']}: {sel.name} lacks {SELECTOR_TOKEN}"
        for labels in groupings:
            assert labels[0] == "cluster", f"{rule['alert']}: by {labels} does not start with cluster"
        assert rule["expr"].count("by (") == rule["expr"].count(BY_TOKEN), rule["alert"]
        assert "runbook" not in rule["annotations"], "shell text in `runbook`: use runbook_url"
        anchor = rule["alert"].lower()
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_TOKEN}#{anchor}", rule["alert"]
    # No hard-coded exporter name outside the selector token (nameOverride would make it wrong).
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "app.kubernetes.io/name" not in body
    assert body.count('trainer-metrics"') == body.count(SELECTOR_TOKEN)


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub/GitLab give the headings: lower case, spaces to '-', punctuation dropped."""
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", markdown, re.M):
        out.add(re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-"))
    return out


def test_runbooks_have_a_section_per_alert() -> None:
    anchors = github_anchors(RUNBOOKS.read_text())
    for rule in alert_rules(load_yaml(ALERTS_FILE)):
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"docs/runbooks.md has no section for {rule['alert']} (#{anchor})"


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{inner}}}", "values": values}


EXPORTER = {"job": "trainer-metrics", "namespace": "obs"}
R1 = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"
R2 = "trainer.kubeflow.org/TrainingRuntime/team-a/deepspeed"

# promtool unit tests: (name, input series, [(eval time, alert, expected label sets)]).
ALERT_CASES: list[tuple[str, list[dict[str, str]], list[tuple[str, str, list[dict[str, str]]]]]] = [
    (
        "one-leader-is-quiet",
        [
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "a"}, "1x30"),
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "b"}, "0x30"),
        ],
        [
            ("20m", "TrainerMetricsNoLeader", []),
            ("20m", "TrainerMetricsMultipleLeaders", []),
            ("20m", "TrainerMetricsAbsent", []),
        ],
    ),
    (
        "no-leader",
        [
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "a"}, "0x30"),
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "b"}, "0x30"),
        ],
        [
            ("4m", "TrainerMetricsNoLeader", []),
            ("10m", "TrainerMetricsNoLeader", [{**EXPORTER, "severity": "critical"}]),
        ],
    ),
    (
        "two-leaders",
        [
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "a"}, "1x30"),
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "b"}, "1x30"),
        ],
        [("10m", "TrainerMetricsMultipleLeaders", [{**EXPORTER, "severity": "warning"}])],
    ),
    (
        "exporter-absent",
        [_series("up", {"job": "other"}, "1x30")],
        [
            ("5m", "TrainerMetricsAbsent", []),
            ("15m", "TrainerMetricsAbsent", [{"job": "trainer-metrics", "severity": "critical"}]),
        ],
    ),
    (
        # The upstream Trainer controller exports the same kubeflow_trainer_* names under another job: its
        # failures and pending jobs are not this exporter's, and must neither fire nor add up with them.
        "upstream-controller-series-are-ignored",
        [
            _series(
                "kubeflow_trainer_trainjob_finished_total",
                {
                    "job": "kubeflow-trainer-controller",
                    "namespace": "kubeflow-system",
                    "pod": "c",
                    "result": "failed",
                    "reason": "FailedJobs",
                    "runtime_ref": R1,
                },
                "0+5x150",
            ),
            _series(
                "kubeflow_trainer_trainjobs",
                {
                    "job": "kubeflow-trainer-controller",
                    "pod": "c",
                    "namespace": "team-a",
                    "runtime_ref": R2,
                    "state": "pending",
                },
                "3x100",
            ),
            _series("trainer_metrics_leader", {**EXPORTER, "pod": "a"}, "1x150"),
        ],
        [
            ("120m", "KubeflowTrainJobFailureRatioHigh", []),
            ("90m", "KubeflowTrainJobsPendingTooLong", []),
            ("90m", "TrainerMetricsAbsent", []),
        ],
    ),
    (
        "informer-not-synced-and-stale",
        [
            _series(
                "trainer_metrics_informer_synced", {**EXPORTER, "pod": "a", "informer": "trainjobs"}, "0x30"
            ),
            _series(
                "trainer_metrics_informer_synced",
                {**EXPORTER, "pod": "a", "informer": "trainingruntimes"},
                "1x30",
            ),
            _series(
                "trainer_metrics_informer_stale", {**EXPORTER, "pod": "a", "informer": "trainjobs"}, "1x30"
            ),
        ],
        [
            (
                "15m",
                "TrainerMetricsInformerNotSynced",
                [{**EXPORTER, "pod": "a", "informer": "trainjobs", "severity": "warning"}],
            ),
            (
                "15m",
                "TrainerMetricsInformerStale",
                [{**EXPORTER, "pod": "a", "informer": "trainjobs", "severity": "warning"}],
            ),
        ],
    ),
    (
        "failure-ratio-by-runtime",
        [
            # R1: 2 failures for each success; R2: 1 failure for 9 successes.
            _series(
                "kubeflow_trainer_trainjob_finished_total",
                {**EXPORTER, "pod": "a", "result": "failed", "reason": "FailedJobs", "runtime_ref": R1},
                "0+2x150",
            ),
            _series(
                "kubeflow_trainer_trainjob_finished_total",
                {**EXPORTER, "pod": "a", "result": "succeeded", "reason": "none", "runtime_ref": R1},
                "0+1x150",
            ),
            _series(
                "kubeflow_trainer_trainjob_finished_total",
                {**EXPORTER, "pod": "a", "result": "failed", "reason": "DeadlineExceeded", "runtime_ref": R2},
                "0+1x150",
            ),
            _series(
                "kubeflow_trainer_trainjob_finished_total",
                {**EXPORTER, "pod": "a", "result": "succeeded", "reason": "none", "runtime_ref": R2},
                "0+9x150",
            ),
        ],
        [("120m", "KubeflowTrainJobFailureRatioHigh", [{"runtime_ref": R1, "severity": "warning"}])],
    ),
    (
        "few-failures-do-not-page",
        [
            _series(
                "kubeflow_trainer_trainjob_finished_total",
                {**EXPORTER, "pod": "a", "result": "failed", "reason": "FailedJobs", "runtime_ref": R1},
                "0 0 0 0 0 0 0 0 0 0 1 1 1 1 1 1 1 1 1 1 2x140",
            )
        ],
        [("120m", "KubeflowTrainJobFailureRatioHigh", [])],
    ),
    (
        "limit-hits",
        [
            _series(
                "trainer_metrics_limit_hits_total",
                {**EXPORTER, "pod": "a", "limit": "object_too_large"},
                "0x30 1x30",
            ),
            _series(
                "trainer_metrics_limit_hits_total",
                {**EXPORTER, "pod": "a", "limit": "unknown_runtime_refs"},
                "0x60",
            ),
        ],
        [
            ("20m", "TrainerMetricsLimitHit", []),
            (
                "45m",
                "TrainerMetricsLimitHit",
                [{**EXPORTER, "limit": "object_too_large", "severity": "info"}],
            ),
        ],
    ),
    (
        # A job whose pods wait for GPUs is pending (no child Job ready), not running: the alert fires for
        # it; a job whose pods became ready within the hour does not (pending, then running).
        "pods-waiting-for-capacity",
        [
            _series(
                "kubeflow_trainer_trainjobs",
                {**EXPORTER, "pod": "a", "namespace": "team-b", "runtime_ref": R1, "state": "pending"},
                "1x150",
            ),
            _series(
                "kubeflow_trainer_trainjobs",
                {**EXPORTER, "pod": "a", "namespace": "team-c", "runtime_ref": R1, "state": "pending"},
                "1x40 0x110",
            ),
            _series(
                "kubeflow_trainer_trainjobs",
                {**EXPORTER, "pod": "a", "namespace": "team-c", "runtime_ref": R1, "state": "running"},
                "0x40 1x110",
            ),
        ],
        [
            ("50m", "KubeflowTrainJobsPendingTooLong", []),
            (
                "70m",
                "KubeflowTrainJobsPendingTooLong",
                [{"namespace": "team-b", "runtime_ref": R1, "severity": "warning"}],
            ),
        ],
    ),
    (
        "pending-and-suspended",
        [
            _series(
                "kubeflow_trainer_trainjobs",
                {**EXPORTER, "pod": "a", "namespace": "team-a", "runtime_ref": R2, "state": "pending"},
                "3x1500",
            ),
            _series(
                "kubeflow_trainer_trainjobs",
                {**EXPORTER, "pod": "a", "namespace": "team-a", "runtime_ref": R2, "state": "suspended"},
                "1x1500",
            ),
        ],
        [
            ("30m", "KubeflowTrainJobsPendingTooLong", []),
            (
                "70m",
                "KubeflowTrainJobsPendingTooLong",
                [{"namespace": "team-a", "runtime_ref": R2, "severity": "warning"}],
            ),
            ("70m", "KubeflowTrainJobsSuspendedTooLong", []),
            (
                "1450m",
                "KubeflowTrainJobsSuspendedTooLong",
                [{"namespace": "team-a", "runtime_ref": R2, "severity": "info"}],
            ),
        ],
    ),
]


ALERT_CASES.append(
    (
        # Per-TrainJob series: the job created three hours ago is pending: named after 15 minutes; the one
        # created an hour ago is not old enough; the old one that runs is not pending.
        "one-trainjob-stuck-pending",
        [
            _series(
                "kubeflow_trainer_trainjob_created_timestamp_seconds",
                {**EXPORTER, "pod": "a", "namespace": "team-a", "trainjob": "old-pending"},
                "-10800x60",
            ),
            _series(
                "kubeflow_trainer_trainjob_status_state",
                {
                    **EXPORTER,
                    "pod": "a",
                    "namespace": "team-a",
                    "trainjob": "old-pending",
                    "state": "pending",
                },
                "1x60",
            ),
            _series(
                "kubeflow_trainer_trainjob_created_timestamp_seconds",
                {**EXPORTER, "pod": "a", "namespace": "team-a", "trainjob": "young-pending"},
                "-3600x60",
            ),
            _series(
                "kubeflow_trainer_trainjob_status_state",
                {
                    **EXPORTER,
                    "pod": "a",
                    "namespace": "team-a",
                    "trainjob": "young-pending",
                    "state": "pending",
                },
                "1x60",
            ),
            _series(
                "kubeflow_trainer_trainjob_created_timestamp_seconds",
                {**EXPORTER, "pod": "a", "namespace": "team-a", "trainjob": "old-running"},
                "-10800x60",
            ),
            _series(
                "kubeflow_trainer_trainjob_status_state",
                {
                    **EXPORTER,
                    "pod": "a",
                    "namespace": "team-a",
                    "trainjob": "old-running",
                    "state": "running",
                },
                "1x60",
            ),
        ],
        [
            ("10m", "KubeflowTrainJobStuckPending", []),
            (
                "20m",
                "KubeflowTrainJobStuckPending",
                [
                    {
                        **EXPORTER,
                        "pod": "a",
                        "namespace": "team-a",
                        "trainjob": "old-pending",
                        "severity": "warning",
                    }
                ],
            ),
        ],
    )
)


def test_promtool_unit_tests_of_the_alerts(tmp_path: Path) -> None:
    run_promtool_tests(load_yaml(ALERTS_FILE), ALERT_CASES, tmp_path)


AlertCase = tuple[str, list[dict[str, str]], list[tuple[str, str, list[dict[str, str]]]]]


def run_promtool_tests(rules: dict[str, Any], cases: list[AlertCase], tmp_path: Path) -> None:
    tool = promtool()
    # promtool compares annotations too; they are checked by `check rules`, so compare labels only here.
    rules = copy.deepcopy(rules)
    for rule in alert_rules(rules):
        rule.pop("annotations", None)
    rules_file = tmp_path / "alerts.yaml"
    rules_file.write_text(yaml.safe_dump(rules))
    tests = []
    for _name, series, checks in cases:
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": labels} for labels in expected],
                    }
                    for at, alert, expected in checks
                ],
            }
        )
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": tests})
    )
    out = subprocess.run(
        [tool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- PrometheusRule ----------------------------------------------------------------------------------------

PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    # The parts of monitoring.coreos.com/v1 PrometheusRule the chart writes.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string"},
                                        "for": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"},
                                        "keep_firing_for": {"type": "string"},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def test_prometheus_rule_carries_the_file_unchanged(render: RenderFn) -> None:
    # With the defaults (job of the default jobLabel, `cluster` first, the placeholder runbook base) the
    # rewrite changes nothing: the plain file is what the chart installs.
    rule = render({"prometheusRule": {"enabled": True}}).one("PrometheusRule", FULLNAME)
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"]["groups"] == load_yaml(ALERTS_FILE)["groups"]
    # The alerts' own {{ $labels }} templates survive Helm.
    assert "{{ $labels.runtime_ref }}" in json.dumps(rule)


CUSTOM_SELECTOR = 'job="tm", cluster=~"eu-.*"'


def test_prometheus_rule_selector_aggregation_and_runbooks(render: RenderFn) -> None:
    rule = render(
        {
            "prometheusRule": {
                "enabled": True,
                "selector": CUSTOM_SELECTOR,
                "extraAggregationLabels": ["cluster", "region"],
                "runbookBaseURL": "https://wiki.example.com/ml/runbooks.md",
            }
        }
    ).one("PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    want = matchers(selectors_and_groupings(f"x{{{CUSTOM_SELECTOR}}}")[0][0])
    rules = alert_rules(rule["spec"])
    assert len(rules) == len(alert_rules(load_yaml(ALERTS_FILE)))
    for r in rules:
        selectors, groupings = selectors_and_groupings(r["expr"])
        for sel in selectors:
            assert matchers(sel) >= want and ("job", "=", "trainer-metrics") not in matchers(sel), r["alert"]
        for labels in groupings:
            assert labels[:2] == ["cluster", "region"] and labels.count("cluster") == 1, (r["alert"], labels)
        assert (
            r["annotations"]["runbook_url"] == f"https://wiki.example.com/ml/runbooks.md#{r['alert'].lower()}"
        )
    # The query hint in a description follows too.
    descriptions = " ".join(r["annotations"]["description"] for r in rules)
    assert CUSTOM_SELECTOR in descriptions and "trainer-metrics.invalid" not in json.dumps(rule)
    # No extra labels: plain `by (namespace, job)`.
    plain = render({"prometheusRule": {"enabled": True, "extraAggregationLabels": []}}).one("PrometheusRule")
    for r in alert_rules(plain["spec"]):
        for labels in selectors_and_groupings(r["expr"])[1]:
            assert "cluster" not in labels, r["alert"]


@pytest.mark.parametrize(
    ("values", "job"),
    [
        ({}, "trainer-metrics"),
        ({"nameOverride": "tmx"}, "tmx"),  # jobLabel app.kubernetes.io/name follows nameOverride
        ({"serviceMonitor": {"jobLabel": ""}}, FULLNAME),  # no jobLabel: the Service's name
        ({"serviceMonitor": {"jobLabel": "app.kubernetes.io/instance"}}, "tm"),
        ({"serviceMonitor": {"jobLabel": "team"}, "commonLabels": {"team": "ml"}}, "ml"),
    ],
    ids=["default", "name-override", "service-name", "instance", "common-label"],
)
def test_default_selector_is_the_job_the_monitor_gives(
    render: RenderFn, values: dict[str, Any], job: str
) -> None:
    values = {
        **values,
        "prometheusRule": {"enabled": True},
        "serviceMonitor": {**values.get("serviceMonitor", {}), "enabled": True},
    }
    rendered = render(values)
    # What the ServiceMonitor makes the job label: the value of the Service label named by jobLabel.
    sm = rendered.one("ServiceMonitor")["spec"]
    service = rendered.one("Service")
    actual_job = (
        service["metadata"]["labels"][sm["jobLabel"]] if "jobLabel" in sm else service["metadata"]["name"]
    )
    assert actual_job == job
    for r in alert_rules(rendered.one("PrometheusRule")["spec"]):
        for sel in selectors_and_groupings(r["expr"])[0]:
            assert ("job", "=", job) in matchers(sel), r["alert"]


def test_global_ruler_with_two_clusters_keeps_one_alert_per_cluster(render: RenderFn, tmp_path: Path) -> None:
    """Two clusters, each with its own leader, seen by one ruler: no 'several leaders'; a cluster without
    a leader alerts alone, with its cluster label."""
    rule = render({"prometheusRule": {"enabled": True}}).one("PrometheusRule")
    east = {**EXPORTER, "cluster": "east"}
    west = {**EXPORTER, "cluster": "west"}
    cases: list[AlertCase] = [
        (
            "two-clusters",
            [
                _series("trainer_metrics_leader", {**east, "pod": "a"}, "1x30"),
                _series("trainer_metrics_leader", {**east, "pod": "b"}, "0x30"),
                _series("trainer_metrics_leader", {**west, "pod": "a"}, "0x30"),
                _series("trainer_metrics_leader", {**west, "pod": "b"}, "0x30"),
                _series(
                    "kubeflow_trainer_trainjobs",
                    {**east, "pod": "a", "namespace": "team-a", "runtime_ref": R2, "state": "pending"},
                    "1x100",
                ),
                _series(
                    "kubeflow_trainer_trainjobs",
                    {**west, "pod": "a", "namespace": "team-a", "runtime_ref": R2, "state": "pending"},
                    "2x100",
                ),
            ],
            [
                ("20m", "TrainerMetricsMultipleLeaders", []),
                ("20m", "TrainerMetricsNoLeader", [{**west, "severity": "critical"}]),
                (
                    "70m",
                    "KubeflowTrainJobsPendingTooLong",
                    [
                        {"cluster": "east", "namespace": "team-a", "runtime_ref": R2, "severity": "warning"},
                        {"cluster": "west", "namespace": "team-a", "runtime_ref": R2, "severity": "warning"},
                    ],
                ),
            ],
        )
    ]
    run_promtool_tests({"groups": rule["spec"]["groups"]}, cases, tmp_path)


def test_prometheus_rule_options(render: RenderFn, tmp_path: Path) -> None:
    extra = {
        "name": "custom",
        "rules": [{"alert": "Mine", "expr": "vector(1) > 2", "labels": {"severity": "info"}}],
    }
    rule = render(
        {
            "prometheusRule": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"release": "prom"},
                "disabledAlerts": ["TrainerMetricsLeaderFlapping", "KubeflowTrainJobsSuspendedTooLong"],
                "additionalAlertLabels": {"team": "ml", "severity": "page"},
                "extraGroups": [extra],
            }
        }
    ).one("PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "prom"
    rules = alert_rules(rule["spec"])
    names = {r["alert"] for r in rules}
    assert "TrainerMetricsLeaderFlapping" not in names and "KubeflowTrainJobsSuspendedTooLong" not in names
    assert "TrainerMetricsNoLeader" in names and "Mine" in names
    for r in rules:
        if r["alert"] != "Mine":
            assert r["labels"]["team"] == "ml"
            assert r["labels"]["severity"] in {"critical", "warning", "info"}  # an alert's own label wins
    assert rule["spec"]["groups"][-1] == extra
    # What the PrometheusRule carries is still a valid rules file.
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- ServiceMonitor ----------------------------------------------------------------------------------------

SAFE_TLS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ca": {"type": "object"},
        "cert": {"type": "object"},
        "keySecret": {"type": "object"},
        "serverName": {"type": "string"},
        "insecureSkipVerify": {"type": "boolean"},
        "caFile": {"type": "string"},
        "certFile": {"type": "string"},
        "keyFile": {"type": "string"},
        "minVersion": {"type": "string"},
        "maxVersion": {"type": "string"},
    },
}
SECRET_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}},
}
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    # The parts of monitoring.coreos.com/v1 ServiceMonitor the chart writes.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 1},
                "labelLimit": {"type": "integer", "minimum": 1},
                "labelNameLengthLimit": {"type": "integer", "minimum": 1},
                "labelValueLengthLimit": {"type": "integer", "minimum": 1},
                # prometheus-operator >= 0.72 / 0.74 (Prometheus >= 2.49 / 2.45)
                "scrapeProtocols": {
                    "type": "array",
                    "minItems": 1,
                    "uniqueItems": True,
                    "items": {
                        "enum": [
                            "PrometheusProto",
                            "OpenMetricsText0.0.1",
                            "OpenMetricsText1.0.0",
                            "PrometheusText0.0.4",
                            "PrometheusText1.0.0",
                        ]
                    },
                },
                "scrapeClassicHistograms": {"type": "boolean"},
                "selector": {"type": "object", "required": ["matchLabels"]},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"},
                            "honorLabels": {"type": "boolean"},
                            "tlsConfig": SAFE_TLS,
                            "bearerTokenFile": {"type": "string"},
                            "bearerTokenSecret": SECRET_KEY,
                            "authorization": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"type": {"type": "string"}, "credentials": SECRET_KEY},
                            },
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}


def test_service_monitor_plain(render: RenderFn) -> None:
    rendered = render({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
    sm = rendered.one("ServiceMonitor", FULLNAME)
    jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    assert endpoint["honorLabels"] is True  # the metrics' own `namespace` label stays `namespace`
    assert "bearerTokenFile" not in endpoint and "tlsConfig" not in endpoint


def test_service_monitor_selects_the_service(render: RenderFn) -> None:
    rendered = render({"serviceMonitor": {"enabled": True}})
    selector = rendered.one("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    service_labels = rendered.one("Service")["metadata"]["labels"]
    assert selector.items() <= service_labels.items()


def test_service_monitor_with_tls_and_auth(render: RenderFn) -> None:
    rendered = render(production_values())
    sm = rendered.one("ServiceMonitor")
    jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["port"] == "https"
    # No token file (deprecated, refused where file access is denied): a token of its own, from a Secret.
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": f"{FULLNAME}-scraper-token", "key": "token"},
    }
    assert (sm["spec"]["sampleLimit"], sm["spec"]["labelLimit"], sm["spec"]["labelValueLengthLimit"]) == (
        50000,
        30,
        1024,
    )
    assert "labelNameLengthLimit" not in sm["spec"]  # 0: no limit, left out
    assert endpoint["tlsConfig"] == {
        "serverName": f"{FULLNAME}.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "trainer-metrics-tls", "key": "ca.crt"}},
    }
    assert endpoint["honorLabels"] is True
    custom = copy.deepcopy(production_values())
    custom["serviceMonitor"]["tlsConfig"] = {"insecureSkipVerify": True}
    (endpoint,) = render(custom).one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_scrape_token_made_by_the_chart(render: RenderFn) -> None:
    values = {"auth": {"enabled": True}, "serviceMonitor": {"enabled": True, "namespace": "monitoring"}}
    rendered = render(values)
    sa = rendered.one("ServiceAccount", f"{FULLNAME}-scraper")
    secret = rendered.one("Secret", f"{FULLNAME}-scraper-token")
    # Where the Prometheus Operator reads the Secret from: the ServiceMonitor's namespace.
    assert sa["metadata"]["namespace"] == secret["metadata"]["namespace"] == "monitoring"
    assert sa["automountServiceAccountToken"] is False
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": f"{FULLNAME}-scraper"}
    binding = rendered.one("ClusterRoleBinding", f"{FULLNAME}-scraper")
    assert binding["roleRef"]["name"] == f"{FULLNAME}-metrics-reader"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{FULLNAME}-scraper", "namespace": "monitoring"}
    ]
    reader = rendered.one("ClusterRole", f"{FULLNAME}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # Not without auth, nor without a monitor, nor when a token is given.
    for other in (
        {"serviceMonitor": {"enabled": True}},
        {"auth": {"enabled": True}},
        {**values, "serviceMonitor": {"enabled": True, "bearerTokenSecret": {"name": "t", "key": "token"}}},
    ):
        assert "Secret" not in render(other).kinds(), other


@pytest.mark.parametrize(
    ("monitor", "field", "value"),
    [
        (
            "authorization",
            "authorization",
            {"type": "Bearer", "credentials": {"name": "prom-token", "key": "token"}},
        ),
        ("bearerTokenSecret", "bearerTokenSecret", {"name": "prom-token", "key": "token"}),
        ("bearerTokenFile", "bearerTokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token"),
    ],
)
def test_service_monitor_token_options(render: RenderFn, monitor: str, field: str, value: Any) -> None:
    rendered = render({"auth": {"enabled": True}, "serviceMonitor": {"enabled": True, monitor: value}})
    sm = rendered.one("ServiceMonitor")
    jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint[field] == value
    assert not {"authorization", "bearerTokenSecret", "bearerTokenFile"} - {field} & endpoint.keys()
    assert "Secret" not in rendered.kinds()  # no scrape token of the chart's


def test_service_monitor_job_label_and_limits(render: RenderFn) -> None:
    sm = render({"serviceMonitor": {"enabled": True}}).one("ServiceMonitor")["spec"]
    assert sm["jobLabel"] == "app.kubernetes.io/name"
    assert not {"sampleLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit"} & sm.keys()
    limits = {"sampleLimit": 10, "labelLimit": 20, "labelNameLengthLimit": 30, "labelValueLengthLimit": 40}
    sm = render({"serviceMonitor": {"enabled": True, "jobLabel": "", **limits}}).one("ServiceMonitor")["spec"]
    assert "jobLabel" not in sm
    assert {k: sm[k] for k in limits} == limits


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_scrape_protocols_and_classic_histograms(render: RenderFn, monitor: str) -> None:
    """Protobuf first (native histograms) with the classic buckets kept, on either monitor; unset by default
    (Prometheus' own default: OpenMetrics first)."""
    kind = "ServiceMonitor" if monitor == "serviceMonitor" else "PodMonitor"
    schema = SERVICE_MONITOR_SCHEMA if kind == "ServiceMonitor" else POD_MONITOR_SCHEMA
    enabled = {monitor: {"enabled": True}}
    spec = render(enabled).one(kind)["spec"]
    assert not {"scrapeProtocols", "scrapeClassicHistograms"} & spec.keys()
    protocols = ["PrometheusProto", "OpenMetricsText1.0.0", "PrometheusText0.0.4"]
    sm = {"scrapeProtocols": protocols, "scrapeClassicHistograms": True}
    values: dict[str, Any] = {"serviceMonitor": {**sm, "enabled": kind == "ServiceMonitor"}}
    if kind == "PodMonitor":
        values["podMonitor"] = {"enabled": True}
    obj = render(values).one(kind)
    jsonschema.validate(obj, schema)
    assert obj["spec"]["scrapeProtocols"] == protocols
    assert obj["spec"]["scrapeClassicHistograms"] is True
    off = render({"serviceMonitor": {"scrapeClassicHistograms": False, "enabled": True}})
    assert off.one("ServiceMonitor")["spec"]["scrapeClassicHistograms"] is False


POD_MONITOR_SCHEMA: dict[str, Any] = copy.deepcopy(SERVICE_MONITOR_SCHEMA)
POD_MONITOR_SCHEMA["properties"]["kind"] = {"const": "PodMonitor"}
_pm_spec = POD_MONITOR_SCHEMA["properties"]["spec"]
_pm_spec["required"] = ["selector", "podMetricsEndpoints"]
_pm_spec["properties"]["podMetricsEndpoints"] = _pm_spec["properties"].pop("endpoints")
# A PodMonitor endpoint has no bearerTokenFile, nor the PodMonitor targetLabels (there is no Service).
del _pm_spec["properties"]["podMetricsEndpoints"]["items"]["properties"]["bearerTokenFile"]
del _pm_spec["properties"]["targetLabels"]


def test_pod_monitor_instead_of_the_service_monitor(render: RenderFn) -> None:
    values = {
        "podMonitor": {"enabled": True},
        "auth": {"enabled": True},
        "tls": {"enabled": True, "secretName": "tm-tls"},
        "serviceMonitor": {"namespace": "monitoring", "labels": {"release": "prom"}, "sampleLimit": 1000},
    }
    rendered = render(values)
    assert "ServiceMonitor" not in rendered.kinds()
    pm = rendered.one("PodMonitor", FULLNAME)
    jsonschema.validate(pm, POD_MONITOR_SCHEMA)
    assert pm["metadata"]["namespace"] == "monitoring"
    assert pm["metadata"]["labels"]["release"] == "prom"
    spec = pm["spec"]
    assert spec["sampleLimit"] == 1000 and spec["jobLabel"] == "app.kubernetes.io/name"
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    pod_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels[spec["jobLabel"]] == "trainer-metrics"  # the job the alerts select by default
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "https" and endpoint["scheme"] == "https" and endpoint["honorLabels"] is True
    assert endpoint["authorization"]["credentials"]["name"] == f"{FULLNAME}-scraper-token"
    assert rendered.one("Secret")["metadata"]["namespace"] == "monitoring"


def test_target_labels_copy_service_and_pod_labels_onto_the_series(render: RenderFn) -> None:
    rendered = render(
        {
            "serviceMonitor": {
                "enabled": True,
                "targetLabels": ["team"],
                "podTargetLabels": ["team", "tier"],
            },
            "commonLabels": {"team": "ml-platform"},
            "podLabels": {"tier": "infra"},
        }
    )
    sm = rendered.one("ServiceMonitor")
    jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)
    assert sm["spec"]["targetLabels"] == ["team"]
    assert sm["spec"]["podTargetLabels"] == ["team", "tier"]
    assert rendered.one("Service")["metadata"]["labels"]["team"] == "ml-platform"
    pod_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert {"team", "tier"} <= pod_labels.keys()
    pm = render({"podMonitor": {"enabled": True}, "serviceMonitor": {"podTargetLabels": ["tier"]}}).one(
        "PodMonitor"
    )
    jsonschema.validate(pm, POD_MONITOR_SCHEMA)
    assert pm["spec"]["podTargetLabels"] == ["tier"] and "targetLabels" not in pm["spec"]
    plain = render({"serviceMonitor": {"enabled": True}}).one("ServiceMonitor")["spec"]
    assert not {"targetLabels", "podTargetLabels"} & plain.keys()


# --- Grafana dashboard -------------------------------------------------------------------------------------


def _substitute_grafana_variables(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", "x", expr)


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels, with those of collapsed rows (a collapsed row holds its panels)."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_dashboard_is_valid_and_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in all_panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "namespace", "runtime_ref"} <= variables
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"]
            inner = re.fullmatch(r"label_values\((.*), *[a-z_]+\)", query)
            assert inner, query
            assert metric_names(_substitute_grafana_variables(inner[1])) <= known_series_names()
    used: set[str] = set()
    targets = dashboard_targets(dashboard)
    assert len(targets) >= 20
    for title, expr in targets:
        try:
            names = metric_names(_substitute_grafana_variables(expr))
        except ValueError as exc:
            pytest.fail(f"panel {title!r}: {exc}: {expr}")
        assert names <= known_series_names(), (
            f"panel {title!r}: unknown metrics {names - known_series_names()}"
        )
        used |= names
    # Trainer metrics and exporter health are all on the dashboard.
    for needed in (
        "kubeflow_trainer_trainjob_created_total",
        "kubeflow_trainer_trainjob_finished_total",
        "kubeflow_trainer_trainjob_lifetime_seconds_bucket",
        "kubeflow_trainer_trainjobs",
        "kubeflow_trainer_trainjob_requested_training_nodes_per_job_bucket",
        "kubeflow_trainer_trainjob_requested_accelerators_bucket",
        "kubeflow_trainer_runtime_info",
        "trainer_metrics_leader",
        "trainer_metrics_informer_synced",
        "trainer_metrics_informer_stale",
        "trainer_metrics_informer_last_event_age_seconds",
        "up",
    ):
        assert needed in used, needed
    exprs = " ".join(e for _, e in targets)
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.95," in exprs
    assert "sum by (reason)" in exprs and "sum by (runtime_ref)" in exprs


# Panels over an hour: rare events, where a window of a few scrapes would show nothing but spikes, and the
# stats of the last hour. Every other range is $__rate_interval, which follows the zoom. docs/deploy.md (6.
# Dashboard) lists these panels.
HOUR_WINDOW_PANELS = {
    "Created / h",
    "Failed / h (all namespaces)",
    "Failure ratio, 1h (all namespaces)",
    "Failure ratio by runtime_ref, 1h (all namespaces)",
    "Failure share by reason, 1h (all namespaces)",
    "Failures / h by runtime_ref and reason (all namespaces)",
    "TrainJob lifetime p50 / p95 by runtime_ref (failed; all namespaces, 1h)",
    "Leader transitions / h",
    "Relists / h by reason",
    "Watch restarts / h by reason",
}


# GPU-hours over the dashboard's time range (docs/gpu.md, Dashboard, lists these panels).
TIME_RANGE_PANELS = {
    "GPU efficiency (busy / held GPU-hours)",
    "Idle GPU-hours",
    "Idle GPU-hours by namespace and runtime_ref",
}


def test_dashboard_ranges_follow_the_zoom_except_for_rare_events() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    titles = {p["title"] for p in all_panels(dashboard)}
    assert titles >= HOUR_WINDOW_PANELS | TIME_RANGE_PANELS, (HOUR_WINDOW_PANELS | TIME_RANGE_PANELS) - titles
    ranges = 0
    for title, expr in dashboard_targets(dashboard):
        for window in re.findall(r"\[([^\]]+)\]", expr):
            ranges += 1
            wanted = (
                "1h"
                if title in HOUR_WINDOW_PANELS
                else "$__range"
                if title in TIME_RANGE_PANELS
                else "$__rate_interval"
            )
            assert window == wanted, f"panel {title!r}: [{window}], expected [{wanted}]: {expr}"
    assert ranges >= 30
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    documented = " ".join(deploy.split())  # the list wraps across lines
    for title in HOUR_WINDOW_PANELS:
        assert f"`{title}`" in documented, f"docs/deploy.md does not list the hour window of {title!r}"
    gpu_doc = " ".join((ROOT / "docs" / "gpu.md").read_text().split())
    for title in TIME_RANGE_PANELS:
        assert f"`{title}`" in gpu_doc, f"docs/gpu.md does not list the time-range window of {title!r}"


def test_dashboard_gpu_row() -> None:
    """A row, collapsed (its queries run only when opened: it is empty unless prometheusRule.gpu is on), with
    cluster efficiency, idle GPU-hours by namespace and runtime, the top TrainJobs by idle GPUs and a
    per-TrainJob table, over the GPU recordings and the pod series."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    (row,) = [p for p in dashboard["panels"] if p["type"] == "row" and "GPU" in p["title"]]
    assert row["collapsed"] is True and "prometheusRule.gpu.enabled" in row["title"]
    titles = {p["title"]: p for p in row["panels"]}
    assert {
        "GPU efficiency (busy / held GPU-hours)",
        "Cluster GPU efficiency (busy / held GPUs)",
        "Idle GPU-hours by namespace and runtime_ref",
        "Top TrainJobs by idle GPUs",
    } <= titles.keys()
    (table,) = [p for t, p in titles.items() if t.startswith("TrainJobs holding GPUs")]
    columns = {
        prop["value"]
        for override in table["fieldConfig"]["overrides"]
        for prop in override["properties"]
        if prop["id"] == "displayName"
    }
    assert columns == {"held", "reporting", "busy", "memory", "progress", "ETA", "restarts"}
    used: set[str] = set()
    for panel in row["panels"]:
        for target in panel["targets"]:
            selectors, _ = selectors_and_groupings(_substitute_grafana_variables(target["expr"]))
            for sel in selectors:
                used.add(sel.name)
                if sel.name.startswith("kubeflow_trainer_"):
                    assert ("job", "=~", "x") in matchers(sel), f"{panel['title']}: {sel.name} without $job"
    recorded = {r["record"] for g in load_yaml(GPU_FILE)["groups"] for r in g["rules"] if "record" in r}
    assert used - set(POD_SERIES) - exporter_series_names() <= recorded
    assert {
        "namespace_trainjob:kubeflow_trainer_gpu_busy:avg",
        "namespace_trainjob:kubeflow_trainer_gpus_reporting:count",
        "namespace_trainjob:kubeflow_trainer_gpu_memory_used:ratio",
        "namespace_runtime_ref:kubeflow_trainer_accelerators_allocated:sum",
        "namespace_runtime_ref:kubeflow_trainer_gpus_busy:sum",
        "kubeflow_trainer_trainjob_allocated_accelerators",
        "kubeflow_trainer_trainjob_restarts",
        "kubeflow_trainer_trainjob_status_progress_percent",
        "kubeflow_trainer_trainjob_status_estimated_remaining_seconds",
    } <= used


def test_dashboard_shows_exemplars_on_the_lifetime_and_time_to_running_panels() -> None:
    """From a panel to the job (docs/metrics.md): Grafana draws the exemplars of these queries as points."""
    dashboard = json.loads((CHART_DIR / "files" / "dashboard.json").read_text())
    flagged = {
        (panel["title"], target["refId"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if target.get("exemplar") is True
    }
    wanted = {
        (panel["title"], target["refId"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if re.search(r"(lifetime|startup)_seconds_bucket", target["expr"])
    }
    assert len(wanted) >= 6 and flagged == wanted


def test_dashboard_config_map(render: RenderFn) -> None:
    cm: Obj = render(
        {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "Kubeflow"},
            }
        }
    ).one("ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Kubeflow"}
    (key,) = cm["data"]
    assert key.endswith(".json")
    assert json.loads(cm["data"][key]) == json.loads(DASHBOARD_FILE.read_text())


# --- the service's own metric families ---------------------------------------------------------------------

# Labels Prometheus adds from the scrape target (ServiceMonitor: job, namespace, pod, service, endpoint, ...),
# and `cluster`, which a global view (external labels seen by Thanos or Mimir) adds; where it is absent, a
# `by (cluster, ...)` groups as if it were not there.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container", "cluster"}


class _FakeInformer:
    name = "trainjobs"
    synced = True
    stale = False
    streaming_list = False
    last_event = 0.0

    def __len__(self) -> int:
        return 0


def exported_series() -> dict[str, set[str]]:
    """Series names the service exports and their label names, read from the service's own code."""
    from prometheus_client import CollectorRegistry

    from app.kube.informer_telemetry import InformerTelemetry
    from app.metrics.per_job import PerJobSeries
    from app.metrics.pods import PodSeries
    from app.metrics.telemetry import SelfTelemetry
    from app.metrics.trainer_metrics import TrainerMetricState

    out: dict[str, set[str]] = {}
    registry = CollectorRegistry()
    SelfTelemetry(registry)
    InformerTelemetry(registry).register(_FakeInformer())
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    no_trainjobs = PodSeries(lambda namespace, name: None)
    families = [*TrainerMetricState().families, *PerJobSeries().families, *no_trainjobs.families]
    for fam in families:
        metric = fam.metric()
        labels = set(fam.label_names)
        if metric.type == "counter":
            out[metric.name + "_total"] = labels
        elif metric.type == "histogram":
            out[metric.name + "_bucket"] = labels | {"le"}
            out[metric.name + "_sum"] = labels
            out[metric.name + "_count"] = labels
        else:
            out[metric.name] = labels
    return out


def _expressions() -> list[tuple[str, str]]:
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules(load_yaml(ALERTS_FILE))]
    for g in load_yaml(GPU_FILE)["groups"]:
        exprs += [(f"gpu rule {r.get('record') or r.get('alert')}", r["expr"]) for r in g["rules"]]
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    for title, expr in dashboard_targets(dashboard):
        exprs.append((f"panel {title}", _substitute_grafana_variables(expr)))
    return exprs


def test_the_service_exports_the_metrics_the_chart_relies_on() -> None:
    exported = exported_series()
    for name in sorted(exporter_series_names()):
        assert name in exported, f"the service does not export {name}"
    # Series of the GPU rules' contract, of dcgm-exporter, and recorded by files/gpu.yaml: their labels.
    others = {**POD_SERIES, **DCGM_SERIES, **RECORDED_SERIES}
    for where, expr in _expressions():
        selectors: list[Any] = []
        grouping: set[str] = set()

        def visit(node: Any, selectors: list[Any] = selectors, grouping: set[str] = grouping) -> None:
            if isinstance(node, promql_parser.VectorSelector):
                selectors.append(node)
            elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
                grouping.update(node.modifier.labels)

        promql_parser.walk(promql_parser.parse(expr), visit)
        available = set(TARGET_LABELS)
        for sel in selectors:
            if sel.name in PROMETHEUS_METRICS:
                continue
            if sel.name in others and sel.name not in exported:
                labels = others[sel.name] | TARGET_LABELS
                used = {m.name for m in sel.matchers.matchers}
                assert used <= labels, f"{where}: {sel.name} has no label(s) {used - labels}"
                available |= others[sel.name]
                continue
            assert sel.name in exported, f"{where}: {sel.name} is not exported by the service"
            labels = exported[sel.name] | TARGET_LABELS
            used = {m.name for m in sel.matchers.matchers}
            assert used <= labels, f"{where}: {sel.name} has no label(s) {used - labels}"
            available |= exported[sel.name]
        assert grouping <= available, f"{where}: grouping by unknown label(s) {grouping - available}"


def test_the_service_exports_the_pod_series_the_gpu_rules_join_on() -> None:
    exported = exported_series()
    for name, labels in POD_SERIES.items():
        assert exported.get(name) == labels, name
