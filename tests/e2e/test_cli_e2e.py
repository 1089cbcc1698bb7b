"""End to end as a user runs it: ``trainer-metrics --simulate --host 127.0.0.1 --port <p> --sim-seed 1`` as a
subprocess (embedded simulated cluster, its own workload generator running at the default rate), scraped
by a real Prometheus. The workload never stops here, so counters are compared through a bracket: a
/metrics read before a scrape <= what Prometheus stored from that scrape <= a /metrics read after it."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from tests.support.prom import (
    SCRAPE_INTERVAL_SECONDS,
    Prometheus,
    promtool,
    requires_prometheus,
    running_prometheus,
    wait_for,
)

pytestmark = requires_prometheus

JOB = "trainer-metrics-cli"
SEED = 1
EXECUTABLE = Path(sys.executable).with_name("trainer-metrics")


TARGET_LABELS = {"namespace": "trainer-metrics-e2e", "pod": "cli-0"}


@dataclass
class CLI:
    url: str
    prom: Prometheus
    address: str


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def counters(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "histogram") and family.name.startswith("kubeflow_trainer_"):
            for s in family.samples:
                if s.name.endswith(("_total", "_count", "_sum", "_bucket")):
                    out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)))] = s.value
    return out


def as_stored(samples: Samples, cli: CLI) -> Samples:
    """The samples with the labels Prometheus stores: the target's labels where a sample has none of that
    name (honor_labels), empty values dropped."""
    target = {"job": JOB, "instance": cli.address, **TARGET_LABELS}
    return {
        (name, tuple(sorted({**target, **dict(labels)}.items()))): v for (name, labels), v in samples.items()
    }


def _serving_port(proc: subprocess.Popen[bytes], log_path: Path) -> int | None:
    """The port the service bound (``--port 0``: the kernel picked it), from its "serving ... on port N"
    line; it holds the port, so nothing else can be scraped under this target."""
    if proc.poll() is not None:
        raise AssertionError(f"trainer-metrics exited ({proc.returncode}):\n{_tail(log_path)}")
    found = SERVING.search(log_path.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def _ready(proc: subprocess.Popen[bytes], port: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"trainer-metrics exited ({proc.returncode})")
    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2.0).status_code == 200


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-3000:]


SERVING = re.compile(r"serving https? on port (\d+)")


def start_cli(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    assert EXECUTABLE.exists(), f"{EXECUTABLE} missing: is the project installed in the virtualenv?"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_METRICS_")}
    # Born at zero for two scrape intervals of the test's Prometheus, as the chart sets it (the default,
    # 60 s, is for 30 s intervals); it also bounds the hand-over wait at SIGTERM.
    env["TRAINER_METRICS_ZERO_HOLD_SECONDS"] = str(2 * SCRAPE_INTERVAL_SECONDS)
    log_path = workdir / "trainer-metrics.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                str(EXECUTABLE),
                "--simulate",
                "--host",
                "127.0.0.1",
                "--port",
                "0",  # the kernel picks a free port, which the service then holds
                "--probe-port",
                "0",  # the same for the probe listener (its default, 8081, may be taken here)
                "--sim-seed",
                str(SEED),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        port = wait_for(
            functools.partial(_serving_port, proc, log_path), timeout=60, what="trainer-metrics serving"
        )
        wait_for(functools.partial(_ready, proc, port), timeout=60, what="trainer-metrics /readyz")
    except AssertionError as exc:
        stop(proc)
        raise AssertionError(f"trainer-metrics did not become ready: {exc}\n{_tail(log_path)}") from None
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: uvicorn shuts down gracefully (and releases the Lease)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CLI]:
    workdir = tmp_path_factory.mktemp("cli")
    proc, port = start_cli(workdir)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.get(f"{url}/debug/leadership", timeout=5.0).json()["is_leader"],
            timeout=30,
            what="the CLI service to lead",
        )
        targets = {JOB: (f"127.0.0.1:{port}", TARGET_LABELS)}
        with running_prometheus(workdir, targets) as prom:
            wait_for(
                lambda: prom.query(f'kubeflow_trainer_runtime_info{{job="{JOB}"}}'),
                timeout=30,
                what="Trainer metrics scraped from the CLI",
            )
            yield CLI(url, prom, f"127.0.0.1:{port}")
    finally:
        stop(proc)
    # uvicorn shuts down gracefully, then re-raises SIGTERM (exit status -15, as Kubernetes expects).
    assert proc.returncode in (0, -signal.SIGTERM), proc.returncode
    log = (workdir / "trainer-metrics.log").read_text(errors="replace")
    assert "Application shutdown complete" in log, log[-2000:]


def test_the_scrape_of_the_cli_is_healthy(cli: CLI) -> None:
    def healthy() -> dict[str, Any] | None:
        (target,) = cli.prom.active_targets()  # a timeout on a busy machine clears; a real error does not
        return target if target["health"] == "up" and target["lastError"] == "" else None

    target = wait_for(healthy, timeout=15, what="a healthy last scrape on /api/v1/targets")
    assert target["scrapeUrl"] == f"http://{cli.address}/metrics"
    assert cli.prom.values(f'up{{job="{JOB}"}}') == {(): 1.0}
    assert cli.prom.scalar(f'sum(trainer_metrics_leader{{job="{JOB}"}})') == 1.0
    assert cli.prom.scalar(f'scrape_samples_scraped{{job="{JOB}"}}') >= 300


def test_runtime_info_lists_the_runtimes_of_the_seeded_generator(cli: CLI) -> None:
    # The same seed against an empty store creates the same runtimes as the CLI's embedded cluster.
    expected_refs = sorted(WorkloadGenerator(trainer_store(), seed=SEED).load_runtimes())
    snapshot = httpx.get(f"{cli.url}/debug/snapshot", timeout=10.0).json()
    assert sorted(r["runtime_ref"] for r in snapshot["runtimes"]) == expected_refs
    got = cli.prom.values(
        f'kubeflow_trainer_runtime_info{{job="{JOB}"}}', "api_group", "kind", "namespace", "name"
    )
    assert sorted("/".join(key) for key in got) == expected_refs
    assert cli.prom.scalar(f'count(kubeflow_trainer_runtime_info{{job="{JOB}"}})') == len(expected_refs)


def test_counters_in_prometheus_are_bracketed_by_the_services_own_metrics(cli: CLI) -> None:
    """Each Trainer counter (and histogram count/sum/bucket) sample Prometheus stored from a scrape lies
    between the service's /metrics read just before that scrape and the one read just after."""

    def created_shown() -> float:
        text = httpx.get(f"{cli.url}/metrics", timeout=10.0).text
        return sum(
            v for (n, _), v in counters(text).items() if n == "kubeflow_trainer_trainjob_created_total"
        )

    # Series are born at zero for ZERO_HOLD_SECONDS after their first served render (docs/metrics.md,
    # "How counting works"): wait until a created count is past its hold, so the bracket below compares real
    # values.
    wait_for(created_shown, timeout=60, what="a created count past its born-at-zero hold")
    before = counters(httpx.get(f"{cli.url}/metrics", timeout=10.0).text)
    t_before = time.time()  # after the read: a scrape that starts later is served after it
    scraped_at = cli.prom.last_scrape_after(JOB, t_before)
    after = counters(httpx.get(f"{cli.url}/metrics", timeout=10.0).text)
    result = cli.prom.query(
        f'{{__name__=~"kubeflow_trainer_.+_(total|count|sum|bucket)", job="{JOB}"}}', scraped_at
    )
    stored: Samples = {}
    for series in result:
        metric = dict(series["metric"])
        stored[(metric.pop("__name__"), tuple(sorted(metric.items())))] = float(series["value"][1])
    before, after = as_stored(before, cli), as_stored(after, cli)
    assert len(stored) >= 50, len(stored)
    assert set(stored) <= set(after), sorted(set(stored) - set(after))[:5]
    assert sum(v for (n, _), v in after.items() if n == "kubeflow_trainer_trainjob_created_total") > 0
    problems = [
        (key, before.get(key, 0.0), value, after[key])
        for key, value in stored.items()
        if not before.get(key, 0.0) <= value <= after[key]
    ]
    assert not problems, problems[:5]


def test_promtool_check_metrics_on_the_cli_exposition(cli: CLI) -> None:
    resp = httpx.get(f"{cli.url}/metrics", timeout=10.0)
    resp.raise_for_status()
    out = promtool("check", "metrics", stdin=resp.content)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), (
        f"promtool check metrics (rc {out.returncode}):\n{out.stdout}{out.stderr}"
    )
