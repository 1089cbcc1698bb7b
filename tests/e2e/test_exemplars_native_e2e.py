"""Exemplars and native histograms through the real Prometheus (Debian's 2.42). One service on the simulated
cluster, two Prometheus servers scraping it every second (module fixture ``run``):

* ``om``: ``--enable-feature=exemplar-storage``: Prometheus' default Accept, OpenMetrics, exemplars;
* ``native``: ``--enable-feature=exemplar-storage,native-histograms``: Prometheus asks for protobuf first,
  and gets the Trainer histograms as native histograms, exemplars included.

Checked against the generator's ground truth: every exemplar ``/api/v1/query_exemplars`` returns names a
TrainJob the simulated cluster ran (namespace, name and uid of one job) with its own value; the native
lifetime histogram's ``histogram_quantile(0.9, sum(rate(...[5m])))`` lies in the schema's bucket of the
quantile of the true lifetimes (weighted per series as ``rate()`` weighs them);
``histogram_count(increase())`` of every native series is the number of jobs that finished in it, each
series born at zero."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.metrics import native
from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.fleet import InProcessService
from tests.support.prom import Prometheus, requires_prometheus, running_prometheus, wait_for

pytestmark = [requires_prometheus, pytest.mark.timeout(240)]

JOB = "trainer-metrics"
TARGET_LABELS = {"namespace": "trainer-metrics-e2e", "pod": "trainer-metrics-0"}
SEED = 20250625
RUN_SECONDS = 12.0
GENERATOR_RATE = 20.0  # actions a second of complete lifecycles
MIN_FINISHED = 12
LIFETIME = "kubeflow_trainer_trainjob_lifetime_seconds"
SEL = f'job="{JOB}"'
BASE = 2.0 ** (2.0**-native.SCHEMA)  # a native bucket's width at the schema served (9.05 %)


@dataclass
class Run:
    service: InProcessService
    om: Prometheus
    native: Prometheus
    before: TruthSnapshot
    after: TruthSnapshot
    first: float  # wall time before the first Trainer scrape
    at: float  # a scrape of ``om`` after the stream settled
    at_native: float  # a scrape of ``native`` after the stream settled (its samples' own timestamp)

    def finished(self) -> list[Any]:
        return self.after.terminal_since(self.before)


def settled(service: InProcessService, after: TruthSnapshot, before: TruthSnapshot) -> bool:
    """The service's own /metrics counts every job the generator finished and created."""
    text = httpx.get(f"{service.url}/metrics", timeout=10.0).text
    total = {"finished": 0.0, "created": 0.0}
    for line in text.splitlines():
        for what in total:
            if line.startswith(f"kubeflow_trainer_trainjob_{what}_total{{"):
                total[what] += float(line.rsplit(" ", 1)[1])
    return total["finished"] == sum(after.finished_since(before).values()) and total["created"] == sum(
        after.created_since(before).values()
    )


def scraped_after(prom: Prometheus, after: float) -> float:
    return prom.last_scrape_after(JOB, after)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    service = InProcessService(seed=SEED, max_jobs=80, populate=40, time_warp=600.0)
    service.start()
    try:
        wait_for(
            lambda: "kubeflow_trainer_runtime_info{" in httpx.get(f"{service.url}/metrics", timeout=5.0).text,
            timeout=30,
            what="the service to lead",
        )
        targets = {JOB: (f"127.0.0.1:{service.port}", TARGET_LABELS)}
        with (
            running_prometheus(tmp_path_factory.mktemp("om"), targets, ["exemplar-storage"]) as om,
            running_prometheus(
                tmp_path_factory.mktemp("native"), targets, ["exemplar-storage", "native-histograms"]
            ) as nat,
        ):
            first = time.time()
            for prom in (om, nat):  # Trainer metrics stored before the workload: its first increments count
                wait_for(
                    lambda p=prom: p.query(f"kubeflow_trainer_runtime_info{{{SEL}}}"),  # type: ignore[misc]
                    timeout=30,
                    what="a first scrape with Trainer metrics",
                )
            before = service.start_generator(GENERATOR_RATE, lifecycles=True)
            time.sleep(RUN_SECONDS)  # the workload's duration (scenario); what follows waits for settling
            wait_for(  # ... and long enough for the jobs the tests read, however loaded the machine
                lambda: len(service.truth().terminal_since(before)) >= MIN_FINISHED,
                timeout=90,
                what=f"{MIN_FINISHED} finished TrainJobs",
            )
            service.stop_generator()
            after = service.truth()
            wait_for(lambda: settled(service, after, before), timeout=30, what="the service to settle")
            # Past the zero hold of the last new series (2 s), then one scrape of each server after that.
            now = time.time() + 2.5
            wait_for(lambda: time.time() > now, timeout=10, what="the zero hold", interval=0.1)
            yield Run(service, om, nat, before, after, first, scraped_after(om, now), scraped_after(nat, now))
    finally:
        service.stop()


