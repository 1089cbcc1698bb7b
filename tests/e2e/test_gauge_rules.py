"""The chart's alerts on the kubeflow_trainer_trainjobs gauge keep their ``for:`` clock when the gauge moves
from one leader's series to the next (``promtool test rules`` on helm/trainer-metrics/files/alerts.yaml).

At a leader change the gauge's series changes identity (the new leader's ``pod`` and ``instance``), and the
old one goes stale (a staleness marker) when the old leader stops exporting, possibly before the new leader's
first scrape. An instant selector sees nothing in between; the alert's expression is then empty for one
evaluation, the alert is dropped and its ``for:`` clock restarts. The rules read the gauge through
``last_over_time(...[range])`` (range selectors skip staleness markers) and aggregate pod and instance away,
so the alert keeps its label set and its ``activeAt`` (``ALERTS_FOR_STATE``'s value). The same input against
an instant selector (the control below) restarts the clock: the test can tell the difference.

The real Prometheus run of the same property is tests/e2e/test_promql_exact.py (fleet: graceful hand-over,
leader kill, rolling restart).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.prom import PROMTOOL, requires_prometheus

pytestmark = requires_prometheus

ALERTS_FILE = Path(__file__).resolve().parents[2] / "helm" / "trainer-metrics" / "files" / "alerts.yaml"
JOB = "trainer-metrics"  # the rules file's default selector (job="trainer-metrics")
R1 = "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed"
INTERVAL_S = 30  # the chart's default ServiceMonitor interval

# (alert, state label, its for: in minutes)
GAUGE_ALERTS = [
    ("KubeflowTrainJobsPendingTooLong", "pending", 60),
    ("KubeflowTrainJobsSuspendedTooLong", "suspended", 1440),
]


def gauge_series(pod: str, state: str, values: str) -> dict[str, str]:
    labels = {
        "job": JOB,
        "namespace": "team-a",  # honorLabels: the TrainJob's namespace, not the pod's
        "runtime_ref": R1,
        "state": state,
        "pod": pod,
        "instance": f"{pod}:8080",
        "endpoint": "http",
    }
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"kubeflow_trainer_trainjobs{{{selector}}}", "values": values}


def hand_over_case(alert: str, state: str, for_minutes: int, gap_samples: int) -> dict[str, Any]:
    """Leader a exports the gauge from 0 to the hand-over, then goes stale; after ``gap_samples`` scrape
    intervals without either, leader b exports it. The alert must fire at ``for`` after 0, with activeAt 0."""
    handover = (for_minutes // 2) * 60 // INTERVAL_S  # half way through the for: window
    total = (for_minutes + 10) * 60 // INTERVAL_S
    # promtool: "1xN" is N+1 samples, "_xN" N missing ones. a: samples 0..handover, its staleness marker at
    # handover+1; b: first sample gap_samples intervals after that marker.
    a = f"1x{handover} stale"
    b = f"_x{handover + 1 + gap_samples} 1x{total - handover - gap_samples}"
    return {
        "interval": f"{INTERVAL_S}s",
        "input_series": [
            gauge_series("trainer-metrics-a", state, a),
            gauge_series("trainer-metrics-b", state, b),
        ],
        "promql_expr_test": [
            {
                # The alert has been active since 0 all along: its for: clock did not restart.
                "expr": f'max(ALERTS_FOR_STATE{{alertname="{alert}"}})',
                "eval_time": f"{for_minutes // 2 + 3}m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
            {
                # One alert (no pod or instance label), firing at for: after the start.
                "expr": f'count(ALERTS{{alertname="{alert}", alertstate="firing"}})',
                "eval_time": f"{for_minutes + 2}m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
        ],
    }


def run_promtool(
    rules: dict[str, Any], tests: list[dict[str, Any]], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    rules_file = tmp_path / "alerts.yaml"
    rules_file.write_text(yaml.safe_dump(rules))
    test_file = tmp_path / "test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules_file)], "evaluation_interval": f"{INTERVAL_S}s", "tests": tests}
        )
    )
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120, check=False
    )


def chart_rules() -> dict[str, Any]:
    rules: dict[str, Any] = yaml.safe_load(ALERTS_FILE.read_text())
    return rules


def gauge_rule(rules: dict[str, Any], alert: str) -> dict[str, Any]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return dict(rule)
    raise AssertionError(f"{alert} not in {ALERTS_FILE}")


@pytest.mark.parametrize(("alert", "state", "for_minutes"), GAUGE_ALERTS, ids=[a for a, _, _ in GAUGE_ALERTS])
@pytest.mark.parametrize(
    "gap_samples",
    [1, 3],  # graceful: one scrape interval with neither series; a crash: about a lease duration more
    ids=["graceful", "crash"],
)
def test_a_gauge_alert_keeps_its_for_clock_across_a_leader_change(
    alert: str, state: str, for_minutes: int, gap_samples: int, tmp_path: Path
) -> None:
    rules = chart_rules()
    rule = gauge_rule(rules, alert)
    assert f"{rule['for']}" in (f"{for_minutes}m", f"{for_minutes // 60}h"), rule["for"]
    out = run_promtool(rules, [hand_over_case(alert, state, for_minutes, gap_samples)], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_control_an_instant_selector_restarts_the_for_clock(tmp_path: Path) -> None:
    """The same hand-over against the gauge read without last_over_time: promtool reports the restarted
    clock, so the test above would catch a rule that loses it."""
    alert, state, for_minutes = GAUGE_ALERTS[0]
    rules = chart_rules()
    rule = gauge_rule(rules, alert)
    instant = re.sub(r"last_over_time\((.*?)\[[0-9a-z]+\]\)", r"\1", rule["expr"], flags=re.S)
    assert instant != rule["expr"], f"{alert} does not read the gauge through last_over_time: {rule['expr']}"
    control = {"groups": [{"name": "control", "rules": [{**rule, "expr": instant}]}]}
    out = run_promtool(control, [hand_over_case(alert, state, for_minutes, 1)], tmp_path)
    assert out.returncode != 0, out.stdout
    assert "ALERTS_FOR_STATE" in out.stdout + out.stderr, out.stdout + out.stderr


def test_a_gauge_that_really_drops_resolves_the_alert_within_the_range(tmp_path: Path) -> None:
    """The price of the range: the last pending job starts (the series disappears on the leader) and the alert
    resolves once the last sample leaves the range, not at once."""
    alert, state, for_minutes = GAUGE_ALERTS[0]
    rules = chart_rules()
    rng = re.search(r"last_over_time\(.*?\[([0-9]+)m\]\)", gauge_rule(rules, alert)["expr"], flags=re.S)
    assert rng, gauge_rule(rules, alert)["expr"]
    minutes = int(rng.group(1))
    end = (for_minutes + 10) * 60 // INTERVAL_S  # last sample at for + 10 m, then the series is gone
    case = {
        "interval": f"{INTERVAL_S}s",
        "input_series": [gauge_series("trainer-metrics-a", state, f"1x{end} stale")],
        "alert_rule_test": [
            {"eval_time": f"{for_minutes + 10 + minutes + 1}m", "alertname": alert, "exp_alerts": []},
        ],
        "promql_expr_test": [
            {
                "expr": f'count(ALERTS{{alertname="{alert}", alertstate="firing"}})',
                "eval_time": f"{for_minutes + 10 + minutes - 1}m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            }
        ],
    }
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # compared by alert_rule_test; checked by `promtool check rules`
    out = run_promtool(rules, [case], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
