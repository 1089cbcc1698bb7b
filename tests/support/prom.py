"""A real Prometheus (Debian's `prometheus` package) started by a test: its own loopback port, config and
data directory, killed at the end. Plus a small client for its HTTP API and promtool."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.support.slots import check_distinct
from tests.support.waiting import wait_for as support_wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

# The only reason to skip: the binaries are not installed (.ci/run installs them on CI).
requires_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="prometheus/promtool not on PATH (Debian package `prometheus`; `bash .ci/run` installs it)",
)

SCRAPE_INTERVAL_SECONDS = 1
# Prometheus' default Accept header of a scrape (2.42, scrape/scrape.go): OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)

T = TypeVar("T")


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on: its socket descriptors' inodes, looked up among the
    listening sockets of ``/proc/<pid>/net/tcp`` and ``tcp6`` (Linux)."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    ports = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                # local_address (hex ip:port), st (0A = LISTEN), inode
                if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


def wait_for(check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy; fail with the last value after ``timeout``. HTTP and
    connection errors count as "not yet" (tests/support/waiting.py)."""
    return support_wait_for(
        check, timeout=timeout, what=what, interval=interval, ignoring=(httpx.HTTPError, OSError)
    )


def _ready_or_exited(proc: subprocess.Popen[bytes], http: httpx.Client) -> str | None:
    if proc.poll() is not None:
        return "exited"
    return "ready" if http.get("/-/ready").status_code == 200 else None


class PromQLError(AssertionError):
    """Prometheus answered a query with an error."""


class Prometheus:
    """One Prometheus process scraping ``targets`` ({job name: (host:port, target labels)})."""

    def __init__(
        self,
        workdir: Path,
        targets: Mapping[str, tuple[str, Mapping[str, str]]],
        features: Sequence[str] = (),
    ) -> None:
        """``features``: ``--enable-feature`` values (``exemplar-storage``, ``native-histograms``)."""
        self.workdir = workdir
        self.targets = targets
        self.features = tuple(features)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"
        self.http: httpx.Client | None = None

    # --- process -----------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL_SECONDS}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
            },
            "scrape_configs": [
                {
                    "job_name": job,
                    # As the chart's ServiceMonitor (honorLabels: true): the metrics' own labels win
                    # over the target's (namespace, pod, ...).
                    "honor_labels": True,
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": [address], "labels": dict(labels)}],
                }
                for job, (address, labels) in self.targets.items()
            ],
        }

    def start(self, timeout: float = 30.0) -> None:
        """Start Prometheus listening on a port the kernel picks (``127.0.0.1:0``), and find that port
        from the process's own listening socket (``listening_ports``). Nothing else can hold it, and
        Prometheus cannot take one of a harness's held scrape targets (tests/support/slots.py): the
        kernel never gives a port that has a bound socket to ``bind(0)``."""
        assert PROMETHEUS is not None
        check_distinct(self.addresses())
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config()))
        data = self.workdir / "data"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={data}",
                    "--web.listen-address=127.0.0.1:0",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                    *([f"--enable-feature={','.join(self.features)}"] if self.features else []),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = self.proc

        def listening() -> int | None:
            if proc.poll() is not None:
                raise AssertionError(f"Prometheus exited ({proc.returncode}):\n{self.log_tail()}")
            ports = listening_ports(proc.pid)
            return ports[0] if len(ports) == 1 else None

        try:
            self.port = wait_for(listening, timeout=timeout, what="Prometheus listening", interval=0.05)
            self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10.0)
            check = functools.partial(_ready_or_exited, proc, self.http)
            outcome = wait_for(check, timeout=timeout, what="Prometheus /-/ready", interval=0.1)
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"Prometheus did not start: {exc}\n{self.log_tail()}") from None
        if outcome != "ready":
            self.stop()
            raise AssertionError(f"Prometheus did not start:\n{self.log_tail()}")

    def addresses(self) -> list[str]:
        """Every scrape target's address (two equal ones would scrape one server under two labels)."""
        return [address for address, _labels in self.targets.values()]

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # --- HTTP API ------------------------------------------------------------------------------------------
    def _api(self, path: str, params: Mapping[str, Any]) -> Any:
        assert self.http is not None, "Prometheus is not running"
        resp = self.http.get(path, params=params)
        try:
            body = resp.json()
        except ValueError:
            raise PromQLError(f"{path} {dict(params)}: HTTP {resp.status_code}: {resp.text[:500]}") from None
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}  (query {dict(params)})")
        if body.get("warnings"):
            raise PromQLError(f"warnings {body['warnings']}  (query {dict(params)})")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the vector (or a scalar as a one-element vector without labels)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._api("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self._api(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        assert data["resultType"] == "matrix", data
        return list(data["result"])

    def values(self, expr: str, *by: str, at: float | None = None) -> dict[tuple[str, ...], float]:
        """Instant query as {label values: value}."""
        out: dict[tuple[str, ...], float] = {}
        for series in self.query(expr, at):
            key = tuple(series["metric"].get(label, "") for label in by)
            assert key not in out, f"{expr}: two series for {dict(zip(by, key, strict=True))}"
            out[key] = float(series["value"][1])
        return out

    def scalar(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, f"{expr}: expected one series, got {result}"
        return float(result[0]["value"][1])

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """``/api/v1/query_exemplars``: per series, its exemplars (labels, value, timestamp) in the range."""
        data = self._api(
            "/api/v1/query_exemplars", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        )
        return list(data)

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self._api(f"/api/v1/label/{label}/values", {"match[]": match}))

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self._api("/api/v1/targets", {"state": "active"})["activeTargets"])

    def last_scrape_after(self, job: str, after: float, timeout: float = 20.0) -> float:
        """Wait for a successful scrape of ``job`` that started at wall time > ``after``; its timestamp
        (an instant query at it reads exactly that scrape's samples)."""
        # One evaluation, so the timestamp and the `up` value belong to the same scrape.
        expr = f'timestamp(up{{job="{job}"}}) and up{{job="{job}"}} == 1'

        def newest() -> float | None:
            result = self.query(expr)
            stamp = float(result[0]["value"][1]) if result else 0.0
            return stamp if stamp > after else None

        return wait_for(newest, timeout=timeout, what=f"a successful scrape of {job} after {after:.3f}")


def finite(series_list: list[dict[str, Any]]) -> int:
    """How many values in an instant or range query result are finite numbers (not NaN or ±Inf)."""
    count = 0
    for series in series_list:
        points = series["values"] if "values" in series else [series["value"]]
        count += sum(1 for _, v in points if math.isfinite(float(v)))
    return count


def missing_grouping_labels(expr: str, series_list: list[dict[str, Any]]) -> set[str]:
    """Labels named in a ``by (...)`` clause of ``expr`` (other than ``le``, which histogram_quantile
    consumes) that no result series carries: a misspelt grouping label still "returns data" (one series
    without labels), this catches it."""
    named = {
        label.strip()
        for clause in re.findall(r"\bby\s*\(([^)]*)\)", expr)
        for label in clause.split(",")
        if label.strip()
    }
    present = {label for series in series_list for label in series["metric"]}
    return named - {"le"} - present


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.contextmanager
def running_prometheus(
    workdir: Path, targets: Mapping[str, tuple[str, Mapping[str, str]]], features: Sequence[str] = ()
) -> Iterator[Prometheus]:
    prom = Prometheus(workdir, targets, features)
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
