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

from .chart import CHART_DIR, FULLNAME, NAMESPACE, Obj, RenderFn, load_yaml, production_values

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
    "kubeflow_trainer_trainjobs": "gauge",
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


def known_series_names() -> set[str]:
    names = set(PROMETHEUS_METRICS)
    for name, kind in TRAINER_METRICS.items():
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names


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
    assert exprs["TrainerMetricsAbsent"] == "absent(trainer_metrics_leader)"
    assert exprs["TrainerMetricsNoLeader"] == "sum by (namespace, job) (trainer_metrics_leader) == 0"
    assert exprs["TrainerMetricsMultipleLeaders"] == "sum by (namespace, job) (trainer_metrics_leader) > 1"
    assert exprs["TrainerMetricsInformerNotSynced"] == "trainer_metrics_informer_synced == 0"
    assert exprs["TrainerMetricsInformerStale"] == "trainer_metrics_informer_stale == 1"
    assert 'result="failed"' in exprs["KubeflowTrainJobFailureRatioHigh"]
    assert 'state="pending"' in exprs["KubeflowTrainJobsPendingTooLong"]
    assert 'state="suspended"' in exprs["KubeflowTrainJobsSuspendedTooLong"]


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
        [("5m", "TrainerMetricsAbsent", []), ("15m", "TrainerMetricsAbsent", [{"severity": "critical"}])],
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


def test_promtool_unit_tests_of_the_alerts(tmp_path: Path) -> None:
    tool = promtool()
    # promtool compares annotations too; they are checked by `check rules`, so compare labels only here.
    rules = load_yaml(ALERTS_FILE)
    for rule in alert_rules(rules):
        rule.pop("annotations", None)
    rules_file = tmp_path / "alerts.yaml"
    rules_file.write_text(yaml.safe_dump(rules))
    tests = []
    for _name, series, checks in ALERT_CASES:
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
    rule = render({"prometheusRule": {"enabled": True}}).one("PrometheusRule", FULLNAME)
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"]["groups"] == load_yaml(ALERTS_FILE)["groups"]
    # The alerts' own {{ $labels }} templates survive Helm.
    assert "{{ $labels.runtime_ref }}" in json.dumps(rule)


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
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {
        "serverName": f"{FULLNAME}.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "trainer-metrics-tls", "key": "ca.crt"}},
    }
    assert endpoint["honorLabels"] is True
    custom = copy.deepcopy(production_values())
    custom["serviceMonitor"]["tlsConfig"] = {"insecureSkipVerify": True}
    (endpoint,) = render(custom).one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


# --- Grafana dashboard -------------------------------------------------------------------------------------


def _substitute_grafana_variables(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", "x", expr)


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_dashboard_is_valid_and_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in dashboard["panels"]:
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

# Labels Prometheus adds from the scrape target (ServiceMonitor: job, namespace, pod, service, endpoint, ...).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}


class _FakeInformer:
    name = "trainjobs"
    synced = True
    stale = False
    last_event = 0.0

    def __len__(self) -> int:
        return 0


def exported_series() -> dict[str, set[str]]:
    """Series names the service exports and their label names, read from the service's own code."""
    from prometheus_client import CollectorRegistry

    from app.kube.informer_telemetry import InformerTelemetry
    from app.metrics.telemetry import SelfTelemetry
    from app.metrics.trainer_metrics import TrainerMetricState

    out: dict[str, set[str]] = {}
    registry = CollectorRegistry()
    SelfTelemetry(registry)
    InformerTelemetry(registry).register(_FakeInformer())
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    state = TrainerMetricState()
    families = [v for v in vars(state).values() if hasattr(v, "label_names") and hasattr(v, "metric")]
    assert len(families) == 7
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
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    for title, expr in dashboard_targets(dashboard):
        exprs.append((f"panel {title}", _substitute_grafana_variables(expr)))
    return exprs


def test_the_service_exports_the_metrics_the_chart_relies_on() -> None:
    exported = exported_series()
    for name in sorted(known_series_names() - PROMETHEUS_METRICS):
        assert name in exported, f"the service does not export {name}"
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
            assert sel.name in exported, f"{where}: {sel.name} is not exported by the service"
            labels = exported[sel.name] | TARGET_LABELS
            used = {m.name for m in sel.matchers.matchers}
            assert used <= labels, f"{where}: {sel.name} has no label(s) {used - labels}"
            available |= exported[sel.name]
        assert grouping <= available, f"{where}: grouping by unknown label(s) {grouping - available}"
