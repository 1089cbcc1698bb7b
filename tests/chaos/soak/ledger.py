"""The counters the soak checks, their label keys, and tables of counts (``Values``) as they add up."""

from __future__ import annotations

from typing import Any

from app.handover.watermarks import Watermarks, parse_watermarks
from app.replica.service import Service
from kubesim.apiserver.core import LEASES
from kubesim.apiserver.status import StoreError
from kubesim.trainer.cluster import SimulatedCluster
from tests.support import promql_visible

CREATED = "kubeflow_trainer_trainjob_created_total"
FINISHED = "kubeflow_trainer_trainjob_finished_total"
LIFETIME_COUNT = "kubeflow_trainer_trainjob_lifetime_seconds_count"
NODES_COUNT = "kubeflow_trainer_trainjob_requested_training_nodes_per_job_count"
ACCEL_COUNT = "kubeflow_trainer_trainjob_requested_accelerators_count"
POD_FAILURES = "kubeflow_trainer_trainjob_pod_failures_total"
JOBS = "kubeflow_trainer_trainjobs"
LEASE_NAME = "trainer-metrics"
LEASE_NS = "default"

# Per counter: the label names that make a key, and which truth table the key is checked against.
COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    CREATED: (("namespace", "runtime_ref"), "created"),
    FINISHED: (("result", "reason", "runtime_ref"), "finished"),
    LIFETIME_COUNT: (("result", "runtime_ref"), "finished_by_result"),
    NODES_COUNT: (("runtime_ref",), "created_by_ref"),
    POD_FAILURES: (("namespace", "runtime_ref", "reason"), "pod_failures"),
}
# Summed over accelerator_class, keyed by runtime_ref (a created job is observed once per accelerator class
# it requests, or once as "none").
ACCEL_KEY = ("runtime_ref",)
# Every served counter and histogram count: never goes down within one term of one replica, and what
# PromQL sees of a target is never more than what that replica counted (``promql_invariants``).
MONOTONIC = tuple(name for name in promql_visible.COUNTED if not name.endswith("_sum"))

Values = dict[str, dict[tuple[str, ...], float]]
Series = list[tuple[str, tuple[str, ...]]]  # the counter series one event increments, once each


def counter_values(service: Service) -> Values:
    """The replica's Trainer counters now, straight from its metric state (leading or not): its numbers,
    not a served render (which would show new series at 0, and move their born-at-zero hold on)."""
    out: Values = {name: {} for name in (*COUNTERS, ACCEL_COUNT)}
    for family in service.metric_state.metrics():
        for sample in family.samples:
            name = sample.name
            if name in COUNTERS or name == ACCEL_COUNT:
                keys = COUNTERS[name][0] if name in COUNTERS else ACCEL_KEY
                key = tuple(sample.labels.get(k, "") for k in keys)
                out[name][key] = out[name].get(key, 0.0) + sample.value
    return out


_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {}


def _key(key: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """One tuple per series for the whole soak, not one per record."""
    k = tuple(key)
    return _KEYS.setdefault(k, k)


def counter_series(increments: list[list[Any]]) -> Series:
    """The counter series (``COUNTERS`` and the accelerator count summed over classes) a ``count`` record's
    increments move, each by one."""
    out: Series = []
    for name, key, _amount in increments:
        if name in COUNTERS:
            out.append((name, _key(key)))
        elif name == ACCEL_COUNT:
            out.append((name, _key(key[1:])))  # (accelerator_class, runtime_ref) -> (runtime_ref,)
    return out


def _sub(a: Values, b: Values) -> Values:
    out: Values = {}
    for name in a.keys() | b.keys():
        keys = a.get(name, {}).keys() | b.get(name, {}).keys()
        out[name] = {k: a.get(name, {}).get(k, 0.0) - b.get(name, {}).get(k, 0.0) for k in keys}
    return out


def _add_into(acc: Values, v: Values) -> None:
    for name, series in v.items():
        dst = acc.setdefault(name, {})
        for k, x in series.items():
            dst[k] = dst.get(k, 0.0) + x


def published_watermarks(sim: SimulatedCluster) -> Watermarks | None:
    """The watermarks in the Lease by stream ("" the TrainJobs', "pods/" the pods'), None when absent."""
    try:
        lease = sim.store.get(LEASES, LEASE_NS, LEASE_NAME)
    except StoreError:
        return None
    return parse_watermarks((lease.get("metadata") or {}).get("annotations") or {})
