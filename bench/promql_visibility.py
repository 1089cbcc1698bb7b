"""What PromQL sees of the Trainer counters: Debian's Prometheus scraping the service every 2 s.

    .venv/bin/python -m bench.promql_visibility [--seconds 100] [--scrape-interval 2] [--json FILE]

The service runs as ``trainer-metrics --simulate`` builds it (``create_app`` with the embedded simulated
cluster: 200 TrainJobs, half of them in the initial list, the generator at 5 steps/s, the defaults), in this
process (tests/support/fleet.py, a fleet of one) so that the generator can be stopped: after ``--seconds``
of workload it stops, the service's ``/metrics`` is read once everything it counted is shown (``counted at
/metrics``), and Prometheus is queried at a scrape taken after that read:

* ``sum(increase(<counter>[10m]))`` over the run, for ``trainjob_created_total``, ``trainjob_finished_total``
  and ``trainjob_lifetime_seconds_count``;
* the raw samples (``<counter>[10m]``): how many series were born with a value above 0 (PromQL never
  counts a series' first sample, so such a first increment is invisible);
* for every ``trainjob_created_total`` series born during the run, the delay of its first increment: from
  the moment the generator created the series' first TrainJob to the timestamp of the first sample above 0.

The zero hold (``TRAINER_METRICS_ZERO_HOLD_SECONDS``) is set to twice the scrape interval, as the chart does
from the ServiceMonitor interval, unless ``--zero-hold`` says otherwise (a build without the setting ignores
it). Nothing here is asserted: it prints the table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from app.config import Settings
from bench.common import listening_ports

T = TypeVar("T")

COUNTERS = (
    "kubeflow_trainer_trainjob_created_total",
    "kubeflow_trainer_trainjob_finished_total",
    "kubeflow_trainer_trainjob_lifetime_seconds_count",
)
JOB = "trainer-metrics"


class Service:
    """The service alone with its simulated cluster, on an event loop in a background thread (a fleet of
    one, tests/support/fleet.py), recording when each created series' first TrainJob was made."""

    def __init__(self, *, seed: int, jobs: int, zero_hold: float | None) -> None:
        from tests.support.fleet import Fleet

        settings = {}
        if zero_hold is not None and "zero_hold_seconds" in Settings.model_fields:
            settings["zero_hold_seconds"] = zero_hold
        self.fleet = Fleet(
            seed=seed,
            slots=1,
            max_jobs=jobs,
            populate=jobs // 2,
            settings=settings,
            identity_prefix="promql-visibility-",
            simulate=True,
        )
        self.port = 0
        self.first_created: dict[tuple[str, str], float] = {}  # (namespace, runtime_ref) -> wall time
        self._gen_stop: asyncio.Event | None = None
        self._gen_task: asyncio.Task[int] | None = None

    def start(self) -> None:
        self.fleet.start()
        self.fleet.call(self._record_first_created)
        self.fleet.add()
        assert self.fleet.sockets is not None
        self.port = self.fleet.sockets.port(0)

    def _record_first_created(self) -> None:
        gen = self.fleet._gen()
        created = gen.truth.job_created

        def job_created(job: Any, *, malformed: bool = False) -> None:
            created(job, malformed=malformed)
            meta = job.get("metadata") or {}
            request = gen.truth.requests.get(str(meta.get("uid", "")))
            if request is not None:
                key = (request.namespace, request.runtime_ref)
                self.first_created.setdefault(key, time.time())

        gen.truth.job_created = job_created  # type: ignore[method-assign]

    def start_generator(self, rate: float) -> None:
        async def go() -> None:
            # From here on, the first creation in a label set is the first count of a new series (the
            # jobs made before are the service's initial list: never counted).
            self.first_created.clear()
            self._gen_stop = asyncio.Event()
            self._gen_task = asyncio.create_task(self.fleet._gen().run(rate, self._gen_stop))

        self.fleet.run(go, timeout=30)

    def stop_generator(self) -> None:
        gen_stop, gen_task = self._gen_stop, self._gen_task
        assert gen_stop is not None and gen_task is not None

        async def halt() -> None:
            gen_stop.set()
            await gen_task

        self.fleet.run(halt, timeout=30)

    def stop(self) -> None:
        self.fleet.stop()


