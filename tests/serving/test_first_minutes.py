"""A newcomer's first minutes with ``trainer-metrics --simulate``: counts that move within seconds, a Ctrl-C
that stops within seconds and says what it waits for, and a build_info that names the revision."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from prometheus_client import generate_latest

import kubesim.__main__ as kubesim_main
from app.api.views import SIMULATED_CLOCK_NOTE, terminal_page
from app.config import DEFAULT_ZERO_HOLD_SECONDS, SIMULATE_ZERO_HOLD_SECONDS, load_settings
from app.metrics.telemetry import SelfTelemetry
from app.serving.graceful import stop_plan
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.projection_types import MALFORMED
from app.version import revision
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from tests.support.replica_process import SIMULATED_ALONE, ReplicaProcess, running
from tests.support.waiting import wait_for

# --- the zero hold and the hand-over wait in simulate mode ---------------------------------------------


def test_simulate_mode_holds_new_series_at_zero_for_seconds_not_a_minute() -> None:
    assert load_settings().zero_hold_seconds == DEFAULT_ZERO_HOLD_SECONDS == 60
    simulated = load_settings(simulate=True)
    assert simulated.zero_hold_seconds == SIMULATE_ZERO_HOLD_SECONDS <= 5
    assert simulated.handover_wait_seconds == 0  # its cluster stops with it: nobody takes over
    # A value the user gives still wins.
    assert load_settings(simulate=True, zero_hold_seconds=30).zero_hold_seconds == 30
    assert load_settings(simulate=True, handover_wait_seconds=7).handover_wait_seconds == 7


def test_the_readme_states_the_simulate_mode_hold() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert f"{SIMULATE_ZERO_HOLD_SECONDS:g} s" in quick and "--simulate" in quick


# --- what a stop waits for, said at the signal ------------------------------------------------------------


def _service(*, leading: bool, elected: bool = True, wait: float = 185.0, hold: float = 60.0) -> object:
    return SimpleNamespace(
        journal=SimpleNamespace(leading=leading),
        elector=object() if elected else None,
        handover_wait_seconds=wait,
        ledger=SimpleNamespace(hold=hold),
    )


def test_the_stop_plan_of_a_leader_names_both_bounds() -> None:
    plan = stop_plan(_service(leading=True), 10)
    assert "up to 185 s" in plan and "61 s" in plan and "releasing the Lease" in plan
    assert "up to 10 s for requests in flight" in plan


def test_the_stop_plan_without_a_wait_or_a_lead() -> None:
    assert "without waiting for scrapes" in stop_plan(_service(leading=True, wait=0), 10)
    assert "nothing to hand over" in stop_plan(_service(leading=False), 10)
    assert "nothing to hand over" in stop_plan(_service(leading=True, elected=False), 10)
    assert "has not started" in stop_plan(None, None)


def _unseen(ex: ReplicaProcess) -> int:
    """Counts of the leader that no scraper has seen yet (what a graceful stop waits for)."""
    return int(httpx.get(ex.url + "/debug/snapshot", timeout=5).json()["remembered"]["unseen_counts"])


def test_a_lone_simulated_replica_stops_within_seconds_and_says_so_at_the_signal(tmp_path: Path) -> None:
    # The hold a production exporter has: before, a stop waited for the scrape of the last counts and, with
    # none coming, for hold + 1 s (61 s) before releasing.
    settings = {"leader_election": "true", "zero_hold_seconds": "60", "sim_rate": "20"}
    with running(tmp_path / "exporter.log", {**SIMULATED_ALONE, **settings}, timeout=60.0) as ex:
        wait_for(
            lambda: httpx.get(ex.url + "/debug/leadership", timeout=5).json()["is_leader"],
            timeout=60,
            what="leading",
        )
        assert httpx.get(ex.url + "/metrics", timeout=5).status_code == 200  # a scraper, as a curl is
        # Counts no scraper has seen yet: what the old stop waited for someone to scrape.
        wait_for(lambda: _unseen(ex) > 0, timeout=30, what="counts not yet seen by the scraper")
        started = time.monotonic()
        ex.proc.send_signal(signal.SIGINT)
        ex.proc.wait(timeout=30)
        took = time.monotonic() - started
        log = ex.log_path.read_text(errors="replace")
    assert re.search(r"stopping: .*(without waiting for scrapes|nothing to hand over)", log), log[-3000:]
    assert "WARNING" not in log.split("stopping:", 1)[1], log[-3000:]
    assert took < 10, f"stopped after {took:.1f} s"


# --- build_info -------------------------------------------------------------------------------------------


def test_build_info_names_the_revision_that_version_prints() -> None:
    body = generate_latest(SelfTelemetry().registry).decode()
    line = next(x for x in body.splitlines() if x.startswith("trainer_metrics_build_info{"))
    assert f'revision="{revision()}"' in line, line
    assert revision() != ""


def test_a_second_signal_stops_a_waiting_leader_at_once(tmp_path: Path) -> None:
    # A leader told to wait for scrapes that never come; the log says how long, and a second signal ends
    # the wait (before, the lifespan's stop started the same wait again: 61 s more).
    settings = {"leader_election": "true", "zero_hold_seconds": "60", "handover_wait_seconds": "185"}
    with running(tmp_path / "exporter.log", {**SIMULATED_ALONE, **settings}, timeout=60.0) as ex:
        wait_for(
            lambda: httpx.get(ex.url + "/debug/leadership", timeout=5).json()["is_leader"],
            timeout=60,
            what="leading",
        )
        wait_for(lambda: _unseen(ex) > 0, timeout=30, what="counts for the stop to wait for")
        ex.proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "stopping: waiting up to 185 s" in ex.log_path.read_text(errors="replace"),
            timeout=30,
            what="the stop's plan in the log",
        )
        assert ex.proc.poll() is None  # waiting, as it said
        started = time.monotonic()
        ex.proc.send_signal(signal.SIGINT)
        ex.proc.wait(timeout=45)
        took = time.monotonic() - started
    assert took < 10, f"stopped {took:.1f} s after the second signal"


# --- simulated times in /debug ----------------------------------------------------------------------------


def test_debug_terminal_says_that_simulated_times_run_ahead(served: ReplicaProcess) -> None:
    page = httpx.get(served.url + "/debug/terminal", params={"limit": 5}, timeout=10).json()
    assert page["note"] == SIMULATED_CLOCK_NOTE


def test_debug_terminal_has_no_note_against_a_real_cluster() -> None:
    class State:
        terminal_count = 0

        def terminal_entries(self, limit: int, token: str | None) -> tuple[list[object], None]:
            return [], None

    service = SimpleNamespace(state=State(), settings=load_settings())
    page = terminal_page(service, 5, None)  # type: ignore[arg-type]
    assert page.note is None
    assert "note" not in page.model_dump(by_alias=True, exclude_none=True)


# --- no odd jobs in the demo ------------------------------------------------------------------------------


def _malformed_jobs(**generator: Any) -> int:
    """TrainJobs the exporter would log as having unusable fields, over a few seeds of the generator."""
    found = 0
    for seed in range(20):
        store = SimulatedCluster(host="127.0.0.1", port=0).store
        workload = WorkloadGenerator(store, seed=seed, max_jobs=200, **generator)
        workload.load_runtimes()
        workload.populate(100)
        for _ in range(100):
            workload.step()
        objects, _ = store.list(TRAINJOBS, None)
        projections = (TRAINJOB_PROJECTOR.from_json(o) for o in objects)
        found += sum(1 for p in projections if p is not None and p.flags & MALFORMED)
    return found


def test_the_demo_writes_no_job_the_exporter_warns_about() -> None:
    # The generator's references to unregistered runtime kinds (a bypassed webhook's jobs) are what the
    # exporter logs as unusable: the tests keep them, the demo's clusters do not write them.
    assert _malformed_jobs() > 0
    assert _malformed_jobs(unregistered_ratio=0.0) == 0
    assert kubesim_main._parser().parse_args([]).unregistered_ratio == 0
