"""End to end with a real Prometheus: the service (in-process, on the simulated cluster, driven by a seeded
workload generator) is scraped by Prometheus every second; the tests read everything back through
Prometheus' HTTP API and compare it with the service's own /metrics and with the generator's ground truth,
then run every PromQL expression the project ships (the README's and docs/metrics.md's examples, alerts,
Grafana dashboard) against it.

One Prometheus and one service for the module (fixture ``e2e``): start the service, wait until it leads,
start Prometheus, start the generator (its truth snapshot at that moment is where the service's counters
start), let it run for RUN_SECONDS while Prometheus scrapes, stop it, wait until the service's /metrics
equals the truth (the watch stream has settled), wait for a scrape after that, and evaluate there."""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.fleet import InProcessService
from tests.support.markdown import promql_examples
from tests.support.prom import (
    PROMETHEUS_ACCEPT,
    SCRAPE_INTERVAL_SECONDS,
    Prometheus,
    finite,
    missing_grouping_labels,
    promtool,
    requires_prometheus,
    running_prometheus,
    wait_for,
)

pytestmark = requires_prometheus

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
ALERTS_FILE = ROOT / "helm" / "trainer-metrics" / "files" / "alerts.yaml"
DASHBOARD_FILE = ROOT / "helm" / "trainer-metrics" / "files" / "dashboard.json"

JOB = "trainer-metrics"
# `cluster`, as a global view's external label would add it: the alerts and panels group by it.
TARGET_LABELS = {
    "namespace": "trainer-metrics-e2e",
    "pod": "trainer-metrics-0",
    "endpoint": "http",
    "cluster": "e2e",
}
SEED = 20240611
RUN_SECONDS = 12.0
GENERATOR_RATE = 40.0  # steps/s: ~480 steps; a step moves one job one stage on, so dozens finish
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval); a little more here
# so that a scrape delayed by a busy machine still leaves two samples in each window.
RATE_INTERVAL = f"{10 * SCRAPE_INTERVAL_SECONDS}s"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class E2E:
    service: InProcessService
    prom: Prometheus
    before: TruthSnapshot  # truth when the generator started: the service's counters start here
    after: TruthSnapshot  # truth once the generator stopped
    steps: int
    first_scrape: float  # wall time of the first scrape that had Trainer metrics
    eval_time: float  # wall time of a scrape after the stream settled: the instant queries use it
    settled_metrics: str  # the service's /metrics (text format) once settled

    def metrics_text(self, accept: str | None = None) -> httpx.Response:
        headers = {"Accept": accept} if accept else {}
        resp = httpx.get(f"{self.service.url}/metrics", headers=headers, timeout=10.0)
        resp.raise_for_status()
        return resp


