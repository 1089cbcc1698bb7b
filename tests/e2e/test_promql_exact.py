"""PromQL sees every TrainJob counted: a real Prometheus (Debian's 2.42) scrapes every replica each second,
and the increments PromQL can see, computed from the raw samples it stored (tests/support/promql_visible.py:
per series the positive differences between consecutive samples, a reset counting its new value, the first
sample counting nothing, summed over every series of every replica), equal the generator's truth.

(a) One replica, TrainJobs created and finished in dozens of label sets new to it: every new series is born
at zero, so even its first increment is visible. (b) Three replicas through a graceful hand-over, a leader
kill and a rolling restart of every replica: every leader term's series are new to Prometheus (pod label)
and born at zero; a leader hands over what a scrape showed, not what it counted. Graceful hand-overs are
exact; the kill may show what the killed leader counted above its last published watermark twice (the
documented allowance), never less than the truth. The chart's alert on the trainjobs gauge keeps its
``for:`` state (``ALERTS_FOR_STATE``) across all of it (docs/metrics.md, "How counting works")."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.fleet import JOB, REPLICA_SETTINGS, Fleet, FleetPrometheus, Killed
from tests.support.harness import trainjob_manifest
from tests.support.prom import SCRAPE_INTERVAL_SECONDS, requires_prometheus, wait_for
from tests.support.promql_visible import (
    COUNTED,
    Comparison,
    Table,
    allowance_of,
    born_above_zero,
    compare,
    select_range,
    truth_increments,
    visible_increments,
)

pytestmark = [requires_prometheus, pytest.mark.timeout(300)]

ALERTS_FILE = Path(__file__).resolve().parents[2] / "helm" / "trainer-metrics" / "files" / "alerts.yaml"
HOLD = REPLICA_SETTINGS["zero_hold_seconds"]
SELECTOR = f'job="{JOB}"'
PROBE_NAMESPACE = "alert-probe"  # one TrainJob that stays pending throughout: the gauge alert's subject
PENDING_ALERT = "KubeflowTrainJobsPendingTooLong"


# Compared exactly (within the kill's allowance) across replicas, time to running and admission wait included:
# a replica started while a job was preempted (the rolling restart makes such replicas leaders) knows from the
# Lease that the job ran and was admitted before (app/handover/history.py), so the job's next run is not
# counted again.
EXACT_ACROSS_REPLICAS = list(COUNTED)


@dataclass
class Run:
    fleet: Fleet
    prom: FleetPrometheus
    before: TruthSnapshot
    after: TruthSnapshot
    started: float  # wall time the generator started
    at: float  # wall time of a scrape of the final leader once everything settled
    killed: list[Killed] = field(default_factory=list)
    graceful: list[bool] = field(default_factory=list)  # hand_over() outcome of each graceful stop

    @property
    def seconds(self) -> int:
        """A range that covers the whole run (and the first scrapes before it)."""
        return math.ceil(self.at - self.started) + 10

    def visible(self) -> Table:
        return visible_increments(self.prom, self.at, self.seconds, SELECTOR)

    def truth(self) -> Table:
        return truth_increments(self.before, self.after)


def leader_slot_scraped_after(run_fleet: Fleet, prom: FleetPrometheus, after: float) -> float:
    """Wait for a successful scrape of the leader's slot that started after ``after``; its timestamp."""
    leader = wait_for(run_fleet.leader, timeout=30, what="one leader")
    slot = run_fleet.call(lambda: run_fleet.live[leader].slot)
    expr = f'timestamp(up{{{SELECTOR},pod="slot-{slot}"}}) and up{{{SELECTOR},pod="slot-{slot}"}} == 1'

    def newest() -> float | None:
        result = prom.query(expr)
        stamp = float(result[0]["value"][1]) if result else 0.0
        return stamp if stamp > after else None

    return wait_for(newest, timeout=20, what="a scrape of the leader after the run settled")


