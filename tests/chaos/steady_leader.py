"""The steady-leader memory measurement: one service process leading without a break, for as long as a
Deployment's leader lives, and the slope of its RSS.

``python -m tests.chaos.steady_leader --minutes 30 [--warmup 40] [--json out.json]``

* a standalone simulated cluster in its own process (``python -m kubesim --jobs 500 --rate 20 --no-pods``:
  500 TrainJobs kept alive, the generator creating, running, finishing and deleting them at 20 steps a second;
  ``--pods`` lets it run their pods too, which the service then watches);
* one ``trainer-metrics`` process (tests/support/replica_process.py: the CLI itself, with the image's malloc
  settings and ``--memory``), leader election on; it takes the Lease and keeps it (the tool checks every
  minute that it still leads, with one leader term: the run fails otherwise);
* ``/metrics`` scraped every ``--scrape-interval`` seconds (15, Prometheus' usual) with Prometheus' Accept
  header; RSS from ``/proc`` every ``--sample-interval`` seconds; the bounded structures
  (``/debug/snapshot``) and the live memory (``/soak/memory``) every minute, printed as progress;
* at the end: the least-squares slope of RSS (MB/min) over the last ``--minutes`` (after ``--warmup``
  minutes, by when the structures that follow the cluster have filled), its start and end, and the same
  readings as the chaos soak's memory report (tests/chaos/memory.py), as JSON (``--json``, else stdout).

Exit status 0 when the measurement ran as described (the slope is reported, not judged: docs/reliability.md
states the target), 1 when the process lost the lead, died, or a scrape failed more than it succeeded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.memory import MB, TOMBSTONES_MAX, ProcessMemory, heap_trims, structures
from tests.support.replica_process import REPO, image_malloc_env, running
from tests.support.waiting import wait_for

# What Prometheus (2.x, 3.x) sends: it prefers OpenMetrics, the text format is the fallback.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
IDENTITY = "steady-leader"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.steady_leader", description=__doc__)
    p.add_argument("--minutes", type=float, default=30.0, help="the measured window, after the warm-up")
    p.add_argument(
        "--warmup",
        type=float,
        default=40.0,
        help="minutes before the window starts (the tombstones fill in ~36 at the default churn)",
    )
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--pods", action="store_true", help="the simulated cluster runs the TrainJobs' pods too")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--scrape-interval", type=float, default=15.0)
    p.add_argument("--sample-interval", type=float, default=5.0, help="seconds between RSS readings")
    p.add_argument(
        "--zero-hold", type=float, default=2.0, help="the service's zero_hold_seconds (the baseline's: 2)"
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another service setting (a Settings field), e.g. handover_journal_size=2000; repeatable",
    )
    p.add_argument("--json", type=Path, default=None, help="write the report here (else print it)")
    p.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    return p


def _wait_kubeconfig(path: Path, sim: subprocess.Popen[bytes], log: Path) -> None:
    def written() -> bool:
        assert sim.poll() is None, f"the simulated cluster exited {sim.returncode}: {log.read_text()[-2000:]}"
        return path.exists() and path.stat().st_size > 0

    wait_for(written, timeout=120, what="the simulated cluster's kubeconfig")


def measure(args: argparse.Namespace, log_dir: Path) -> tuple[dict[str, Any], bool]:
    kubeconfig = log_dir / "kubeconfig.yaml"
    sim_log = log_dir / "kubesim.log"
    sim_argv = [sys.executable, "-m", "kubesim", "--port", "0", "--kubeconfig", str(kubeconfig)]
    sim_argv += ["--jobs", str(args.jobs), "--rate", str(args.rate), "--seed", str(args.seed)]
    if not args.pods:
        sim_argv.append("--no-pods")
    sim_argv += ["--log-level", "WARNING"]
    settings: dict[str, Any] = {
        "kubeconfig": str(kubeconfig),
        "identity": IDENTITY,
        "lease_namespace": "default",
        "host": "127.0.0.1",
        "port": 0,
        "probe_port": 0,
        "log_level": "WARNING",
        "zero_hold_seconds": args.zero_hold,
    }
    for item in args.setting:
        name, _, value = item.partition("=")
        settings[name] = value
    window, warm_at = args.minutes * 60, args.warmup * 60
    total = warm_at + window
    with sim_log.open("wb") as out:
        sim = subprocess.Popen(sim_argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    ok = True
    problems: list[str] = []
    try:
        _wait_kubeconfig(kubeconfig, sim, sim_log)
        with running(
            log_dir / "service.log", settings, memory=True, extra=image_malloc_env(), timeout=120
        ) as rp:
            http = httpx.Client(base_url=rp.url, timeout=30)

            def leading() -> bool:
                return bool(http.get("/debug/leadership").json().get("is_leader"))

            wait_for(leading, timeout=120, what="the service leading", ignoring=(httpx.HTTPError,))
            t0 = time.monotonic()
            proc = ProcessMemory(IDENTITY, 0, rp.proc.pid, True, 0.0)
            scrapes = {"ok": 0, "failed": 0, "bytes_last": 0}
            next_sample = next_scrape = next_minute = 0.0
            tombstones_full_at: float | None = None
            transitions = None
            while (t := time.monotonic() - t0) < total:
                if rp.proc.poll() is not None:
                    problems.append(f"the service exited {rp.proc.returncode} at {t:.0f} s")
                    break
                if t >= next_sample:
                    proc.sample(t)
                    next_sample += args.sample_interval
                if t >= next_scrape:
                    try:
                        resp = http.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
                        scrapes["ok" if resp.status_code == 200 else "failed"] += 1
                        scrapes["bytes_last"] = len(resp.content)
                    except httpx.HTTPError:
                        scrapes["failed"] += 1
                    next_scrape += args.scrape_interval
                if t >= next_minute:
                    next_minute += 60.0
                    try:
                        lead = http.get("/debug/leadership").json()
                        sizes = structures(http.get("/debug/snapshot").json())
                        proc.structures_read(t, sizes)
                        proc.allocs.append((t, http.get("/soak/memory").json()))
                    except (httpx.HTTPError, ValueError) as exc:
                        problems.append(f"{t:.0f} s: reading the service failed: {exc}")
                        continue
                    if transitions is None:
                        transitions = lead.get("transitions_seen")
                    if not lead.get("is_leader") or lead.get("transitions_seen") != transitions:
                        problems.append(f"{t:.0f} s: the service lost the lead: {lead}")
                        break
                    if tombstones_full_at is None and sizes.get("tombstones", 0) >= TOMBSTONES_MAX:
                        tombstones_full_at = t
                    rss = proc.rss[-1][1] / MB if proc.rss else 0.0
                    print(
                        f"{t / 60:5.1f} min  RSS {rss:6.1f} MB  journal {sizes.get('journal_entries')}"
                        f"  series {sizes.get('metric_series')}  tombstones {sizes.get('tombstones')}"
                        f"  heap in use {proc.allocs[-1][1].get('heap_in_use', 0) / MB:.1f} MB"
                        f"  scrapes {scrapes['ok']}/{scrapes['ok'] + scrapes['failed']}",
                        flush=True,
                    )
                time.sleep(max(0.0, min(next_sample, next_scrape, next_minute) - (time.monotonic() - t0)))
            end = time.monotonic() - t0
            proc.stopped = end
            with_trim = False
            try:
                proc.readings["heap_trims"] = heap_trims(http.get("/metrics").text)
                proc.readings["end"] = http.get("/soak/memory", params={"trim": "1"}).json()
                with_trim = True
            except (httpx.HTTPError, ValueError):
                pass
            summary = proc.summary(warm_at, window)
    finally:
        sim.terminate()
        try:
            sim.wait(timeout=15)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()
    if scrapes["failed"] > scrapes["ok"]:
        problems.append(f"scrapes failed: {scrapes}")
    ok = not problems
    # The window as measured: the last ``minutes`` of the run (ProcessMemory.summary), RSS at its ends.
    start = end - window
    points = [(t, b) for t, b in proc.rss if t >= start]
    report: dict[str, Any] = {
        "command": " ".join(["python -m tests.chaos.steady_leader", *sys.argv[1:]]),
        "cluster": " ".join(["python -m kubesim", *sim_argv[7:]]),
        "settings": {k: v for k, v in settings.items() if k != "kubeconfig"},
        "minutes": args.minutes,
        "warmup_minutes": args.warmup,
        "ran_s": round(end, 1),
        "ok": ok,
        "problems": problems,
        "scrapes": scrapes,
        "tombstones_full_at_s": None if tombstones_full_at is None else round(tombstones_full_at, 1),
        "window_rss_start_mb": round(points[0][1] / MB, 1) if points else None,
        "window_rss_end_mb": round(points[-1][1] / MB, 1) if points else None,
        "rss_slope_mb_per_min": summary.get("rss_slope_mb_per_min"),
        "trimmed_at_end": with_trim,
        "process": summary,
    }
    return report, ok


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="steady-leader-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        report, ok = measure(args, log_dir)
    text = json.dumps(report, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text if args.json is None else {k: v for k, v in report.items() if k != "process"}, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
