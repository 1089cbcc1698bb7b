"""What PromQL can see of a counter, computed from the raw samples Prometheus stored.

``increase()`` and ``rate()`` count, per series, the positive differences between consecutive samples,
and a drop (a counter reset) as its new value; the first sample of a series counts nothing. This module
reads the raw samples (``/api/v1/query`` of ``metric[range]``: staleness markers are not samples) and adds
those increments up over every series of every replica, by the labels of the metric's own (the target's
``pod``/``instance`` differ per replica and term, and are summed over). The tests compare that with the
simulated cluster's ground truth (sim/kubesim/trainer/truth.py): it is what a user of PromQL can ever get out.

Used by tests/e2e/test_promql_exact.py and, over its whole run, by the chaos soak (tests/chaos/soak/).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.metrics.counted import FAMILIES, STARTUP, series_of
from app.trainer.events import CountableEvent
from kubesim.trainer.truth_records import TruthSnapshot

__all__ = [
    "COUNTED",
    "NOT_TRUTH",
    "Comparison",
    "Decrease",
    "Raw",
    "RawSeries",
    "allowance_of",
    "born_above_zero",
    "compare",
    "decreases",
    "event_increments",
    "increments_of",
    "raw_series",
    "select_range",
    "truth_increments",
    "visible_increase",
    "visible_increments",
]

Key = tuple[str, ...]
Table = dict[str, dict[Key, float]]

# Samples whose increments the simulated cluster's truth cannot know: the startup sum is this replica's
# clock (when it saw the job running), not the truth's.
NOT_TRUTH = frozenset({STARTUP.name + "_sum"})

# The Trainer counters a TrainJob event moves (sample name -> the metric's own labels that key it), with
# histogram _count and _sum samples (a counter each, as far as PromQL is concerned): every counted family
# of app/metrics/counted.py, in exposition order.
COUNTED: dict[str, tuple[str, ...]] = {
    name: family.labels for family in FAMILIES for name in family.sample_names if name not in NOT_TRUTH
}


class Raw(Protocol):
    """What is needed of a Prometheus client (tests/support/prom.py's ``Prometheus``): its HTTP API call."""

    def _api(self, path: str, params: Mapping[str, Any]) -> Any: ...


def select_range(prom: Raw, expr: str, at: float) -> list[dict[str, Any]]:
    """An instant query of a range selector (``metric[range]``): the raw samples of every series."""
    data = prom._api("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
    assert data["resultType"] == "matrix", data["resultType"]
    return list(data["result"])


def visible_increase(values: Iterable[float]) -> float:
    """One series' samples, in time order: what ``increase()`` over all of them counts (before its
    extrapolation to the edges of the range)."""
    total = 0.0
    previous: float | None = None
    for value in values:
        if previous is not None:
            total += value - previous if value >= previous else value
        previous = value
    return total


def raw_series(prom: Raw, name: str, at: float, seconds: int, selector: str = "") -> list[dict[str, Any]]:
    """Every series of ``name`` with its samples in ``(at - seconds, at]``."""
    return select_range(prom, f"{name}{{{selector}}}[{seconds}s]", at)


def visible_increments(
    prom: Raw, at: float, seconds: int, selector: str = "", names: Sequence[str] = tuple(COUNTED)
) -> Table:
    """Per sample name, per key of the metric's own labels: the increments PromQL can see, summed over
    every series (every replica, every leader term) with samples in the range."""
    return increments_of({name: raw_series(prom, name, at, seconds, selector) for name in names}, names)


RawSeries = Mapping[str, Sequence[Mapping[str, Any]]]  # sample name -> its series as the API returns them


def increments_of(
    raw: RawSeries, names: Sequence[str] | None = None, *, target: tuple[str, str] | None = None
) -> Table:
    """``visible_increments`` of series already read (``raw_series`` per name); with ``target`` (a target
    label and its value, e.g. ``("pod", "slot-3")``) only the series of that target."""
    out: Table = {}
    for name in names or tuple(raw):
        by_key: dict[Key, float] = defaultdict(float)
        for series in raw.get(name, ()):
            metric = series["metric"]
            if target is not None and metric.get(target[0]) != target[1]:
                continue
            key = tuple(metric.get(label, "") for label in COUNTED[name])
            by_key[key] += visible_increase(float(v) for _, v in series["values"])
        out[name] = {k: v for k, v in by_key.items() if v}
    return out


@dataclass(frozen=True)
class Decrease:
    """Two consecutive samples of one series, the second below the first."""

    name: str
    labels: tuple[tuple[str, str], ...]
    before: tuple[float, float]  # (timestamp, value)
    after: tuple[float, float]


def decreases(raw: RawSeries) -> list[Decrease]:
    """Every place a stored series went down: for a counter (or a histogram's count), a reset. A replica
    starts each leader term from zero, so that is where its series may go down; anywhere else it means
    the target's samples came from two servers (two targets on one address) or a count was taken back."""
    out = []
    for name, series_list in raw.items():
        for series in series_list:
            labels = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
            values = [(float(ts), float(v)) for ts, v in series["values"]]
            for before, after in itertools.pairwise(values):
                if after[1] < before[1]:
                    out.append(Decrease(name, labels, before, after))
    return out


def born_above_zero(prom: Raw, at: float, seconds: int, selector: str = "") -> list[dict[str, str]]:
    """The Trainer counter and histogram series (buckets included) whose first sample in the range is
    above 0: their first increment is invisible to PromQL. Only meaningful for a range that starts before
    the series were born."""
    out = []
    expr = f'{{__name__=~"kubeflow_trainer_trainjob_.+_(total|count|sum|bucket)",{selector}}}[{seconds}s]'
    for series in select_range(prom, expr, at):
        if float(series["values"][0][1]) > 0:
            out.append(dict(series["metric"]))
    return out


def truth_increments(before: TruthSnapshot, after: TruthSnapshot) -> Table:
    """What the same table must hold: the generator's truth over its run (before -> after)."""
    out: Table = {name: defaultdict(float) for name in COUNTED}
    for (ns, ref), n in after.created_since(before).items():
        out["kubeflow_trainer_trainjob_created_total"][(ns, ref)] += n
    for key, n in after.finished_since(before).items():
        out["kubeflow_trainer_trainjob_finished_total"][key] += n
    for fin in after.terminal_since(before):
        out["kubeflow_trainer_trainjob_lifetime_seconds_count"][(fin.result, fin.runtime_ref)] += 1
        out["kubeflow_trainer_trainjob_lifetime_seconds_sum"][(fin.result, fin.runtime_ref)] += max(
            fin.lifetime_seconds or 0.0, 0.0
        )
    for req in after.requests_since(before):
        out["kubeflow_trainer_trainjob_requested_training_nodes_per_job_count"][(req.runtime_ref,)] += 1
        out["kubeflow_trainer_trainjob_requested_training_nodes_per_job_sum"][(req.runtime_ref,)] += req.nodes
        for accelerator_class, count in req.accelerators:  # one observation per class requested
            accel: Key = (accelerator_class, req.runtime_ref)
            out["kubeflow_trainer_trainjob_requested_accelerators_count"][accel] += 1
            out["kubeflow_trainer_trainjob_requested_accelerators_sum"][accel] += count
    for started in after.started_since(before):
        out["kubeflow_trainer_trainjob_startup_seconds_count"][(started.runtime_ref,)] += 1
    for key, n in after.pod_failures_since(before).items():
        out["kubeflow_trainer_trainjob_pod_failures_total"][key] += n
    for admitted in after.admitted_since(before):
        out["kubeflow_trainer_trainjob_admission_wait_seconds_count"][(admitted.runtime_ref,)] += 1
        out["kubeflow_trainer_trainjob_admission_wait_seconds_sum"][(admitted.runtime_ref,)] += (
            admitted.wait_seconds
        )
    return {name: {k: v for k, v in table.items() if v} for name, table in out.items()}


@dataclass
class Comparison:
    """Visible increments against the truth, per sample name and key."""

    lost: dict[str, dict[Key, float]] = field(default_factory=dict)  # truth above what PromQL sees
    extra: dict[str, dict[Key, float]] = field(default_factory=dict)  # PromQL above the truth
    over_allowance: dict[str, dict[Key, float]] = field(default_factory=dict)
    totals: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (visible, truth)

    @property
    def exact(self) -> bool:
        return not self.lost and not self.extra

    def describe(self, limit: int = 8) -> str:
        parts = [f"totals (visible, truth): {self.totals}"]
        for what, table in (
            ("lost", self.lost),
            ("extra", self.extra),
            ("over allowance", self.over_allowance),
        ):
            for name, keys in table.items():
                parts.append(f"{what} {name}: {dict(list(keys.items())[:limit])} ({len(keys)} keys)")
        return "\n".join(parts)


def compare(
    visible: Table,
    truth: Table,
    allowance: Mapping[str, Mapping[Key, float]] | None = None,
    *,
    names: Sequence[str] | None = None,
) -> Comparison:
    """``allowance``: per name and key, how much PromQL may see above the truth (a documented double
    count, e.g. a killed leader's); never below it. Sums compare with a relative tolerance of 1e-9."""
    out = Comparison()
    for name in names or tuple(truth):
        got, want = visible.get(name, {}), truth.get(name, {})
        out.totals[name] = (round(sum(got.values()), 6), round(sum(want.values()), 6))
        for key in got.keys() | want.keys():
            g, w = got.get(key, 0.0), want.get(key, 0.0)
            if math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-6):
                continue
            if g < w:
                out.lost.setdefault(name, {})[key] = w - g
                continue
            out.extra.setdefault(name, {})[key] = g - w
            allowed = (allowance or {}).get(name, {}).get(key, 0.0)
            if g - w > allowed + 1e-6:
                out.over_allowance.setdefault(name, {})[key] = g - w - allowed
    return out


def event_increments(event: CountableEvent) -> list[tuple[str, Key, float]]:
    """What one counted event adds, per sample name and key, as the metric state counts it (the event's
    row in app/metrics/counted.py: a request above the ceilings is counted created and not observed, a
    duration that is not finite is not observed). For an allowance of events that may count twice (a
    killed leader's), and for the chaos soak's record of what each replica counted."""
    out: list[tuple[str, Key, float]] = []
    for family, labels, value in series_of(event):
        if family.kind == "counter":
            out.append((family.name + "_total", labels, 1.0))
            continue
        count, total = family.sample_names
        out.append((count, labels, 1.0))
        if total not in NOT_TRUTH:
            out.append((total, labels, value))
    return out


def allowance_of(events: Iterable[CountableEvent]) -> Table:
    """Per sample name and key, what ``events`` add up to."""
    out: dict[str, dict[Key, float]] = defaultdict(lambda: defaultdict(float))
    for event in events:
        for name, key, amount in event_increments(event):
            out[name][key] += amount
    return {name: dict(keys) for name, keys in out.items()}