def parse_samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def by_labels(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for (n, labels), v in samples.items():
        if n == name:
            d = dict(labels)
            out[tuple(d.get(k, "") for k in keys)] += v
    return dict(out)


def nonzero(d: dict[Any, float]) -> dict[Any, float]:
    return {k: v for k, v in d.items() if v}


def expected_counters(before: TruthSnapshot, after: TruthSnapshot) -> dict[str, dict[tuple[str, ...], float]]:
    """What the Trainer counters must read: the truth's deltas over the generator's run."""
    lifetimes: dict[tuple[str, ...], float] = defaultdict(float)
    lifetime_counts: Counter[tuple[str, ...]] = Counter()
    for fin in after.terminal_since(before):
        lifetime_counts[(fin.result, fin.runtime_ref)] += 1
        lifetimes[(fin.result, fin.runtime_ref)] += fin.lifetime_seconds or 0.0
    node_counts: Counter[tuple[str, ...]] = Counter()
    nodes: Counter[tuple[str, ...]] = Counter()
    accel_counts: Counter[tuple[str, ...]] = Counter()
    accels: Counter[tuple[str, ...]] = Counter()
    startup_counts: Counter[tuple[str, ...]] = Counter()
    for started in after.started_since(before):
        startup_counts[(started.runtime_ref,)] += 1
    admission_counts: Counter[tuple[str, ...]] = Counter()
    admission_waits: dict[tuple[str, ...], float] = defaultdict(float)
    for admitted in after.admitted_since(before):
        admission_counts[(admitted.runtime_ref,)] += 1
        admission_waits[(admitted.runtime_ref,)] += admitted.wait_seconds
    for req in after.requests_since(before):
        node_counts[(req.runtime_ref,)] += 1
        nodes[(req.runtime_ref,)] += req.nodes
        for accelerator_class, count in req.accelerators:  # one observation per class requested
            accel_counts[(accelerator_class, req.runtime_ref)] += 1
            accels[(accelerator_class, req.runtime_ref)] += count
    return {  # zero entries dropped: a sum of zeros is a series with value 0, compared as absent
        "created": {k: float(v) for k, v in after.created_since(before).items()},
        "finished": {k: float(v) for k, v in after.finished_since(before).items()},
        "trainjobs": {k: float(v) for k, v in after.jobs.items()},
        "lifetime_count": {k: float(v) for k, v in lifetime_counts.items()},
        "lifetime_sum": {k: v for k, v in lifetimes.items() if v},
        "nodes_count": {k: float(v) for k, v in node_counts.items()},
        "nodes_sum": {k: float(v) for k, v in nodes.items() if v},
        "accel_count": {k: float(v) for k, v in accel_counts.items()},
        "accel_sum": {k: float(v) for k, v in accels.items() if v},
        # Time to running: the count is exact; its sum is the service's clock, compared with /metrics only.
        "startup_count": {k: float(v) for k, v in startup_counts.items()},
        "admission_count": {k: float(v) for k, v in admission_counts.items()},
        "admission_sum": {k: v for k, v in admission_waits.items() if v},
    }


# (key in expected_counters, series name, label names)
TRAINER_SERIES = [
    ("created", "kubeflow_trainer_trainjob_created_total", ("namespace", "runtime_ref")),
    ("finished", "kubeflow_trainer_trainjob_finished_total", ("result", "reason", "runtime_ref")),
    ("trainjobs", "kubeflow_trainer_trainjobs", ("namespace", "runtime_ref", "state")),
    ("lifetime_count", "kubeflow_trainer_trainjob_lifetime_seconds_count", ("result", "runtime_ref")),
    ("lifetime_sum", "kubeflow_trainer_trainjob_lifetime_seconds_sum", ("result", "runtime_ref")),
    ("nodes_count", "kubeflow_trainer_trainjob_requested_training_nodes_per_job_count", ("runtime_ref",)),
    ("nodes_sum", "kubeflow_trainer_trainjob_requested_training_nodes_per_job_sum", ("runtime_ref",)),
    (
        "accel_count",
        "kubeflow_trainer_trainjob_requested_accelerators_count",
        ("accelerator_class", "runtime_ref"),
    ),
    (
        "accel_sum",
        "kubeflow_trainer_trainjob_requested_accelerators_sum",
        ("accelerator_class", "runtime_ref"),
    ),
    ("startup_count", "kubeflow_trainer_trainjob_startup_seconds_count", ("runtime_ref",)),
    ("admission_count", "kubeflow_trainer_trainjob_admission_wait_seconds_count", ("runtime_ref",)),
    ("admission_sum", "kubeflow_trainer_trainjob_admission_wait_seconds_sum", ("runtime_ref",)),
]


def close(a: dict[Any, float], b: dict[Any, float]) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-6) for k in a)


def mismatch(what: str, got: dict[Any, float], want: dict[Any, float]) -> str:
    keys = sorted(set(got) | set(want))
    diff = {k: (got.get(k), want.get(k)) for k in keys if got.get(k) != want.get(k)}
    return f"{what}: (got, want) differ for {len(diff)} of {len(keys)} keys: {dict(list(diff.items())[:10])}"