def test_the_workload_finished_jobs_in_several_series(run: Run) -> None:
    finished = run.finished()
    assert len(finished) >= MIN_FINISHED
    assert len({(f.result, f.runtime_ref) for f in finished}) >= 2


# --- exemplars ----------------------------------------------------------------------------------------------


def real_jobs(run: Run) -> dict[str, tuple[str, str]]:
    """uid -> (namespace, name) of every TrainJob the simulated cluster created."""
    return {uid: (req.namespace, req.name) for uid, req in run.after.requests.items()}


def exemplars_of(prom: Prometheus, run: Run, expr: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
    # An exemplar's timestamp is its event's time: a terminal condition's, which the simulated cluster's
    # time warp puts up to the longest lifetime ahead of the wall clock.
    ahead = max((f.lifetime_seconds or 0.0) for f in run.after.terminal.values())
    out = []
    for series in prom.query_exemplars(expr, run.first - 60, run.at + ahead + 60):
        out.extend((series["seriesLabels"], ex) for ex in series["exemplars"])
    return out


@pytest.mark.parametrize("server", ["om", "native"])
def test_exemplars_name_real_jobs_with_their_values(run: Run, server: str) -> None:
    """OpenMetrics: on the classic _bucket series. Protobuf: Prometheus 2.42 takes a native histogram's
    exemplars from its classic buckets and stores them on the native series (no _bucket, no le)."""
    prom = run.om if server == "om" else run.native
    bucket = "_bucket" if server == "om" else ""
    jobs = real_jobs(run)
    lifetimes = {uid: f.lifetime_seconds for uid, f in run.after.terminal.items()}
    found: Counter[str] = Counter()
    for metric in (
        f"{LIFETIME}{bucket}",
        "kubeflow_trainer_trainjob_finished_total",
        "kubeflow_trainer_trainjob_created_total",
        f"kubeflow_trainer_trainjob_startup_seconds{bucket}",
        f"kubeflow_trainer_trainjob_requested_training_nodes_per_job{bucket}",
    ):
        for series, ex in exemplars_of(prom, run, f"{metric}{{{SEL}}}"):
            labels = ex["labels"]
            assert set(labels) == {"namespace", "name", "uid"}, labels
            assert jobs.get(labels["uid"]) == (labels["namespace"], labels["name"]), (metric, labels)
            value = float(ex["value"])
            if metric.startswith(LIFETIME):
                # The job's own lifetime, in the bucket that carries it.
                assert value == lifetimes[labels["uid"]], (labels, value)
                if "le" in series:
                    le = float(series["le"])
                    assert value <= le and all(value > b for b in _bounds_below(le))
            elif metric.endswith("_total"):
                assert value == 1.0
            found[metric] += 1
    assert found[f"{LIFETIME}{bucket}"] >= 3 and found["kubeflow_trainer_trainjob_finished_total"] >= 2, found
    assert found["kubeflow_trainer_trainjob_created_total"] >= 2, found


def _bounds_below(le: float) -> list[float]:
    from app.metrics.counted import LIFETIME_BUCKETS

    return [b for b in LIFETIME_BUCKETS if b < le]


# --- native histograms -------------------------------------------------------------------------------------


def test_prometheus_asked_for_protobuf_and_stored_native_histograms(run: Run) -> None:
    assert run.service.recorder is not None
    accepts = {r["accept"].split(",")[0]: r["content_type"] for r in run.service.recorder.requests}
    assert accepts[
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"
    ].startswith("application/vnd.google.protobuf")
    assert accepts["application/openmetrics-text;version=1.0.0"].startswith("application/openmetrics-text")
    count = run.native.values(
        f"histogram_count({LIFETIME}{{{SEL}}})", "result", "runtime_ref", at=run.at_native
    )
    want = Counter((f.result, f.runtime_ref) for f in run.finished())
    assert count == {k: float(v) for k, v in want.items()}
    # Prometheus 2.42 keeps only the native histogram of a histogram it scraped as one (2.45+:
    # scrape_classic_histograms, the chart's serviceMonitor.scrapeClassicHistograms); counters are unchanged.
    assert not run.native.query(f"{LIFETIME}_bucket{{{SEL}}}", run.at_native)
    assert run.native.query(f"kubeflow_trainer_trainjob_finished_total{{{SEL}}}", run.at_native)


def weighted_quantile(values: list[tuple[float, float]], q: float) -> tuple[float, float]:
    """(lowest, highest) value whose cumulative weight reaches ``q`` of the total, within float rounding."""
    ordered = sorted(values)
    total = sum(w for _, w in ordered)
    out = []
    for rank in (q * total * (1 - 1e-9), q * total * (1 + 1e-9)):
        cumulative = 0.0
        for value, weight in ordered:
            cumulative += weight
            if cumulative >= rank:
                out.append(value)
                break
        else:
            out.append(ordered[-1][0])
    return out[0], out[1]


def test_native_quantile_agrees_with_the_truth_within_the_schemas_resolution(run: Run) -> None:
    prom = run.native
    got = prom.scalar(f"histogram_quantile(0.9, sum(rate({LIFETIME}{{{SEL}}}[5m])))", run.at_native)
    # rate() extrapolates each series by its own factor; the truth is weighed the same way, per series.
    rates = prom.values(
        f"histogram_count(rate({LIFETIME}{{{SEL}}}[5m]))", "result", "runtime_ref", at=run.at_native
    )
    counts = Counter((f.result, f.runtime_ref) for f in run.finished())
    weights = {key: rates[key] / n for key, n in counts.items()}
    truth = [
        (max(f.lifetime_seconds or 0.0, 0.0), weights[(f.result, f.runtime_ref)]) for f in run.finished()
    ]
    low, high = weighted_quantile(truth, 0.9)
    # histogram_quantile interpolates inside the bucket (base^(i-1), base^i] that holds the rank.
    assert low / BASE * (1 - 1e-9) <= got <= high * BASE * (1 + 1e-9), (got, low, high)
    # Unweighted, from the raw cumulative histograms: the same bound against the plain truth quantile.
    raw = prom.scalar(f"histogram_quantile(0.9, sum({LIFETIME}{{{SEL}}}))", run.at_native)
    low, high = weighted_quantile([(value, 1.0) for value, _ in truth], 0.9)
    assert low / BASE * (1 - 1e-9) <= raw <= high * BASE * (1 + 1e-9), (raw, low, high)


def test_histogram_count_of_increase_is_the_jobs_finished(run: Run) -> None:
    """Per native series, ``histogram_count(increase())`` over a range from its first sample to the last
    scrape (no extrapolation: Prometheus 2.42 extrapolates a histogram's start by half an interval, later
    versions stop at zero as for counters) equals the jobs finished in it; every series starts at 0."""
    prom = run.native
    seconds = math.ceil(run.at_native - run.first) + 60
    raw = prom._api(
        "/api/v1/query", {"query": f"{LIFETIME}{{{SEL}}}[{seconds}s]", "time": f"{run.at_native:.3f}"}
    )
    assert raw["resultType"] == "matrix"
    got: dict[tuple[str, str], float] = defaultdict(float)
    for series in raw["result"]:
        points = series["histograms"]
        assert float(points[0][1]["count"]) == 0.0, series["metric"]  # born at zero
        first_ms = round(float(points[0][0]) * 1000)
        span_ms = round(run.at_native * 1000) - first_ms
        labels = ",".join(f'{k}="{v}"' for k, v in series["metric"].items() if k != "__name__")
        expr = f"histogram_count(increase({LIFETIME}{{{labels}}}[{span_ms}ms]))"
        key = (series["metric"]["result"], series["metric"]["runtime_ref"])
        got[key] += prom.scalar(expr, run.at_native)
    want = Counter((f.result, f.runtime_ref) for f in run.finished())
    assert {k: round(v, 6) for k, v in got.items()} == {k: float(v) for k, v in want.items()}