def settle(run_fleet: Fleet, prom: FleetPrometheus) -> float:
    """After the generator stopped: the leader has seen every write, its series are out of their hold and
    every scraper has seen its counts; then one more scrape of it. Returns that scrape's time."""
    rv = run_fleet.trainjob_rv()
    missing: list[str | None] = [None]

    def settled() -> bool:
        missing[0] = run_fleet.unsettled(rv)
        return missing[0] is None

    try:
        wait_for(settled, timeout=30, what=f"the leader settled at TrainJob rv {rv}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still missing: {missing[0]}") from None
    return leader_slot_scraped_after(run_fleet, prom, time.time())


def start_prometheus(
    run_fleet: Fleet, workdir: Path, rule_files: list[Path] | None = None
) -> FleetPrometheus:
    prom = FleetPrometheus(workdir, run_fleet.targets(), rule_files)
    prom.start()
    return prom


def wait_ready_leader(run_fleet: Fleet, identities: list[str]) -> str:
    wait_for(lambda: all(run_fleet.ready(i) for i in identities), timeout=30, what="replicas ready")
    return wait_for(run_fleet.leader, timeout=30, what="a leader")


# --- (a) one replica, dozens of new label sets ---------------------------------------------------------


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    # 30 namespaces with their own TrainingRuntimes: most TrainJobs land in a label set not seen before.
    fleet = Fleet(seed=20240612, slots=1, namespaces=30, max_jobs=150, populate=20)
    fleet.start()
    prom: FleetPrometheus | None = None
    try:
        identity = fleet.add()
        wait_ready_leader(fleet, [identity])
        prom = start_prometheus(fleet, tmp_path_factory.mktemp("prom-single"))
        wait_for(
            lambda: prom.query(f"kubeflow_trainer_runtime_info{{{SELECTOR}}}"),
            timeout=30,
            what="a first scrape",
        )
        started = time.time()
        before = fleet.start_generator(40.0, lifecycles=True)
        time.sleep(15.0)  # the workload's duration (scenario); settle() below waits for the outcome
        fleet.stop_generator()
        after = fleet.truth()
        at = settle(fleet, prom)
        yield Run(fleet, prom, before, after, started, at)
    finally:
        if prom is not None:
            prom.stop()
        fleet.stop()


def test_the_single_replica_workload_made_new_label_sets(single: Run) -> None:
    truth = single.truth()
    created = truth["kubeflow_trainer_trainjob_created_total"]
    finished = truth["kubeflow_trainer_trainjob_finished_total"]
    # Every TrainJob of the run is counted after the replica's initial list: each created label set is a
    # series new to it, first incremented by one TrainJob.
    assert len(created) >= 30, created
    assert len({(result, reason) for result, reason, _ in finished}) >= 3, finished
    assert sum(finished.values()) >= 20, finished


def test_promql_sees_every_count_of_a_single_replica(single: Run) -> None:
    result = compare(single.visible(), single.truth())
    assert result.exact, result.describe()


def test_every_series_is_born_at_zero(single: Run) -> None:
    assert born_above_zero(single.prom, single.at, single.seconds, SELECTOR) == []


def test_sum_increase_over_the_run_is_the_truth(single: Run) -> None:
    """What a user types: sum(increase(...)) over a range covering the run, at the last scrape. Series
    born at zero are not extrapolated back past their first sample, and none ends before the range does,
    so only float rounding separates it from the truth."""
    compared = sum_increase(single)
    for name, (got, want) in compared.items():
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6), (name, got, want)


def sum_increase(run: Run) -> dict[str, tuple[float, float]]:
    truth = run.truth()
    out = {}
    for name in COUNTED:
        result = run.prom.query(f"sum(increase({name}{{{SELECTOR}}}[{run.seconds}s]))", run.at)
        got = float(result[0]["value"][1]) if result else 0.0
        out[name] = (got, sum(truth.get(name, {}).values()))
    return out