class Unsettled(str):
    """A falsy description of why the service's metrics do not equal the truth yet (for wait_for)."""

    def __bool__(self) -> bool:
        return False


def settled(service: InProcessService, before: TruthSnapshot, after: TruthSnapshot) -> str:
    """The service's /metrics text once its Trainer metrics equal the truth, else an Unsettled reason."""
    resp = httpx.get(f"{service.url}/metrics", timeout=10.0)
    resp.raise_for_status()
    samples = parse_samples(resp.text)
    want = expected_counters(before, after)
    problems = [
        mismatch(name, got, want[key])
        for key, name, labels in TRAINER_SERIES
        if not close(got := nonzero(by_labels(samples, name, *labels)), want[key])
    ]
    return Unsettled("; ".join(problems)) if problems else resp.text


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    # Most of the population exists (and much of it runs) before the workload starts: enough jobs finish.
    service = InProcessService(seed=SEED, max_jobs=120, populate=80, time_warp=600.0)
    service.start()
    try:

        def leading() -> bool:
            ready = httpx.get(f"{service.url}/readyz", timeout=5.0).status_code == 200
            leader = httpx.get(f"{service.url}/debug/leadership", timeout=5.0).json()["is_leader"]
            body = httpx.get(f"{service.url}/metrics", timeout=5.0).text
            return ready and leader and "kubeflow_trainer_runtime_info{" in body

        wait_for(leading, timeout=30, what="the service to sync and lead")
        targets = {JOB: (f"127.0.0.1:{service.port}", TARGET_LABELS)}
        with running_prometheus(tmp_path_factory.mktemp("prometheus"), targets) as prom:
            # Trainer metrics in Prometheus before the workload starts, so that the counters' first
            # samples precede their increases (increase()/rate() then see them).
            first_scrape = wait_for(
                lambda: prom.query(f'timestamp(kubeflow_trainer_runtime_info{{job="{JOB}"}})'),
                timeout=30,
                what="a first scrape with Trainer metrics",
            )
            first = min(float(s["value"][1]) for s in first_scrape)
            before = service.start_generator(GENERATOR_RATE)
            time.sleep(RUN_SECONDS)  # the workload's duration (scenario); what follows waits for settling
            wait_for(  # ... and long enough for what the tests compare, however loaded the machine
                lambda: enough_happened(before, service.truth()),
                timeout=90,
                what="enough TrainJobs created and finished",
            )
            steps = service.stop_generator()
            after = service.truth()
            text = wait_for(
                lambda: settled(service, before, after),
                timeout=30,
                what="the service's /metrics to equal the generator's truth",
            )
            settled_at = time.time()
            eval_time = prom.last_scrape_after(JOB, settled_at)
            yield E2E(service, prom, before, after, steps, first, eval_time, text)
    finally:
        service.stop()


# --- 1. the Trainer metrics arrive in Prometheus with the expected values ---------------------------------


def enough_happened(before: TruthSnapshot, after: TruthSnapshot) -> bool:
    """Enough happened for the comparisons below to mean something."""
    want = expected_counters(before, after)
    return (
        sum(want["created"].values()) >= 20
        and sum(want["finished"].values()) >= 10
        and {k[0] for k in want["finished"]} == {"succeeded", "failed"}
        and {k[2] for k in want["trainjobs"]} >= {"pending", "running", "succeeded"}
    )


def test_the_workload_ran(e2e: E2E) -> None:
    assert e2e.steps > 0
    assert enough_happened(e2e.before, e2e.after), expected_counters(e2e.before, e2e.after)