class Prometheus:
    """Debian's prometheus, scraping one target every ``interval`` seconds."""

    def __init__(self, workdir: Path, target: str, interval: float) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("prometheus not on PATH (Debian package `prometheus`)")
        config = {
            "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s"},
            "scrape_configs": [
                {"job_name": JOB, "honor_labels": True, "static_configs": [{"targets": [target]}]}
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                "--web.listen-address=127.0.0.1:0",  # a port the kernel picks, found below
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc
        self.port = _until(lambda: (listening_ports(proc.pid) or [0])[0], 30, "Prometheus listening")
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10.0)
        _until(self._ready, 30, "Prometheus ready")

    def _ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self.http.get("/-/ready").status_code == 200
        return False

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        body = self.http.get("/api/v1/query", params=params).json()
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body}")
        return list(body["data"]["result"])

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        self.proc.wait(10)


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _counters(text: str) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def measure(seconds: float, interval: float, zero_hold: float | None, seed: int) -> dict[str, Any]:
    service = Service(seed=seed, jobs=200, zero_hold=zero_hold)
    service.start()
    url = f"http://127.0.0.1:{service.port}"
    try:
        _until(lambda: "kubeflow_trainer_runtime_info{" in httpx.get(f"{url}/metrics").text, 60, "leading")
        with tempfile.TemporaryDirectory(prefix="promql-visibility-prom-") as tmp:
            prom = Prometheus(Path(tmp), f"127.0.0.1:{service.port}", interval)
            try:
                _until(lambda: prom.query(f'kubeflow_trainer_runtime_info{{job="{JOB}"}}'), 60, "a scrape")
                service.start_generator(5.0)  # TRAINER_METRICS_SIM_RATE's default
                time.sleep(seconds)
                service.stop_generator()
                # Everything counted is shown once the newest series are out of their hold.
                time.sleep((zero_hold or 0.0) + 2 * interval)
                counted = _counters(httpx.get(f"{url}/metrics").text)
                read_at = time.time()
                expr = f'timestamp(up{{job="{JOB}"}}) and up{{job="{JOB}"}} == 1'
                at = _until(
                    lambda: next(
                        (float(r["value"][1]) for r in prom.query(expr) if float(r["value"][1]) > read_at),
                        None,
                    ),
                    30,
                    "a scrape after the read",
                )
                window = "10m"  # covers the whole run, as in the table
                rows = {}
                for name in COUNTERS:
                    increase = sum(
                        float(r["value"][1]) for r in prom.query(f"sum(increase({name}[{window}]))", at)
                    )
                    series = prom.query(f"{name}[{window}]", at)
                    born_above_zero = sum(1 for s in series if float(s["values"][0][1]) > 0)
                    rows[name] = {
                        "counted_at_metrics": counted[name],
                        "sum_increase": round(increase, 1),
                        "series": len(series),
                        "born_above_zero": born_above_zero,
                    }
                delays = []
                for s in prom.query(f"{COUNTERS[0]}[{window}]", at):
                    key = (s["metric"].get("namespace", ""), s["metric"].get("runtime_ref", ""))
                    born = service.first_created.get(key)
                    first = next((float(t) for t, v in s["values"] if float(v) > 0), None)
                    if born is not None and first is not None:
                        delays.append(first - born)
            finally:
                prom.stop()
    finally:
        service.stop()
    return {
        "seconds": seconds,
        "scrape_interval": interval,
        "zero_hold": zero_hold,
        "counters": rows,
        "first_increment_delay_s": {
            "series": len(delays),
            "p50": round(statistics.median(delays), 2) if delays else None,
            "min": round(min(delays), 2) if delays else None,
            "max": round(max(delays), 2) if delays else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.promql_visibility", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=100.0, help="workload duration (default 100)")
    parser.add_argument("--scrape-interval", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument(
        "--zero-hold", type=float, help="TRAINER_METRICS_ZERO_HOLD_SECONDS (default 2x interval)"
    )
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    hold = args.zero_hold if args.zero_hold is not None else 2 * args.scrape_interval
    result = measure(args.seconds, args.scrape_interval, hold, args.seed)
    print("| | counted at `/metrics` | `sum(increase(...))` | series born with a value above 0 |")
    print("|---|---:|---:|---:|")
    for name, row in result["counters"].items():
        short = name.removeprefix("kubeflow_trainer_")
        print(
            f"| `{short}` | {row['counted_at_metrics']:g} | {row['sum_increase']:g} | "
            f"{row['born_above_zero']} of {row['series']} |"
        )
    print(f"first increment of a new created_total series, delay (s): {result['first_increment_delay_s']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