# --- (b) three replicas: graceful hand-over, leader kill, rolling restart ------------------------------


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    fleet = Fleet(seed=20240613, slots=8, namespaces=8, max_jobs=200, populate=40)
    fleet.start()
    prom: FleetPrometheus | None = None
    graceful: list[bool] = []
    try:
        # A TrainJob nobody admits: pending from the first list on, in its own (namespace, runtime_ref).
        fleet.call(
            lambda: fleet._sim().store.create(TRAINJOBS, PROBE_NAMESPACE, trainjob_manifest("stays-pending"))
        )
        replicas = [fleet.add() for _ in range(3)]
        wait_ready_leader(fleet, replicas)
        wait_for(lambda: all(fleet.candidate(i) for i in replicas), timeout=30, what="three candidates")
        prom = start_prometheus(fleet, tmp_path_factory.mktemp("prom-fleet"), [ALERTS_FILE])
        wait_for(
            lambda: prom.query(
                f'ALERTS_FOR_STATE{{alertname="{PENDING_ALERT}",namespace="{PROBE_NAMESPACE}"}}'
            ),
            timeout=30,
            what="the pending alert on the probe TrainJob",
        )
        started = time.time()
        before = fleet.start_generator(25.0, lifecycles=True)
        time.sleep(4.0)  # a first term's workload (scenario pacing; the comparisons follow settle())

        # 1. Graceful hand-over (SIGTERM to the leader), its pod replaced.
        leader = wait_for(fleet.leader, timeout=10, what="a leader")
        graceful.append(fleet.graceful_stop(leader))
        replacement = fleet.add()
        wait_for(fleet.leader, timeout=10, what="a new leader after the graceful stop")
        wait_for(lambda: fleet.ready(replacement), timeout=30, what="the replacement ready")
        time.sleep(4.0)  # the next term's workload (scenario pacing)

        # 2. The leader crashes well into its term; a warm follower takes over once the Lease expires;
        # the pod is replaced.
        time.sleep(4.0)  # "well into its term" (scenario pacing)
        leader = wait_for(fleet.leader, timeout=10, what="a leader")
        fleet.kill(leader)
        wait_for(fleet.leader, timeout=20, what="a new leader after the kill")
        replacement = fleet.add()
        wait_for(lambda: fleet.ready(replacement), timeout=30, what="the replacement ready")
        time.sleep(3.0)  # the next term's workload (scenario pacing)

        # 3. Rolling restart of every replica (maxSurge 1): a new pod ready, then an old one stopped; the
        # leader last, once new pods are candidates.
        old = list(fleet.call(lambda: list(fleet.live)))
        leader = wait_for(fleet.leader, timeout=10, what="a leader")
        old.sort(key=lambda identity: identity == leader)
        for identity in old:
            new = fleet.add()
            wait_for(partial(fleet.ready, new), timeout=30, what=f"{new} ready")
            if identity == leader:
                wait_for(partial(fleet.candidate, new), timeout=30, what=f"{new} a candidate")
            graceful.append(fleet.graceful_stop(identity))
        wait_for(fleet.leader, timeout=20, what="a leader after the rolling restart")
        time.sleep(2.0)  # the last term's workload (scenario pacing)

        fleet.stop_generator()
        after = fleet.truth()
        at = settle(fleet, prom)
        yield Run(fleet, prom, before, after, started, at, list(fleet.killed), graceful)
    finally:
        if prom is not None:
            prom.stop()
        fleet.stop()


def test_the_fleet_run_had_every_kind_of_hand_over(fleet_run: Run) -> None:
    assert len(fleet_run.graceful) == 4  # one hand-over, three rolling restarts
    assert len(fleet_run.killed) == 1
    assert len(fleet_run.fleet.stopped) == 5
    truth = fleet_run.truth()
    assert sum(truth["kubeflow_trainer_trainjob_created_total"].values()) >= 60
    assert sum(truth["kubeflow_trainer_trainjob_finished_total"].values()) >= 30