def test_runtime_info_counts_the_runtimes_the_generator_created(e2e: E2E) -> None:
    prom, at = e2e.prom, e2e.eval_time
    generator_runtimes = e2e.service.call(lambda: sorted(e2e.service.gen().truth.runtimes))
    assert len(e2e.service.runtime_refs) == len(generator_runtimes) >= 5
    assert prom.scalar(f'count(kubeflow_trainer_runtime_info{{job="{JOB}"}})', at) == len(generator_runtimes)
    got = prom.values(f'kubeflow_trainer_runtime_info{{job="{JOB}"}}', "kind", "namespace", "name", at=at)
    # ClusterTrainingRuntimes have namespace="" (so no namespace label in Prometheus: the target's namespace
    # does not leak in through honor_labels); TrainingRuntimes keep their own namespace.
    assert sorted(got) == generator_runtimes
    assert set(got.values()) == {1.0}
    kinds = Counter(kind for kind, _, _ in generator_runtimes)
    assert kinds["ClusterTrainingRuntime"] >= 1 and kinds["TrainingRuntime"] >= 1, kinds


def test_trainjobs_gauge_equals_the_live_jobs(e2e: E2E) -> None:
    prom, at = e2e.prom, e2e.eval_time
    live = e2e.service.call(lambda: len(e2e.service.gen().jobs))
    truth_jobs = {k: float(v) for k, v in e2e.after.jobs.items()}
    assert sum(truth_jobs.values()) == live
    assert prom.scalar(f'sum(kubeflow_trainer_trainjobs{{job="{JOB}"}})', at) == live
    got = prom.values(
        f'kubeflow_trainer_trainjobs{{job="{JOB}"}}', "namespace", "runtime_ref", "state", at=at
    )
    assert nonzero(got) == truth_jobs, mismatch("trainjobs", got, truth_jobs)


@pytest.mark.parametrize(("key", "name", "labels"), TRAINER_SERIES, ids=[t[1] for t in TRAINER_SERIES])
def test_trainer_series_equal_the_truth_and_the_services_own_metrics(
    e2e: E2E, key: str, name: str, labels: tuple[str, ...]
) -> None:
    """Prometheus' value at the scrape after the stream settled == the service's /metrics == the truth."""
    want = expected_counters(e2e.before, e2e.after)[key]
    assert want, f"the run produced no {name}"
    own = nonzero(by_labels(parse_samples(e2e.settled_metrics), name, *labels))
    assert close(own, want), mismatch(f"/metrics {name}", own, want)
    got = nonzero(e2e.prom.values(f'{name}{{job="{JOB}"}}', *labels, at=e2e.eval_time))
    assert close(got, own), mismatch(f"Prometheus {name}", got, own)


def test_every_exported_trainer_sample_is_in_prometheus_with_its_value(e2e: E2E) -> None:
    """Not only the series above: every kubeflow_trainer_* sample of the settled exposition (histogram
    buckets included) is in Prometheus with the same value; Prometheus has no other Trainer series."""
    target = {"job": JOB, "instance": f"127.0.0.1:{e2e.service.port}", **TARGET_LABELS}
    own: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for (name, labels), value in parse_samples(e2e.settled_metrics).items():
        if not name.startswith("kubeflow_trainer_"):
            continue
        # honor_labels: the sample's labels, plus the target's where the sample has none of that name;
        # Prometheus drops empty label values.
        expected = {**target, **dict(labels)}
        own[(name, tuple(sorted((k, v) for k, v in expected.items() if v != "")))] = value
    assert len(own) >= 100
    result = e2e.prom.query(f'{{__name__=~"kubeflow_trainer_.+", job="{JOB}"}}', e2e.eval_time)
    got = {
        (
            s["metric"]["__name__"],
            tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")),
        ): float(s["value"][1])
        for s in result
    }
    missing = sorted(set(own) - set(got))
    extra = sorted(set(got) - set(own))
    assert not missing and not extra, f"missing in Prometheus: {missing[:5]}; only in Prometheus: {extra[:5]}"
    assert close(got, own), mismatch("Trainer samples", got, own)


