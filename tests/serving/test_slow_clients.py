"""Hostile HTTP clients against the real exporter process, under a lowered file limit.

The exporter runs in a subprocess whose open-file limit is 256 (soft and hard: it cannot raise it), so the
connection cap comes from the file limit (256 - 128 reserved - 32 for the probe listener = 96). From other
loopback addresses (127.0.0.x: one per "host"), attackers hold 1,000 idle connections and 1,000 slow-header
ones (a request head trickled one header every 0.3 s, never finished), reconnecting as soon as the server
drops them. Meanwhile a scraper from 127.0.0.1 asks for /metrics on the main port and a kubelet for
/readyz on the probe port (and on the main port), each on a new connection every 0.2 s; every answer must
come within 1 s. Afterwards: the process never ran out of descriptors, the log grew by a few lines only,
and the self-telemetry counted what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.replica_process import SIMULATED_ALONE, running
from tests.support.waiting import wait_for

NOFILE = 512
EXPECTED_CAP = NOFILE - 224 - 32
HEADER_TIMEOUT = 2.0
ATTACK_SECONDS = 8.0
ANSWER_WITHIN = 1.0


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@contextlib.contextmanager
def attacker(port: int, seconds: float, groups: list[str]) -> Iterator[subprocess.Popen[str]]:
    """tests/serving/attacker.py in a process of its own; yields once its connections are launched."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = sum(int(g.split(":")[1]) for g in groups) + 256
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard open-file limit ({hard}) is below the {needed} the attacker needs")
    args = [sys.executable, "-m", "tests.serving.attacker", "--port", str(port), "--seconds", str(seconds)]
    for group in groups:
        args += ["--group", group]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "started" in proc.stdout.readline()
        yield proc
    finally:
        if proc.poll() is None:
            proc.wait(timeout=seconds + 30)


async def probe_loop(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, latencies: list[float], failures: list[str]
) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            resp = await client.get(url, timeout=ANSWER_WITHIN + 2)
            if resp.status_code != 200:
                failures.append(f"{url}: {resp.status_code}")
        except httpx.HTTPError as exc:
            failures.append(f"{url}: {type(exc).__name__} {exc} after {time.monotonic() - started:.3f}s")
        latencies.append(time.monotonic() - started)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


@pytest.mark.timeout(90)
async def test_slow_and_idle_clients_do_not_starve_probes_or_scrapes(tmp_path: Path) -> None:
    settings = {
        "max_connections": "1000",  # more than the file limit allows: the file limit decides (96)
        "max_connections_per_client": "64",
        "http_header_timeout_seconds": str(HEADER_TIMEOUT),
        "http_keep_alive_timeout_seconds": "1",
        "sim_rate": "0",  # no workload during the attack: every log line is the attack's
    }
    # 1,000 idle connections from 20 hosts (50 each: under the per-client cap, far over the global one);
    # 1,000 slow-header ones: 800 from 10 hosts, plus 200 from one host (over its per-client cap).
    groups = ["idle:1000:2:20", "slow:800:30:10", "slow:200:50:1"]
    with running(tmp_path / "exporter.log", {**SIMULATED_ALONE, **settings}, nofile=NOFILE) as ex:
        # Start-up is over (its last line written) before the log is measured.
        wait_for(lambda: "started leading" in ex.log_path.read_text(), timeout=10, what="start-up logged")
        log_before = ex.log_path.stat().st_size
        lines_before = len(ex.log_lines())
        stop = asyncio.Event()
        latencies: dict[str, list[float]] = {"metrics": [], "readyz-probe": [], "readyz-main": []}
        failures: list[str] = []
        max_fds = 0
        no_keepalive = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
        with attacker(ex.port, ATTACK_SECONDS, groups) as attack:
            async with httpx.AsyncClient(limits=no_keepalive) as http:
                checks = [
                    asyncio.create_task(probe_loop(http, url, stop, latencies[name], failures))
                    for name, url in (
                        ("metrics", f"{ex.url}/metrics"),
                        ("readyz-probe", f"{ex.probe_url}/readyz"),
                        ("readyz-main", f"{ex.url}/readyz"),
                    )
                ]
                while attack.poll() is None:
                    max_fds = max(max_fds, ex.open_fds())
                    await asyncio.sleep(0.25)  # the sampling period of the descriptor count
                stop.set()
                await asyncio.gather(*checks)
                metrics = samples((await http.get(f"{ex.url}/metrics")).text)
            assert attack.stdout is not None
            counts = json.loads(attack.stdout.read().strip().splitlines()[-1])
        log_lines = ex.log_lines()[lines_before:]  # before the exporter's shutdown lines
        log_growth = ex.log_path.stat().st_size - log_before

    report = (
        f"attack opened={counts['opened']} dropped={counts['dropped']} max_fds={max_fds} "
        f"log +{len(log_lines)} lines/{log_growth} B; ports {ex.port}/{ex.probe_port}; "
        + " ".join(f"{k}: n={len(v)} max={max(v):.3f}s" for k, v in latencies.items())
    )
    print(report)
    assert not failures, failures[:5]
    for name, values in latencies.items():
        assert len(values) >= ATTACK_SECONDS / 1.5, (name, report)  # answered all along
        assert max(values) < ANSWER_WITHIN, (name, report)
    # The caps held: never near the file limit, so accept() never failed.
    assert max_fds < NOFILE - 32, report

    def value(name: str, **labels: str) -> float:
        return metrics.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("trainer_metrics_http_connections_max", listener="main") == EXPECTED_CAP
    assert value("trainer_metrics_http_accept_errors_total", listener="main") == 0
    assert value("trainer_metrics_http_connections_closed_total", listener="main", reason="evicted") > 0
    assert value("trainer_metrics_http_connections", listener="main") <= EXPECTED_CAP + 64
    # The log: a handful of rate-limited lines, no tracebacks.
    assert len(log_lines) <= 12, log_lines
    assert log_growth < 8 * 1024, report
    assert not any("Traceback" in line for line in log_lines), log_lines