def test_every_graceful_hand_over_waited_until_its_counts_were_scraped(fleet_run: Run) -> None:
    assert fleet_run.graceful == [True] * len(fleet_run.graceful)


def test_promql_sees_every_count_across_hand_overs_and_a_kill_doubles_only_its_allowance(
    fleet_run: Run,
) -> None:
    """Never below the truth; above it only by the documented crash bound (docs/leadership.md): what the
    killed leader counted above its last published (served) watermark and a scrape had already shown. The
    graceful hand-overs add nothing. The time form of the bound (the counts of the last 2 x hold + 2 scrape
    intervals + 1 renew period) is printed, not asserted: on this shared machine scrapes and renewals come
    late, and the bound is in actual scrape intervals."""
    above = [event for killed in fleet_run.killed for _, event in killed.above]
    visible, truth = fleet_run.visible(), fleet_run.truth()
    result: Comparison = compare(visible, truth, allowance_of(above), names=EXACT_ACROSS_REPLICAS)
    assert not result.lost, result.describe()
    assert not result.over_allowance, result.describe()
    window = 2 * HOLD + 2 * SCRAPE_INTERVAL_SECONDS + REPLICA_SETTINGS["retry_period_seconds"]
    recent = sum(len(killed.counted_within(window)) for killed in fleet_run.killed)
    doubled = sum(sum(keys.values()) for name, keys in result.extra.items() if not name.endswith("_sum"))
    print(
        f"\nkilled leader: {len(above)} counts above its published watermark, {recent} of them in the last "
        f"{window:g} s; extra increments PromQL saw (counters and _count): {doubled:g}\n{result.describe()}"
    )


def test_every_term_series_is_born_at_zero(fleet_run: Run) -> None:
    """Every series of every leader term (a new pod label each) starts with a 0 sample."""
    assert born_above_zero(fleet_run.prom, fleet_run.at, fleet_run.seconds, SELECTOR) == []


def test_sum_increase_over_the_run_is_never_below_the_truth(fleet_run: Run) -> None:
    """sum(increase(...)) over the run: at least the truth, and above it by at most the kill's allowance
    plus increase()'s extrapolation of the series that ended before the range (half a scrape interval
    per ended series: a few percent here)."""
    allowance = allowance_of(event for killed in fleet_run.killed for _, event in killed.above)
    for name, (got, want) in sum_increase(fleet_run).items():
        allowed = sum(allowance.get(name, {}).values())
        assert want - 1e-6 <= got <= (want + allowed) * 1.15 + 1e-6, (name, got, want, allowed)


def test_the_pending_alert_keeps_its_for_state_through_every_hand_over(fleet_run: Run) -> None:
    """The probe TrainJob stays pending throughout: the chart's alert on the trainjobs gauge was active
    before the first hand-over and is still active with the same activeAt (ALERTS_FOR_STATE's value) after
    the graceful hand-over, the kill and the rolling restart, although every leader change moved the gauge
    to a series with other pod/instance labels."""
    expr = (
        f'ALERTS_FOR_STATE{{alertname="{PENDING_ALERT}",namespace="{PROBE_NAMESPACE}"}}[{fleet_run.seconds}s]'
    )
    series: list[dict[str, Any]] = select_range(fleet_run.prom, expr, fleet_run.at)
    assert len(series) == 1, series  # one label set: no pod or instance label in the alert
    values = {float(v) for _, v in series[0]["values"]}
    assert len(values) == 1, f"the alert's for clock restarted: activeAt values {sorted(values)}"
    first, last = float(series[0]["values"][0][0]), float(series[0]["values"][-1][0])
    assert first <= fleet_run.started and last >= fleet_run.at - 5 * SCRAPE_INTERVAL_SECONDS, (first, last)