def test_per_trainjob_series_name_every_live_job_with_its_state(e2e: E2E) -> None:
    """On in simulate mode: one info and one state series per live TrainJob, in the truth's state; running
    ones that report trainerStatus have a loss; the text metric (a checkpoint path) is skipped and counted."""
    prom, at = e2e.prom, e2e.eval_time
    live = e2e.service.call(lambda: len(e2e.service.gen().jobs))
    assert prom.scalar(f'count(kubeflow_trainer_trainjob_info{{job="{JOB}"}})', at) == live
    got = prom.values(
        f'count by (namespace, state) (kubeflow_trainer_trainjob_status_state{{job="{JOB}"}})',
        "namespace",
        "state",
        at=at,
    )
    want: dict[tuple[str, ...], float] = defaultdict(float)
    for (namespace, _, state), n in e2e.after.jobs.items():
        want[(namespace, state)] += n
    assert got == dict(want), mismatch("per-TrainJob states", got, dict(want))
    running_with_loss = (
        f'kubeflow_trainer_trainjob_status_trainer_metric{{job="{JOB}", metric="loss"}} '
        f'and ignoring (metric, state) kubeflow_trainer_trainjob_status_state{{job="{JOB}", state="running"}}'
    )
    assert finite(prom.query(running_with_loss, at)), "no running TrainJob with a loss"
    skipped = prom.values(
        f'trainer_metrics_per_trainjob_skipped_trainer_metrics{{job="{JOB}"}}', "reason", at=at
    )
    assert skipped[("unparsable",)] > 0 and skipped[("over_cap",)] == 0, skipped


def test_one_leader_and_synced_informers(e2e: E2E) -> None:
    prom, at = e2e.prom, e2e.eval_time
    assert prom.values(f'trainer_metrics_leader{{job="{JOB}"}}', "namespace", "pod", at=at) == {
        (TARGET_LABELS["namespace"], TARGET_LABELS["pod"]): 1.0
    }
    synced = prom.values(f'trainer_metrics_informer_synced{{job="{JOB}"}}', "informer", at=at)
    assert len(synced) >= 3 and set(synced.values()) == {1.0}, synced
    stale = prom.values(f'trainer_metrics_informer_stale{{job="{JOB}"}}', "informer", at=at)
    assert set(stale) == set(synced) and set(stale.values()) == {0.0}, stale
    # The default sync is the paginated LIST; no sync failed. The failure series exist from the start at 0,
    # so the runbook's increase() over them has data (and would count a first failure).
    streaming = prom.values(f'trainer_metrics_informer_streaming_list{{job="{JOB}"}}', "informer", at=at)
    assert streaming == dict.fromkeys(synced, 0.0), streaming
    failed = f'increase(trainer_metrics_informer_sync_failures_total{{job="{JOB}"}}[1h])'
    failures = prom.values(f"sum by (informer, method) ({failed})", "informer", "method", at=at)
    assert failures == {(i, m): 0.0 for (i,) in synced for m in ("list", "streaming")}, failures


# --- 2. every shipped PromQL expression parses and returns data -------------------------------------------


def documented_promql() -> list[str]:
    """The PromQL examples of docs/metrics.md (the metrics reference) and of the README's summary."""
    reference = promql_examples(METRICS_DOC.read_text())
    assert len(reference) >= 10, f"docs/metrics.md: expected its PromQL examples, found {reference}"
    readme = promql_examples(README.read_text())
    assert readme, "the README has no ```promql block"
    return list(dict.fromkeys(reference + readme))


def test_documented_promql_examples_return_data(e2e: E2E) -> None:
    exprs = documented_promql()
    failures = []
    for expr in exprs:  # the documents' exact text, windows included ([1h] works with a few samples)
        try:
            result = e2e.prom.query(expr, e2e.eval_time)
        except AssertionError as exc:
            failures.append(f"{expr}\n    -> {exc}")
            continue
        if not finite(result):
            failures.append(f"{expr}\n    -> no data (result: {result})")
        elif missing := missing_grouping_labels(expr, result):
            failures.append(f"{expr}\n    -> no series has the grouping label(s) {sorted(missing)}")
    assert not failures, "README and docs/metrics.md PromQL examples:\n" + "\n".join(failures)
    assert e2e.prom.scalar("sum(trainer_metrics_leader)", e2e.eval_time) == 1.0  # "exactly one leader"


