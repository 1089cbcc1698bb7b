"""Values: every service setting is exposed, typed like the service types it, and bad values fail at
install time with a message naming the value."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import helm_python as helm
import pytest

from app.config import ENV_PREFIX, Settings, load_settings
from kubesim.trainer.settings import SimSettings

from .chart import CHART_DIR, RenderFn, load_yaml

SCHEMA: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
CONFIG_SCHEMA: dict[str, Any] = SCHEMA["properties"]["config"]["properties"]

# Settings with a dedicated value instead of a `config` key (the value drives other objects too).
DEDICATED = {
    "namespaces": "watchNamespaces",
    "watch_cluster_runtimes": "watchClusterRuntimes",
    "leader_election": "leaderElection.enabled",
    "lease_name": "leaderElection.leaseName",
    "lease_namespace": "the release namespace",
    "identity": "the pod name",
    "lease_duration_seconds": "leaderElection.leaseDurationSeconds",
    "renew_deadline_seconds": "leaderElection.renewDeadlineSeconds",
    "retry_period_seconds": "leaderElection.retryPeriodSeconds",
    "port": "containerPort",
    "auth_enabled": "auth.enabled",
    "tls_cert_file": "tls.enabled / tls.certKey",
    "tls_key_file": "tls.enabled / tls.keyKey",
}

# A non-default, valid value for every `config` key.
CONFIG_SAMPLE: dict[str, Any] = {
    "kubeconfig": "/etc/kube/config",
    "kube_context": "prod",
    "host": "::",
    "probe_port": 9090,
    "max_connections": 100,
    "max_connections_per_client": 10,
    "http_header_timeout_seconds": 7.5,
    "http_keep_alive_timeout_seconds": 3,
    "debug_endpoints": False,
    "auth_cache_seconds": 12.5,
    "auth_outage_grace_seconds": 90.5,
    "auth_reviews_per_second": 7.5,
    "auth_reviews_per_client_per_second": 2.5,
    "log_level": "DEBUG",
    "log_format": "text",
    "watch_timeout_min_seconds": 120,
    "watch_timeout_max_seconds": 240,
    "watch_inactivity_timeout_seconds": 45.5,
    "list_page_size": 250,
    "streaming_list": "auto",
    "initial_events_timeout_seconds": 45.5,
    "max_unknown_runtime_refs": 7,
    "accelerator_resource_patterns": ["nvidia.com/gpu", "example.com/npu-*"],
    "max_accelerator_classes": 9,
    "max_failure_reasons": 11,
    "max_object_bytes": 8 * 1024 * 1024,
    "terminal_page_max": 77,
    "handover_journal_size": 123456,
    "heap_trim_interval_seconds": 120.0,
    "zero_hold_seconds": 30.0,
    "exemplars": False,
    "handover_wait_seconds": 12.5,
    "per_trainjob_series": True,
    "per_trainjob_namespaces": ["team-a"],
    "per_trainjob_max_jobs": 250,
    "per_trainjob_max_trainer_metrics": 4,
    "pod_series": False,
    "pod_series_max_pods": 250,
    "simulate": True,
    "sim_jobs": 3,
    "sim_rate": 0.5,
    "sim_seed": 42,
}


def _config_keys() -> set[str]:
    # The simulated cluster's workload settings (sim/kubesim/trainer/settings.py) are config keys too, as
    # sim_<field>.
    return set(Settings.model_fields) - set(DEDICATED) | _SIM_KEYS


_SIM_KEYS = {"sim_" + f for f in SimSettings.model_fields}


def test_every_setting_has_a_value() -> None:
    # A setting added to app/config.py must be added to the chart: to `config` (schema, values.yaml
    # comment, CONFIG_SAMPLE) or as a dedicated value.
    assert set(DEDICATED) <= set(Settings.model_fields), set(DEDICATED) - set(Settings.model_fields)
    assert set(CONFIG_SCHEMA) == _config_keys()
    assert set(CONFIG_SAMPLE) == _config_keys()
    values_yaml = (CHART_DIR / "values.yaml").read_text()
    for key in sorted(_config_keys()):
        assert re.search(rf"^#\s+{key}: ", values_yaml, re.M), (
            f"config.{key} is not documented in values.yaml"
        )


def _constraints(prop: dict[str, Any]) -> dict[str, Any]:
    types: set[str] = set()
    for alt in prop.get("anyOf", [prop]):
        t = alt.get("type")
        types.update([t] if isinstance(t, str) else t or [])
    out: dict[str, Any] = {"types": types}
    # Bounds of an optional number sit in its non-null anyOf branch (pydantic) or at the top (the chart).
    for alt in [prop, *prop.get("anyOf", [])]:
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum"):
            if key in alt:
                out[key] = alt[key]
    if prop.get("minLength", 0) > 0:
        out["minLength"] = prop["minLength"]
    return out


# Keys whose `null` in the chart means "the chart decides" rather than "the service's default":
# debug_endpoints null serves /debug/* only with auth.enabled (who may read TrainJob names across tenants).
CHART_DECIDES_WHEN_NULL = {"debug_endpoints"}


@pytest.mark.parametrize("key", sorted(_config_keys()))
def test_config_key_typed_like_the_setting(key: str) -> None:
    if key in _SIM_KEYS:
        setting = SimSettings.model_json_schema()["properties"][key.removeprefix("sim_")]
    else:
        setting = Settings.model_json_schema()["properties"][key]
    chart = _constraints(CONFIG_SCHEMA[key])
    if key in CHART_DECIDES_WHEN_NULL:
        assert "null" in chart["types"], key
        chart["types"] = chart["types"] - {"null"}
    assert chart == _constraints(setting), key


def test_rendered_environment_is_accepted_by_the_service(
    render: RenderFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {
        "config": CONFIG_SAMPLE,
        "watchNamespaces": ["team-a", "team-b"],
        "watchClusterRuntimes": False,
        "leaderElection": {
            "leaseName": "tm-lock",
            "leaseDurationSeconds": 20,
            "renewDeadlineSeconds": 12.5,
            "retryPeriodSeconds": 3,
        },
        "containerPort": 9443,
        "auth": {"enabled": True},
        "tls": {"enabled": True, "secretName": "tm-tls"},
    }
    env = render(values).env(pod_name="tm-trainer-metrics-7f9c-x1")
    ours = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    # Every setting is set by the chart here, and nothing else under the prefix.
    assert set(ours) == {ENV_PREFIX + f.upper() for f in set(Settings.model_fields) | _SIM_KEYS}
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = load_settings()
    workload = SimSettings()
    for key, value in CONFIG_SAMPLE.items():
        if key in _SIM_KEYS:
            assert getattr(workload, key.removeprefix("sim_")) == value, key
        else:
            assert getattr(s, key) == value, key
    assert s.namespaces == ["team-a", "team-b"]
    assert s.watch_cluster_runtimes is False
    assert (s.lease_name, s.lease_namespace, s.identity) == ("tm-lock", "obs", "tm-trainer-metrics-7f9c-x1")
    assert (s.lease_duration_seconds, s.renew_deadline_seconds, s.retry_period_seconds) == (20, 12.5, 3)
    assert s.leader_election is True
    assert s.port == 9443
    assert s.auth_enabled is True
    assert (s.tls_cert_file, s.tls_key_file) == (
        "/etc/trainer-metrics/tls/tls.crt",
        "/etc/trainer-metrics/tls/tls.key",
    )


def test_default_and_production_environments_are_accepted(
    render: RenderFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    all_values: list[dict[str, Any]] = [{}, load_yaml(CHART_DIR / "values-production.yaml")]
    for values in all_values:
        with monkeypatch.context() as m:
            for name in list(os.environ):
                if name.startswith(ENV_PREFIX):
                    m.delenv(name)
            for name, value in render(values).env().items():
                m.setenv(name, value)
            s = load_settings()
            assert s.log_format == "json" and s.leader_election


def test_null_config_keeps_the_service_default(render: RenderFn) -> None:
    env = render({"config": {"kubeconfig": None, "sim_seed": None, "log_level": "WARNING"}}).env()
    assert "TRAINER_METRICS_KUBECONFIG" not in env and "TRAINER_METRICS_SIM_SEED" not in env
    assert env["TRAINER_METRICS_LOG_LEVEL"] == "WARNING"


def test_defaults_pass_the_schema(chart: helm.Chart) -> None:
    chart.validate_schema({})
    chart.validate_schema(load_yaml(CHART_DIR / "values-production.yaml"))
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"


BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("replicas-zero", {"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
    ("replicas-string", {"replicaCount": "2"}, "at '/replicaCount': got string, want integer"),
    ("unknown-top-level", {"replicas": 3}, "additional properties 'replicas' not allowed"),
    (
        "unknown-config-key",
        {"config": {"log_levl": "INFO"}},
        "at '/config': additional properties 'log_levl'",
    ),
    ("config-namespaces", {"config": {"namespaces": "a"}}, "additional properties 'namespaces' not allowed"),
    ("log-level-enum", {"config": {"log_level": "LOUD"}}, "at '/config/log_level': value must be one of"),
    ("log-format-enum", {"config": {"log_format": "xml"}}, "at '/config/log_format'"),
    ("page-size-max", {"config": {"list_page_size": 20000}}, "at '/config/list_page_size': maximum"),
    ("object-bytes-min", {"config": {"max_object_bytes": 1024}}, "at '/config/max_object_bytes': minimum"),
    (
        "inactivity-zero",
        {"config": {"watch_inactivity_timeout_seconds": 0}},
        "at '/config/watch_inactivity_timeout_seconds'",
    ),
    ("debug-endpoints-type", {"config": {"debug_endpoints": "yes"}}, "got string, want null or boolean"),
    (
        "lease-duration-negative",
        {"leaderElection": {"leaseDurationSeconds": -1}},
        "at '/leaderElection/leaseDurationSeconds'",
    ),
    ("lease-name-invalid", {"leaderElection": {"leaseName": "Not_A_Name"}}, "at '/leaderElection/leaseName'"),
    ("namespace-invalid", {"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0'"),
    ("namespace-duplicate", {"watchNamespaces": ["a", "a"]}, "at '/watchNamespaces'"),
    ("port-range", {"containerPort": 70000}, "at '/containerPort': maximum"),
    ("tls-without-secret", {"tls": {"enabled": True}}, "at '/tls"),
    ("anti-affinity-enum", {"podAntiAffinity": "maybe"}, "at '/podAntiAffinity': value must be one of"),
    ("interval-format", {"serviceMonitor": {"interval": "30 seconds"}}, "at '/serviceMonitor/interval'"),
    (
        "unknown-alert",
        {"prometheusRule": {"disabledAlerts": ["NoSuchAlert"]}},
        "at '/prometheusRule/disabledAlerts/0'",
    ),
    (
        "pdb-min-available",
        {"podDisruptionBudget": {"minAvailable": "half"}},
        "at '/podDisruptionBudget/minAvailable'",
    ),
    (
        "reader-subject-namespace",
        {"auth": {"metricsReaderSubjects": [{"kind": "ServiceAccount", "name": "p"}]}},
        "at '/auth/metricsReaderSubjects/0'",
    ),
    ("image-digest", {"image": {"digest": "latest"}}, "at '/image/digest'"),
    ("service-type", {"service": {"type": "ExternalName"}}, "at '/service/type'"),
    ("registry-scheme", {"image": {"registry": "https://registry.example.com"}}, "at '/image/registry'"),
    ("global-registry", {"global": {"imageRegistry": "a b"}}, "at '/global/imageRegistry'"),
    (
        "global-pull-secret",
        {"global": {"imagePullSecrets": [{"nom": "x"}]}},
        "at '/global/imagePullSecrets/0'",
    ),
    ("namespace-override", {"namespaceOverride": "Not_A_Namespace"}, "at '/namespaceOverride'"),
    ("revision-history", {"revisionHistoryLimit": -1}, "at '/revisionHistoryLimit'"),
    (
        "target-label",
        {"serviceMonitor": {"targetLabels": ["not a label"]}},
        "at '/serviceMonitor/targetLabels/0'",
    ),
    (
        "test-timeout",
        {"testFramework": {"readyTimeoutSeconds": 0}},
        "at '/testFramework/readyTimeoutSeconds'",
    ),
]


@pytest.mark.parametrize(
    ("values", "needle"), [(v, n) for _, v, n in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES]
)
def test_schema_rejects_bad_values(render: RenderFn, values: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert needle in str(err.value), str(err.value)


BAD_COMBINATIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "replicas-without-election",
        {"leaderElection": {"enabled": False}},
        "replicaCount > 1 requires leaderElection.enabled",
    ),
    (
        "lease-not-above-renew",
        {"leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}},
        "leaderElection.leaseDurationSeconds (10) must be greater than leaderElection.renewDeadlineSeconds",
    ),
    (
        "renew-not-above-retry",
        {"leaderElection": {"renewDeadlineSeconds": 2.4, "retryPeriodSeconds": 2}},
        "leaderElection.renewDeadlineSeconds (2.4) must be greater than 1.2",
    ),
    (
        "watch-timeouts",
        {"config": {"watch_timeout_min_seconds": 600, "watch_timeout_max_seconds": 300}},
        "config.watch_timeout_max_seconds (300) must not be below config.watch_timeout_min_seconds (600)",
    ),
    (
        "watch-timeout-max-below-default-min",
        {"config": {"watch_timeout_max_seconds": 200}},
        "config.watch_timeout_max_seconds (200) must not be below config.watch_timeout_min_seconds (300)",
    ),
    (
        "use-cluster-role-all-namespaces",
        {"rbac": {"useClusterRole": False}, "watchClusterRuntimes": False},
        "rbac.useClusterRole false needs watchNamespaces",
    ),
    (
        "use-cluster-role-cluster-runtimes",
        {"rbac": {"useClusterRole": False}, "watchNamespaces": ["a"]},
        "rbac.useClusterRole false needs watchClusterRuntimes: false",
    ),
    (
        "use-cluster-role-auth",
        {
            "rbac": {"useClusterRole": False},
            "watchNamespaces": ["a"],
            "watchClusterRuntimes": False,
            "auth": {"enabled": True},
        },
        "rbac.useClusterRole false cannot go with auth.enabled",
    ),
    (
        "pod-monitor-target-labels",
        {"podMonitor": {"enabled": True}, "serviceMonitor": {"targetLabels": ["team"]}},
        "serviceMonitor.targetLabels does not exist in a PodMonitor",
    ),
    (
        "sa-name-required",
        {"serviceAccount": {"create": False}},
        "serviceAccount.name is required when serviceAccount.create is false",
    ),
]


@pytest.mark.parametrize(
    ("values", "needle"), [(v, n) for _, v, n in BAD_COMBINATIONS], ids=[i for i, _, _ in BAD_COMBINATIONS]
)
def test_template_rejects_bad_combinations(render: RenderFn, values: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm.HelmRenderError) as err:
        render(values)
    assert needle in str(err.value), str(err.value)


def test_election_off_with_one_replica_skips_lease_checks(render: RenderFn) -> None:
    render({"replicaCount": 1, "leaderElection": {"enabled": False, "leaseDurationSeconds": 1}})


def test_disabled_alerts_enum_lists_the_alerts_files() -> None:
    names = [
        r["alert"]
        for file in ("alerts.yaml", "gpu.yaml")
        for g in load_yaml(CHART_DIR / "files" / file)["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    enum = SCHEMA["properties"]["prometheusRule"]["properties"]["disabledAlerts"]["items"]["enum"]
    assert enum == names