# Alerts whose condition must be quiet on this healthy cluster: the expression evaluates without error to an
# empty result, and the inner (unfiltered) part of it returns data, so the emptiness is the condition's
# doing and not a missing metric or a mistyped label.
# Every selector carries the exporter's job (the rules file's default selector, and JOB here), and every
# aggregation starts with `cluster` (absent in this single Prometheus: it groups as if not there).
SEL = f'job="{JOB}"'
QUIET_ALERTS = {
    "TrainerMetricsAbsent": [f"trainer_metrics_leader{{{SEL}}}"],
    "TrainerMetricsNoLeader": [f"sum by (cluster, namespace, job) (trainer_metrics_leader{{{SEL}}})"],
    "TrainerMetricsMultipleLeaders": [f"sum by (cluster, namespace, job) (trainer_metrics_leader{{{SEL}}})"],
    "TrainerMetricsLeaderFlapping": [
        f"sum by (cluster, namespace, job) (increase(trainer_metrics_leader_transitions_total{{{SEL}}}[1h]))"
    ],
    "TrainerMetricsInformerNotSynced": [f"trainer_metrics_informer_synced{{{SEL}}}"],
    "TrainerMetricsInformerStale": [f"trainer_metrics_informer_stale{{{SEL}}}"],
    "TrainerMetricsRelistsFrequent": [
        "sum by (cluster, namespace, job, pod, informer) "
        f"(increase(trainer_metrics_informer_relists_total{{{SEL}}}[30m]))"
    ],
    "TrainerMetricsLimitHit": [
        f"sum by (cluster, namespace, job, limit) (increase(trainer_metrics_limit_hits_total{{{SEL}}}[1h]))"
    ],
}
# Alerts whose condition depends on the random workload (it may or may not hold now; `for:` would decide):
# each must evaluate without error, and its inner parts must return data.
WORKLOAD_ALERTS = {
    "KubeflowTrainJobFailureRatioHigh": [
        "sum by (cluster, runtime_ref) "
        f'(rate(kubeflow_trainer_trainjob_finished_total{{{SEL}, result="failed"}}[1h]))',
        f"sum by (cluster, runtime_ref) (rate(kubeflow_trainer_trainjob_finished_total{{{SEL}}}[1h]))",
        f"sum by (cluster, runtime_ref) (increase(kubeflow_trainer_trainjob_finished_total{{{SEL}}}[1h]))",
    ],
    "KubeflowTrainJobsPendingTooLong": [
        "max by (cluster, namespace, runtime_ref) "
        f'(last_over_time(kubeflow_trainer_trainjobs{{{SEL}, state="pending"}}[3m]))'
    ],
    "KubeflowTrainJobsSuspendedTooLong": [
        "max by (cluster, namespace, runtime_ref) "
        f'(last_over_time(kubeflow_trainer_trainjobs{{{SEL}, state="suspended"}}[3m]))'
    ],
    # Per-TrainJob series (on in simulate mode): no job of this run is two hours old, but its parts have data.
    "KubeflowTrainJobStuckPending": [
        f"time() - kubeflow_trainer_trainjob_created_timestamp_seconds{{{SEL}}}",
        f'kubeflow_trainer_trainjob_status_state{{{SEL}, state="pending"}}',
    ],
}


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS_FILE.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def squash(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


def test_alert_expressions_evaluate_and_their_inner_parts_return_data(e2e: E2E) -> None:
    rules = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    assert set(rules) == set(QUIET_ALERTS) | set(WORKLOAD_ALERTS), "a new alert: classify it here"
    failures = []
    for alert, expr in sorted(rules.items()):
        inner_parts = QUIET_ALERTS.get(alert) or WORKLOAD_ALERTS[alert]
        for inner in inner_parts:
            assert squash(inner) in squash(expr), f"{alert}: {inner!r} is not part of {expr!r}"
        try:
            result = e2e.prom.query(expr, e2e.eval_time)
        except AssertionError as exc:
            failures.append(f"{alert}: {exc}")
            continue
        if alert in QUIET_ALERTS and result:
            failures.append(f"{alert} would fire on a healthy cluster: {result}")
        for inner in inner_parts:
            inner_result = e2e.prom.query(inner, e2e.eval_time)
            if not finite(inner_result):
                failures.append(f"{alert}: inner part {inner!r} returns no data: {inner_result}")
            elif missing := missing_grouping_labels(inner, inner_result):
                failures.append(f"{alert}: no series of {inner!r} has the label(s) {sorted(missing)}")
    assert not failures, "\n".join(failures)


def grafana_regex_escape(value: str) -> str:
    """Grafana's escape of a variable value inside a Prometheus regex (prometheusRegularEscape): a backslash
    doubled for the PromQL string, before each regex metacharacter."""
    return re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def grafana_substitute(expr: str, variables: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", "1s")
    expr = expr.replace("$__range", "1h")
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables[m[1]], expr)


def test_dashboard_variables_list_what_the_cluster_has(e2e: E2E) -> None:
    """Grafana evaluates label_values(<selector>, <label>) through /api/v1/label/<label>/values."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    all_values = {"cluster": ".*", "job": ".*", "namespace": ".*", "runtime_ref": ".*"}
    found: dict[str, list[str]] = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*), *([a-z_]+)\)", var["query"]["query"])
        assert match, var["query"]
        found[var["name"]] = e2e.prom.label_values(match[2], grafana_substitute(match[1], all_values))
    assert found["job"] == [JOB]
    assert found["cluster"] == [TARGET_LABELS["cluster"]]
    assert sorted(found["namespace"]) == sorted({ns for ns, _, _ in e2e.after.jobs})
    # Runtimes of current TrainJobs and of those created or finished: every runtime_ref the three series
    # carry in the settled exposition (Prometheus may also list series that have gone since).
    exported = {
        dict(labels)["runtime_ref"]
        for (name, labels), _ in parse_samples(e2e.settled_metrics).items()
        if name
        in (
            "kubeflow_trainer_trainjobs",
            "kubeflow_trainer_trainjob_created_total",
            "kubeflow_trainer_trainjob_finished_total",
        )
    }
    assert {ref for _, ref in e2e.after.created_since(e2e.before)} <= exported
    assert exported <= set(found["runtime_ref"])
    assert all(ref.startswith("trainer.kubeflow.org/") or ref == "unknown" for ref in found["runtime_ref"])


def test_dashboard_panels_return_data(e2e: E2E) -> None:
    """Every panel query, with the variables at the dashboard's default selection (All, i.e. `.*`), over
    the whole run as Grafana would draw it (query_range, 1 s step)."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    variables: dict[str, str] = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["current"]["value"] == ["$__all"], var["name"]
            if var.get("allValue") is not None:
                variables[var["name"]] = var["allValue"]
            else:
                # Grafana's All without a custom value: the variable's own values as a regex alternation (the
                # job variable, so that All never means `.*`, which would take in the upstream controller).
                match = re.fullmatch(r"label_values\((.*), *([a-z_]+)\)", var["query"]["query"])
                assert match, var["query"]
                inner = grafana_substitute(
                    match[1], {**dict.fromkeys(("cluster", "job", "namespace"), ".*"), **variables}
                )
                values = e2e.prom.label_values(match[2], inner)
                assert values, var["name"]
                variables[var["name"]] = "(" + "|".join(grafana_regex_escape(v) for v in values) + ")"
    targets = [(p["title"], t) for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(targets) >= 20
    failures = []
    for title, target in targets:
        expr = grafana_substitute(target["expr"], variables)
        try:
            if target.get("instant"):
                result = e2e.prom.query(expr, e2e.eval_time)
            else:
                result = e2e.prom.query_range(expr, e2e.first_scrape, e2e.eval_time, SCRAPE_INTERVAL_SECONDS)
        except AssertionError as exc:
            failures.append(f"panel {title!r}: {exc}")
            continue
        if not finite(result):
            failures.append(f"panel {title!r}: no data: {expr}")
        elif missing := missing_grouping_labels(expr, result):
            failures.append(f"panel {title!r}: no series has the grouping label(s) {sorted(missing)}: {expr}")
    assert not failures, "\n".join(failures)


# --- 3. promtool on the exposition -------------------------------------------------------------------------


def test_promtool_check_metrics_accepts_the_exposition(e2e: E2E) -> None:
    """`curl /metrics | promtool check metrics` on the service after a workload (every Trainer family has
    series). promtool lints the text format, which is what a plain curl gets."""
    resp = e2e.metrics_text()
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "kubeflow_trainer_trainjob_lifetime_seconds_bucket{" in resp.text
    out = promtool("check", "metrics", stdin=resp.content)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        f"promtool check metrics (rc {out.returncode}):\n{out.stdout}{out.stderr}"
    )


# --- 4. the OpenMetrics scrape path ------------------------------------------------------------------------


def test_prometheus_scrapes_openmetrics_and_the_target_is_healthy(e2e: E2E) -> None:
    prom = e2e.prom

    def healthy() -> dict[str, Any] | None:
        # A scrape timing out on a busy machine is noise; an error on every scrape (a parse error of the
        # OpenMetrics body, a bad status) never clears and fails here.
        (target,) = prom.active_targets()
        return target if target["health"] == "up" and target["lastError"] == "" else None

    target = wait_for(healthy, timeout=15, what="a healthy last scrape on /api/v1/targets")
    assert target["labels"]["job"] == JOB and target["scrapeUrl"] == f"{e2e.service.url}/metrics"
    assert prom.values(f'up{{job="{JOB}"}}', at=e2e.eval_time) == {(): 1.0}
    # What Prometheus asked for and what it was given (recorded in front of the app): OpenMetrics, gzipped.
    assert e2e.service.recorder is not None
    scrapes = [r for r in e2e.service.recorder.requests if r["user_agent"].startswith("Prometheus/")]
    assert len(scrapes) >= RUN_SECONDS / SCRAPE_INTERVAL_SECONDS / 2, len(scrapes)
    for scrape in scrapes:
        assert scrape["accept"].startswith("application/openmetrics-text"), scrape
        assert scrape["status"] == "200", scrape
        assert scrape["content_type"].startswith("application/openmetrics-text; version=1.0.0"), scrape
        assert scrape["content_encoding"] == "gzip", scrape


def test_scrape_samples_scraped_is_the_exposition_sample_count(e2e: E2E) -> None:
    """scrape_samples_scraped equals the samples of the OpenMetrics body the service serves to that Accept
    header (the workload is stopped, so the series set no longer changes)."""
    prom = e2e.prom
    now = time.time()
    body = e2e.metrics_text(PROMETHEUS_ACCEPT)
    assert body.headers["content-type"].startswith("application/openmetrics-text")
    assert body.text.endswith("# EOF\n")
    samples = [line for line in body.text.splitlines() if line and not line.startswith("#")]
    at = prom.last_scrape_after(JOB, now)
    scraped = prom.scalar(f'scrape_samples_scraped{{job="{JOB}"}}', at)
    assert scraped == len(samples), (scraped, len(samples))
    assert prom.scalar(f'scrape_samples_post_metric_relabeling{{job="{JOB}"}}', at) == scraped
    trainer = sum(1 for line in samples if line.startswith("kubeflow_trainer_"))
    assert trainer >= 100 and len(samples) > trainer
    # ... and as many series as the text format has samples (the two formats carry the same samples).
    text_samples = [
        line for line in e2e.metrics_text().text.splitlines() if line and not line.startswith("#")
    ]
    assert len(text_samples) == len(samples)
    assert prom.scalar(f'count({{job="{JOB}", __name__!~"up|scrape_.+"}})', at) == len(samples)
