"""Chaos soak: replicas against one simulated cluster under random faults, checked against the truth.

Run it long: ``.venv/bin/python -m tests.chaos.soak --minutes 10 [--json report.json] [--plot DIR]``
(prints a progress line a minute and a final table; exit status 1 on any failed check); the CI version is
``tests/chaos/test_soak.py`` (100 s of faults).

What happens:

* in this process: a ``SimulatedCluster`` and a ``WorkloadGenerator`` that keeps a bounded population
  (``max_jobs``) and runs TrainJob lifecycles (create, suspend/admit, run, finish, duplicate terminal
  writes, delete) at ``rate`` steps per second, with an independent ground truth of what the metrics should
  say; a real Prometheus scraping every replica slot each second; the fault injection and the checks;
* the replicas (leader election on), each served on its own slot, a socket bound before any replica starts
  and held for the whole run (tests/support/slots.py): by default (``processes``, the command line) four,
  each a process of its own running the service as the CLI does (tests/chaos/replica_proc.py), two of
  them *residents* that are never killed or restarted, whose memory is followed for the whole run
  (tests/chaos/memory.py); with ``--in-process`` three ``Service`` objects on this process's event loop;
* every few seconds one fault episode, in shuffled rounds so that every kind occurs: stalled watch streams
  (no bytes, no close; longer than the inactivity timeout), resets mid-chunk (open streams and the next
  ones), 410 Expired by compaction, 429 with Retry-After, 500/503/504, a full API-server restart that
  loses watch history, a leader killed without release (SIGKILL, or ``Service.kill()`` in this process; a
  fresh replica with a new identity replaces it once a survivor has taken over), a graceful leader restart
  (SIGTERM: hand over, release, exit; then start). A leader fault that finds a resident leading first
  demotes it: every Lease update fails until it has stepped down and the Lease has expired (the "leader
  cannot renew" hand-over), until another replica leads;
* at the end the generator stops, the faults are cleared and everything settles; then the report says
  what the leaders counted over all their terms against the truth, what PromQL saw against the truth and
  against what each replica counted, the final leader's gauge against the true current state, whether
  anything crashed or logged an error, readiness during stalls, and each service process's memory.

What each replica does is recorded by its tap (tests/chaos/tap.py), wherever it runs: its leader terms
(start with the floor, stop), every count it made, the relists of its TrainJob informer. A term's counts are
the sum of its ``count`` records. The documented bound (docs/leadership.md): a graceful hand-over is exact;
after a kill (or a lost Lease), the events the old leader counted above the watermark it had last published
may be counted again by the next leader, nothing is lost. For every term that ends, the events it counted
above the Lease's published watermark are kept; the next term's floor (the watermark it starts from) says
which of them may be counted again: that is the per-series allowance. The second documented bound: an edge
that the new leader's relist found on a newer state of the job, above its floor while the edge itself was at
or below it; ``DoubleCounts`` catches every edge counted twice as it happens, names its cause, and adds
these (verified against that replica's relists) to the allowance.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import itertools
import json
import logging
import os
import random
import resource as rlimit
import statistics
import sys
import tempfile
import time
import tracemalloc
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.handover.watermarks import WATERMARK_ANNOTATION
from app.kube.informer import InformerOptions
from app.replica.service import Service
from kubesim.apiserver.core import LEASES
from kubesim.apiserver.status import StoreError
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import TRAINJOBS
from tests.chaos.memory import ProcessMemory, heap_trims, plot, structures
from tests.chaos.replicas import InProcessReplica, ProcessReplica, ReplicaHandle, image_malloc_env
from tests.chaos.tap import Record
from tests.support import promql_visible
from tests.support.fleet import FleetPrometheus
from tests.support.harness import Samples, parse_samples
from tests.support.prom import PROMETHEUS, SCRAPE_INTERVAL_SECONDS
from tests.support.slots import SlotSockets
from tests.support.waiting import eventually

log = logging.getLogger("soak")

CREATED = "kubeflow_trainer_trainjob_created_total"
FINISHED = "kubeflow_trainer_trainjob_finished_total"
LIFETIME_COUNT = "kubeflow_trainer_trainjob_lifetime_seconds_count"
NODES_COUNT = "kubeflow_trainer_trainjob_requested_training_nodes_per_job_count"
ACCEL_COUNT = "kubeflow_trainer_trainjob_requested_accelerators_count"
JOBS = "kubeflow_trainer_trainjobs"
LEASE_NAME = "trainer-metrics"
LEASE_NS = "default"

# Per counter: the label names that make a key, and which truth table the key is checked against.
COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    CREATED: (("namespace", "runtime_ref"), "created"),
    FINISHED: (("result", "reason", "runtime_ref"), "finished"),
    LIFETIME_COUNT: (("result", "runtime_ref"), "finished_by_result"),
    NODES_COUNT: (("runtime_ref",), "created_by_ref"),
}
# Summed over accelerator_class, keyed by runtime_ref (a created job is observed once per accelerator class
# it requests, or once as "none").
ACCEL_KEY = ("runtime_ref",)
# Every served counter and histogram count: never goes down within one term of one replica, and what
# PromQL sees of a target is never more than what that replica counted (``promql_invariants``).
MONOTONIC = tuple(name for name in promql_visible.COUNTED if not name.endswith("_sum"))

FAULT_KINDS = (
    "stall_watches",
    "reset_watches",
    "reset_next_watches",
    "compact_410",
    "throttle_429",
    "error_500",
    "error_503",
    "error_504",
    "apiserver_restart",
    "leader_kill",
    "leader_graceful_restart",
)


@dataclass
class SoakConfig:
    fault_seconds: float = 90.0
    seed: int = 20240611
    rate: float = 120.0  # generator steps per second
    max_jobs: int = 500  # mostly finished jobs waiting out min_delete_age
    # A finished TrainJob is deleted no sooner than this (and an unfinished one cancelled no sooner after its
    # creation): real clusters keep finished jobs for minutes to days. With 0 (the generator's default) a
    # job could finish and be deleted within one informer relist gap (docs/reliability.md).
    min_delete_age: float = 15.0
    namespaces: int = 4
    replicas: int = 3
    fault_gap: tuple[float, float] = (1.0, 3.0)  # seconds between fault episodes
    inactivity_timeout: float = 2.0
    stall_extra: tuple[float, float] = (1.5, 3.0)  # a stall lasts inactivity_timeout + this
    warmup_seconds: float = 25.0
    settle_timeout: float = 60.0
    journal_size: int = 2000  # fills during warm-up, so it does not show up as RSS growth
    history_window: int = 4000
    sample_interval: float = 0.1  # /readyz sampling
    # Start a killed leader's replacement only once a survivor leads (False: at once, racing the takeover).
    replace_after_takeover: bool = True
    # tracemalloc (1 frame) from the start: the report splits the traced memory by part of the process
    # (``memory_part``) at the warm-up point and at the end. About 3x the CPU time; off in CI.
    trace_memory: bool = False
    # Every replica is served over HTTP and a real Prometheus (Debian's `prometheus`, when on PATH) scrapes
    # each one every second; at the end, the increments PromQL can see over the whole run are
    # checked against the truth (tests/support/promql_visible.py). Without the binary an in-process scraper
    # reads every /metrics as often (a hand-over needs scrapes) and the PromQL check is skipped.
    prometheus: bool = True
    # Each replica in a process of its own, as in production (tests/chaos/replica_proc.py), its memory
    # measured in that process (tests/chaos/memory.py); False: every replica on this process's event loop.
    processes: bool = False
    # Process mode: the first ``residents`` replicas are never killed or restarted, so that their memory
    # is followed for the whole run. A leader fault that finds one leading makes it lose the Lease first
    # (its Lease updates fail until it steps down, as a leader cut off from the API), at most
    # ``max_demotions`` times, until another replica leads.
    residents: int = 2
    max_demotions: int = 4
    # Process mode: set in each replica process's environment after the image's malloc settings ("" unsets).
    replica_env: dict[str, str] = field(default_factory=dict)
    memory_interval: float = 2.0  # seconds between RSS readings of each replica process
    structures_every: int = 5  # /debug/snapshot (sizes of the bounded structures) every this many readings
    slope_window: float = 1800.0  # RSS slope over at most the last 30 minutes (and the last half of the run)
    memory_growth_limit: float = 0.10  # a resident's RSS may grow at most this much after the warm-up
    slope_limit: float = 0.05  # MB per minute, checked once the window after the structures were full ...
    slope_min_window: float = 1200.0  # ... spans at least this many seconds
    progress_every: float = 0.0  # seconds between progress lines on stderr (0: none; the command line: 60)
    service_overrides: dict[str, Any] = field(
        default_factory=lambda: {
            "lease_duration_seconds": 3.0,
            "renew_deadline_seconds": 2.0,
            "retry_period_seconds": 0.4,
            "watch_timeout_min_seconds": 20,
            "watch_timeout_max_seconds": 40,
            # The chart's setting for a 1 s scrape interval: born at zero for 2 s (tolerates a failed scrape).
            "zero_hold_seconds": 2.0,
        }
    )


# --- recording -------------------------------------------------------------------------------------

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


def published_watermark(sim: SimulatedCluster) -> int | None:
    try:
        lease = sim.store.get(LEASES, LEASE_NS, LEASE_NAME)
    except StoreError:
        return None
    raw = (lease.get("metadata") or {}).get("annotations", {}).get(WATERMARK_ANNOTATION)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


@dataclass
class Term:
    identity: str
    slot: int
    started: float  # soak seconds
    started_wall: float  # time.time(), for Prometheus' sample timestamps
    floor: int | None
    stopped: float | None = None
    stopped_wall: float | None = None
    counted: Values = field(default_factory=dict)  # what this term counted, per series
    max_rv: int | None = None  # the highest rv it counted
    published_at_stop: int | None = None
    how: str = "open"  # open, stopped (lost or released), killed, graceful
    # (rv, series) of the events this term counted above the watermark published in the Lease: while the
    # term runs, those above the last watermark seen written (pruned as it moves); when it has ended, above
    # the one published when it ended. Those above the next term's floor may be counted twice.
    at_risk: list[tuple[int, Series]] = field(default_factory=list)
    # The same events, with what names them: (rv, kind, uid, since), for ``at_risk_not_recounted``.
    at_risk_edges: list[tuple[int, str, str, int]] = field(default_factory=list)

    @property
    def final_watermark(self) -> int | None:
        """What the journal's watermark was when the term ended: the floor, or the highest rv counted."""
        values = [v for v in (self.floor, self.max_rv) if v is not None]
        return max(values) if values else None

    def count(self, rv: int, series: Series, edge: tuple[str, str, int] | None = None) -> None:
        for name, key in series:
            by = self.counted.setdefault(name, {})
            by[key] = by.get(key, 0.0) + 1.0
        self.max_rv = rv if self.max_rv is None else max(self.max_rv, rv)
        self.at_risk.append((rv, series))
        if edge is not None:
            self.at_risk_edges.append((rv, *edge))

    def published(self, watermark: int) -> None:
        """The Lease carries ``watermark`` now: what this term counted at or below it is not at risk."""
        if self.at_risk and min(rv for rv, _ in self.at_risk) <= watermark:
            self.at_risk = [(rv, s) for rv, s in self.at_risk if rv > watermark]
            self.at_risk_edges = [e for e in self.at_risk_edges if e[0] > watermark]


class Recorder:
    """Leader terms, in order, from each replica's ``term_start`` / ``count`` / ``term_stop`` records
    (tests/chaos/tap.py). A term's counts are the sum of its ``count`` records: every count goes through
    the journal's ``_count`` (live, replayed at the take-over, or settled)."""

    def __init__(self, sim: SimulatedCluster, t0: float) -> None:
        self.sim = sim
        self.t0 = t0
        self.terms: list[Term] = []
        self.open: dict[str, Term] = {}
        self.pending_how: dict[str, str] = {}
        self.outside_terms = 0  # count records of a replica that was not leading: a harness problem
        self.times_counted: Counter[tuple[str, str]] = Counter()  # (kind, uid): by all terms together

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    def start(self, identity: str, slot: int, record: Record) -> None:
        term = Term(identity, slot, self.rel(record["t"]), record["wall"], record["floor"])
        self.open[identity] = term
        self.terms.append(term)

    def count(self, identity: str, record: Record, series: Series) -> None:
        term = self.open.get(identity)
        if term is None:
            self.outside_terms += 1
            return
        kind = record["kind"]
        edge = (kind, record["uid"], record.get("since", 0)) if kind in ("created", "finished") else None
        term.count(record["rv"], series, edge)
        if edge is not None:
            self.times_counted[(kind, record["uid"])] += 1

    def stop(self, identity: str, t: float, wall: float) -> None:
        """The term of ``identity`` ended at ``t`` (its ``term_stop``, or the kill of its process)."""
        term = self.open.pop(identity, None)
        if term is None:
            return
        term.stopped, term.stopped_wall = self.rel(t), wall
        term.published_at_stop = published_watermark(self.sim)
        term.how = self.pending_how.get(identity, "stopped")
        term.published(term.published_at_stop or 0)

    def lease_written(self, holder: str | None, watermark: int) -> None:
        term = self.open.get(holder or "")
        if term is not None:
            term.published(watermark)

    def close_open_terms(self) -> None:
        """The open term (the final leader) is taken as ending now."""
        for term in self.open.values():
            term.stopped = self.rel(time.monotonic())
            term.stopped_wall = time.time()


DOCUMENTED_DOUBLES = ("crash bound", "seen late with a newer rv")


class DoubleCounts:
    """Every countable edge that a leader counts when some leader has counted it already, caught as it
    happens (each replica's ``count`` records). The first count of the last ``window`` edges is remembered
    (hand-overs recount recent edges only), so memory stays flat after warm-up. ``classify`` names the
    cause of each from the leader terms and the replicas' relists. Two causes are documented bounds
    (docs/leadership.md): the crash bound, and an edge a follower's relist surfaced with a newer rv than
    the edge itself, above the floor it took over from."""

    def __init__(self, t0: float, window: int = 5000) -> None:
        self.t0 = t0
        self.window = window
        self.first: OrderedDict[tuple[str, Any], tuple[str, float, int]] = OrderedDict()
        # Edges a leader held as uncertain (a relist found them across its floor), by how they settled.
        self.settled: Counter[str] = Counter()
        # (kind, uid, first count, this count, the series this count incremented)
        self.found: list[tuple[str, Any, tuple[str, float, int], tuple[str, float, int], Series]] = []

    def count(self, identity: str, record: Record, series: Series) -> None:
        kind = record["kind"]
        if kind not in ("created", "finished"):
            return  # histograms only (time to running, admission wait): no counter to compare
        key = (kind, record["uid"])
        now = (identity, round(record["t"] - self.t0, 3), record["rv"])
        prior = self.first.get(key)
        if prior is not None:
            self.found.append((kind, key[1], prior, now, series))
            return
        self.first[key] = now
        if len(self.first) > self.window:
            self.first.popitem(last=False)

    def settle(self, counted: bool) -> None:
        self.settled["counted" if counted else "already counted"] += 1

    def classify(self, terms: list[Term], relisted: Callable[[str, int, int], bool]) -> list[dict[str, Any]]:
        """``relisted(identity, edge_rv, seen_rv)``: a relist of that replica covered the edge (its watch was
        down at ``edge_rv``) and listed the job at ``seen_rv``."""

        def term_of(who: str, t: float) -> Term | None:
            for term in terms:
                # Replays run inside the take-over, a moment after the term is recorded.
                if (
                    term.identity == who
                    and term.started - 0.05 <= t
                    and (term.stopped is None or t <= term.stopped + 0.05)
                ):
                    return term
            return None

        out = []
        for kind, uid, (who1, t1, rv1), (who2, t2, rv2), series in self.found:
            first, again = term_of(who1, t1), term_of(who2, t2)
            floor = again.floor if again is not None else None
            if who1 == who2 and first is again:
                cause = "same identity"
            elif floor is not None and rv1 <= floor < rv2 and relisted(who2, rv1, rv2):
                cause = "seen late with a newer rv"
            elif (
                first is not None
                and first.how != "graceful"
                and rv1 > (first.published_at_stop or 0)
                and (floor is None or rv2 > floor)
            ):
                cause = "crash bound"
            else:
                cause = "other"
            out.append(
                {
                    "kind": kind,
                    "uid": str(uid),
                    "cause": cause,
                    "first": {
                        "who": who1,
                        "t": t1,
                        "rv": rv1,
                        "term_how": first and first.how,
                        "published_at_stop": first and first.published_at_stop,
                    },
                    "again": {
                        "who": who2,
                        "t": t2,
                        "rv": rv2,
                        "floor": floor,
                        "term_start": again and again.started,
                    },
                    "series": series,
                }
            )
        return out


@dataclass
class Span:
    """What one replica (one instance) could observe of the TrainJob stream, in resourceVersions."""

    identity: str
    initial_rv: int | None = None  # its initial list: edges at or below it are never counted by it
    stop_rv: int | None = None  # the rv its informer had reached when it stopped
    relists: list[tuple[int, int]] = field(default_factory=list)  # (rv held before, list rv)
    rv_now: Callable[[], int] | None = None  # its informer's rv while it runs

    def hides(self, edge_rv: int, deleted_rv: int | None) -> bool:
        """True if this replica could not have seen the edge: before its initial list, after it stopped, or
        the edge and the job's deletion both inside one relist gap (the diff shows neither)."""
        if self.initial_rv is None or edge_rv <= self.initial_rv:
            return True
        if self.stop_rv is not None and edge_rv > self.stop_rv:
            return True
        return deleted_rv is not None and any(
            before < edge_rv and deleted_rv <= listed for before, listed in self.relists
        )

    def current_rv(self) -> int:
        if self.stop_rv is not None:
            return self.stop_rv
        return self.rv_now() if self.rv_now is not None else 0

    def record(self, record: Record) -> None:
        """An ``initial`` or ``relist`` record of its TrainJob informer."""
        if record["k"] == "initial":
            self.initial_rv = record["rv"]
        else:
            self.relists.append((record["before"], record["listed"]))


# uid -> [created rv, created series, terminal rv, finished series, deleted rv]
_Edges = list[Any]


class Visibility:
    """Which countable edges no replica could observe.

    A list+watch client sees a TrainJob's creation or terminal write unless the job is also deleted before
    the client's next successful list while its watch is down (a relist diff has nothing to show for it).
    An edge hidden from every replica that ran is not countable by any leader; the report excludes exactly
    those from the truth, and says how many. Everything is keyed by resourceVersion, not by time."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.edges: dict[str, _Edges] = {}
        self.dropped_visible = 0

    def attach_truth(self, truth: Any) -> None:
        created, written, deleted = truth.job_created, truth.job_written, truth.job_deleted

        def job_created(job: Any, *, malformed: bool = False) -> None:
            created(job, malformed=malformed)
            meta = job.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            req = truth.requests.get(uid)
            if req is not None:
                series = [
                    (CREATED, (req.namespace, req.runtime_ref)),
                    (NODES_COUNT, (req.runtime_ref,)),
                    *[(ACCEL_COUNT, (req.runtime_ref,)) for _ in req.accelerators],
                ]
                self.edges[uid] = [_int_rv(meta), series, None, None, None]

        def job_written(job: Any) -> None:
            meta = job.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            had = uid in truth.terminal
            written(job)
            edges = self.edges.get(uid)
            fin = truth.terminal.get(uid)
            if not had and fin is not None and edges is not None:
                edges[2] = _int_rv(meta)
                edges[3] = [
                    (FINISHED, (fin.result, fin.reason, fin.runtime_ref)),
                    (LIFETIME_COUNT, (fin.result, fin.runtime_ref)),
                ]

        def job_deleted(uid: str, resource_version: int = 0) -> None:
            deleted(uid, resource_version)
            edges = self.edges.get(uid)
            if edges is not None:
                edges[4] = resource_version

        truth.job_created, truth.job_written, truth.job_deleted = job_created, job_written, job_deleted

    def span(self, identity: str, rv_now: Callable[[], int]) -> Span:
        span = Span(identity, rv_now=rv_now)
        self.spans.append(span)
        return span

    def stopped(self, span: Span) -> None:
        span.stop_rv = span.current_rv()
        span.rv_now = None

    def hidden_from_all(self, edge_rv: int, deleted_rv: int | None) -> bool:
        return all(span.hides(edge_rv, deleted_rv) for span in self.spans)

    def prune(self) -> None:
        """Forget deleted jobs whose edges some replica has provably seen (bounded memory)."""
        for uid in [u for u, e in self.edges.items() if e[4] is not None]:
            e = self.edges[uid]
            deleted_rv = e[4]
            if all(
                rv is None
                or any(
                    not s.hides(rv, deleted_rv) and s.current_rv() >= deleted_rv and s.initial_rv is not None
                    for s in self.spans
                )
                for rv in (e[0], e[2])
            ):
                del self.edges[uid]
                self.dropped_visible += 1

    def unobservable(self, after_rv: int) -> tuple[Values, dict[str, int], list[str]]:
        """Edges above ``after_rv`` (the truth's start): (series -> count to take off the truth, counts per
        edge kind, some of the uids)."""
        out: Values = {}
        counts = {"created": 0, "finished": 0}
        uids: list[str] = []
        for uid, (created_rv, created_series, terminal_rv, finished_series, deleted_rv) in self.edges.items():
            if deleted_rv is None:
                continue  # still there at the end: every replica's cache has it
            for kind, rv, series in (
                ("created", created_rv, created_series),
                ("finished", terminal_rv, finished_series),
            ):
                if rv is None or series is None or rv <= after_rv or not self.hidden_from_all(rv, deleted_rv):
                    continue
                counts[kind] += 1
                if len(uids) < 50:
                    uids.append(f"{kind} {uid} rv {rv} deleted at rv {deleted_rv}")
                for name, key in series:
                    out.setdefault(name, {})[key] = out.get(name, {}).get(key, 0) + 1
        return out, counts, uids


def _raise_file_limit(wanted: int) -> None:
    """The soft limit on open files up to ``wanted`` (at most the hard limit): a long run holds hundreds."""
    soft, hard = rlimit.getrlimit(rlimit.RLIMIT_NOFILE)
    if soft != rlimit.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == rlimit.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            rlimit.setrlimit(rlimit.RLIMIT_NOFILE, (target, hard))


async def scrape(handle: ReplicaHandle) -> Samples:
    """One read of a replica's /metrics (a served render, as a scrape is)."""
    resp = await handle.http.get("/metrics")
    resp.raise_for_status()
    return parse_samples(resp.text)


def _int_rv(meta: dict[str, Any]) -> int:
    try:
        return int(meta.get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class ErrorLog(logging.Handler):
    """Captures ERROR records and tasks that ended unexpectedly (any logger)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        self.records.append(text[:500])


class RecordsAsText(logging.Handler):
    """Turns every record into text: the message formatted with its arguments, ``exc_info`` formatted
    into ``exc_text`` (which formatters print instead); no references to the objects logged remain.

    pytest's log capture keeps every record of a test (the soak runs in one module fixture). An exception
    logged as an argument (``informer %s: %s failed: %s``) or as exc_info holds its traceback, whose frames
    hold the replica that logged it (informer, Trainer state, journal, Service, client) until the test
    ends; in a service process the log handler formats the record and drops it. The soak checks that
    stopped replicas are freed and measures RSS, so records keep their text only. Added after ``ErrorLog``,
    which reads the exception first."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.args:
            record.msg = record.getMessage()
            record.args = None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self._formatter.formatException(record.exc_info)
            record.exc_info = None


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trimmed_rss_bytes(sim: SimulatedCluster) -> int:
    """RSS with the simulated server's watch history compacted, after a full collection and glibc's
    ``malloc_trim(0)``, which returns free heap pages to the kernel. This is what the growth check uses;
    the raw RSS is reported next to it.

    The simulated server shares this process. Its history (up to ``history_window`` serialized events,
    ~7 KB each) is full or nearly empty depending on when the last compaction fault came, which moved
    the raw figure by up to ~25 MB either way at the two points. Without the trim, RSS keeps the
    high-water mark of every transient peak (relist pages, watch buffers), so a longer run ratchets up
    without any object being kept. The compaction (a fault like the soak's own) happens synchronously,
    before any replica can react; at the warm-up point they relist afterwards. It is not counted among
    the injected faults."""
    sim.store.compact()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


_REPO = Path(__file__).resolve().parents[2]
_APP, _SIM, _SIM_TRAINER, _TESTS = (
    f"{_REPO / d}{os.sep}" for d in ("app", "sim/kubesim", "sim/kubesim/trainer", "tests")
)
MEMORY_PARTS = ("service", "simulator", "generator/truth", "test bookkeeping", "libraries/interpreter")


def memory_part(filename: str) -> str:
    """The part of this process an allocation belongs to, by the file of the frame that made it: the
    service (``app/``), the simulated API server (``kubesim.apiserver``), the workload generator, the
    controller model and the truth (``kubesim.trainer``), the test's own bookkeeping (``tests/``), or no
    project frame at all (libraries, imports, and the event loop's socket callbacks, which read for the
    service's client and the simulated server alike)."""
    if filename.startswith(_SIM_TRAINER):
        return "generator/truth"
    if filename.startswith(_SIM):
        return "simulator"
    if filename.startswith(_APP):
        return "service"
    if filename.startswith(_TESTS):
        return "test bookkeeping"
    return "libraries/interpreter"


def traced_by_part() -> dict[str, int]:
    """tracemalloc's traced bytes by ``memory_part`` of each allocation's innermost frame (empty when not
    tracing). Reads the raw traces: ``take_snapshot()`` builds an object per allocation, ~10x slower here."""
    if not tracemalloc.is_tracing():
        return {}
    out = dict.fromkeys(MEMORY_PARTS, 0)
    parts: dict[int, str] = {}  # traceback tuples are shared between traces: classify each once
    for _domain, size, frames, *_ in tracemalloc._get_traces():  # type: ignore[attr-defined]
        part = parts.get(id(frames))
        if part is None:
            part = parts[id(frames)] = memory_part(frames[0][0]) if frames else "libraries/interpreter"
        out[part] += size
    return out


def service_traced_bytes() -> int:
    """Bytes traced by tracemalloc that the service's code allocated and that are still held."""
    return traced_by_part().get("service", 0)


# --- the run ---------------------------------------------------------------------------------------


class Soak:
    def __init__(self, cfg: SoakConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.rng = random.Random(cfg.seed)
        self.live: dict[str, ReplicaHandle] = {}
        self.replica_seq = 0
        self.injected: Counter[str] = Counter()
        self.episodes: list[dict[str, Any]] = []
        self.stalls: list[tuple[float, float, str | None]] = []  # (start, end, resource) in soak time
        self.uncalm_stalls = 0  # stalls that began while some informer was not watching: not checked
        self.readiness: list[tuple[float, str, int]] = []  # (t, identity, status)
        self.liveness: dict[str, list[str]] = {}
        self.dead_tasks: list[str] = []
        self.loop_errors: list[str] = []
        self.error_records: list[str] = []
        self.process_errors: list[str] = []  # ERROR log lines of the replica processes
        self.rss: list[tuple[float, int]] = []  # this (the soak's) process
        self.t0 = time.monotonic()
        self.wall0 = time.time() - (time.monotonic() - self.t0)  # time.time() at t0
        self.problems: list[str] = []  # things that went wrong in the harness itself
        self.lease_watermark: int | None = None  # highest watermark written to the Lease so far
        self.lease_writes = 0
        self.watermark_decreases: list[str] = []
        self.visibility = Visibility()
        self.spans: dict[str, Span] = {}
        self.stopped_services: list[tuple[str, weakref.ref[Service]]] = []
        self.memory: dict[str, dict[str, Any]] = {}  # "warm" / "end": structure sizes, traced MB by part
        self.trimmed: dict[str, int] = {}  # "warm" / "end": trimmed_rss_bytes() of this process
        self.processes: list[ProcessMemory] = []  # process mode: every replica process's memory
        self.sampling_done = False  # the last raw readings were taken (before the trimmed ones at the end)
        # Per slot (one replica instance), what it counted: sample name -> key -> amount.
        self.slot_counted: dict[int, promql_visible.Table] = {}
        self.counted_created = 0.0  # created edges counted by all leader terms, for the ratio over time
        self.ratios: list[tuple[float, float, float]] = []  # (t, truth created, counted created)
        self.demotions = 0  # process mode: leaders made to lose the Lease (a resident is never killed)
        self.exits: list[tuple[str, str, int | None]] = []  # process mode: (identity, how, exit code)
        # Each replica instance is served over HTTP on its own slot (a Prometheus target with label
        # pod="slot-N"): a restarted replica is a new pod, as in a Deployment. Every slot's socket is bound
        # now and held until the end (tests/support/slots.py): no two targets can share a port.
        # A replica instance starts every ~16 s in process (kills and restarts), every ~21 s with processes.
        slots = cfg.replicas + int(cfg.fault_seconds / 8) + 16
        _raise_file_limit(slots + 1024)  # every slot's socket is held for the whole run
        self.slots = SlotSockets(slots)
        self.slot_of: dict[str, int] = {}  # identity -> the slot of its latest instance
        self.slot_seq = 0
        self.prom: FleetPrometheus | None = None
        self.promql: dict[str, Any] = {"checked": False}
        self.raw_series: dict[str, list[dict[str, Any]]] = {}  # PromQL: every counted series' samples

    def t(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    # -- replicas --

    async def start_replica(self, identity: str | None = None, *, resident: bool = False) -> str:
        if identity is None:
            self.replica_seq += 1
            identity = f"replica-{self.replica_seq}"
        slot = self.slot_seq
        self.slot_seq += 1
        if slot >= len(self.slots):
            raise RuntimeError(f"no slot left to serve {identity}")
        self.slot_of[identity] = slot
        overrides = {
            **self.cfg.service_overrides,
            "watch_inactivity_timeout_seconds": self.cfg.inactivity_timeout,
            "handover_journal_size": self.cfg.journal_size,
            "lease_name": LEASE_NAME,
        }
        span = self.visibility.span(identity, lambda: self._rv_of(identity))

        def on_record(record: Record) -> None:
            self.on_record(identity, slot, span, record)

        handle: ReplicaHandle
        if self.cfg.processes:
            handle = await ProcessReplica.start(
                self.kubeconfig,
                identity,
                slot,
                self.slots,
                on_record,
                log_dir=self.workdir,
                env=self.cfg.replica_env,
                **overrides,
            )
            assert handle.pid is not None
            self.processes.append(ProcessMemory(identity, slot, handle.pid, resident, self.t()))
        else:
            handle = await InProcessReplica.start(
                self.kubeconfig, identity, slot, self.slots, on_record, **overrides
            )
        handle.resident = resident
        self.spans[identity] = span
        self.live[identity] = handle
        return identity

    def _rv_of(self, identity: str) -> int:
        handle = self.live.get(identity)
        return min(handle.trainjob_rvs(), default=0) if handle is not None else 0

    def on_record(self, identity: str, slot: int, span: Span, record: Record) -> None:
        """A tap record of one replica instance (tests/chaos/tap.py)."""
        kind = record["k"]
        if kind == "count":
            series = counter_series(record["inc"])
            self.recorder.count(identity, record, series)
            self.doubles.count(identity, record, series)
            table = self.slot_counted.setdefault(slot, {})
            for name, key, amount in record["inc"]:
                by = table.setdefault(name, {})
                k = _key(key)
                by[k] = by.get(k, 0.0) + amount
            if record["kind"] == "created":
                self.counted_created += 1
        elif kind == "term_start":
            self.recorder.start(identity, slot, record)
        elif kind == "term_stop":
            self.recorder.stop(identity, record["t"], record["wall"])
        elif kind == "settle":
            self.doubles.settle(record["count"])
        elif kind in ("initial", "relist"):
            span.record(record)

    async def scrape_without_prometheus(self, stop: asyncio.Event) -> None:
        """Without a Prometheus binary: read every replica's /metrics each scrape interval, as one would
        (a leader hands over only what a scrape has shown)."""
        while not stop.is_set():
            for entry in list(self.live.values()):
                with contextlib.suppress(Exception):
                    await entry.http.get("/metrics")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SCRAPE_INTERVAL_SECONDS)

    def targets(self) -> list[tuple[str, dict[str, str]]]:
        return [
            (address, {"namespace": "trainer-metrics-soak", "pod": f"slot-{slot}"})
            for slot, address in enumerate(self.slots.addresses)
        ]

    async def visible_counts(self, leader: str | None, since_wall: float) -> None:
        """Once the leader's last counts are out of their hold and seen: a scrape after that, then the
        increments PromQL can see over the whole run (``self.promql``, compared in ``report``), and every
        counted series' samples (``self.raw_series``: the invariants per target)."""
        prom = self.prom
        if prom is None or leader is None:
            return
        handle = self.live[leader]
        if not await self.wait_for(handle.counts_seen, 30.0):
            self.problems.append("the final leader's counts were not all scraped within 30 s")
        slot = self.slot_of[leader]
        expr = f'timestamp(up{{pod="slot-{slot}"}}) and up{{pod="slot-{slot}"}} == 1'
        after = time.time()

        def scraped() -> float | None:
            result = prom.query(expr)
            stamp = float(result[0]["value"][1]) if result else 0.0
            return stamp if stamp > after else None

        try:
            at: float = await eventually(
                lambda: asyncio.to_thread(scraped), 20.0, interval=0.2, what="a scrape of the final leader"
            )
        except AssertionError:
            self.problems.append("no scrape of the final leader after the run settled")
            return
        seconds = int(at - since_wall) + 10

        def query() -> tuple[dict[str, list[dict[str, Any]]], int]:
            raw = {name: promql_visible.raw_series(prom, name, at, seconds) for name in MONOTONIC}
            return raw, len(promql_visible.born_above_zero(prom, at, seconds))

        if prom.http is not None:
            # Every sample of a long run (about 150,000 a name an hour): more than the client's 10 s.
            prom.http.timeout = httpx.Timeout(600.0)
        try:
            self.raw_series, born = await asyncio.to_thread(query)
        except Exception as exc:  # the report must come out of an unattended run
            self.problems.append(f"reading the stored series from Prometheus failed: {exc!r}"[:500])
            return
        table = promql_visible.increments_of(self.raw_series, names=tuple(COUNTERS))
        self.promql = {"checked": True, "visible": table, "born_above_zero": born, "range_s": seconds}

    def _check_replica(self, identity: str) -> None:
        problems, dead = self.live[identity].problems()
        if problems:
            self.liveness[identity] = problems
        self.dead_tasks.extend(f"{identity}: {name}" for name in dead)

    async def stop_replica(self, identity: str, *, kill: bool) -> None:
        self._check_replica(identity)
        handle = self.live.pop(identity)
        if isinstance(handle, InProcessReplica):
            self.stopped_services.append((identity, weakref.ref(handle.service)))
        span = self.spans.pop(identity)
        # The rv its informer reached, before it stops (a killed process answers nothing after).
        span.stop_rv = span.current_rv()
        self.recorder.pending_how[identity] = "killed" if kill else "graceful"
        try:
            await handle.stop(kill=kill)
        finally:
            # A killed process wrote no term_stop: its term ended when it died, just now (every record it
            # wrote has been handled by then). In this process, kill() wrote one.
            self.recorder.stop(identity, time.monotonic(), time.time())
            self.recorder.pending_how.pop(identity, None)
            self.visibility.stopped(span)
            await self.slots.retire(handle.slot)  # its port stays held; a scrape is reset from now on
            if isinstance(handle, ProcessReplica):
                self.process_errors.extend(f"{identity}: {text}" for text in handle.errors)
                self.exits.append((identity, "killed" if kill else "graceful", handle.exit_code))
                for proc in self.processes:
                    if proc.pid == handle.pid:
                        proc.stopped = self.t()

    def leader(self) -> str | None:
        leaders = [i for i, e in self.live.items() if e.leading()]
        return leaders[0] if len(leaders) == 1 else None

    async def wait_for(self, check: Callable[[], bool], timeout: float) -> bool:
        """``eventually``, but False instead of a failure: the soak records the problem and carries on."""
        try:
            await eventually(check, timeout)
        except AssertionError:
            return False
        return True

    def all_ready(self) -> bool:
        return all(e.ready() for e in self.live.values())

    def on_lease_write(self, event: Any) -> None:
        """Every committed Lease write: its watermark must never go below one published before it (each
        published watermark was counted up to; a lower one lets a takeover recount)."""
        if event.resource != LEASES or event.type == "DELETED":
            return
        raw = (event.entry.obj.get("metadata") or {}).get("annotations", {}).get(WATERMARK_ANNOTATION)
        if raw is None or not raw.isdigit():
            return
        value = int(raw)
        holder = (event.entry.obj.get("spec") or {}).get("holderIdentity")
        if self.lease_watermark is not None and value < self.lease_watermark:
            self.watermark_decreases.append(
                f"{self.t()}: {holder!r} wrote {value} after {self.lease_watermark}"
            )
        self.lease_watermark = max(value, self.lease_watermark or 0)
        self.lease_writes += 1
        self.recorder.lease_written(holder, value)

    def all_watching(self) -> bool:
        return all(e.watching() for e in self.live.values())

    # -- background samplers --

    async def sample_readiness(self, stop: asyncio.Event) -> None:
        """Every replica's readiness (what /readyz answers: ``Service.readiness_problems``) every 0.1 s."""
        while not stop.is_set():
            t = self.t()
            for identity, handle in list(self.live.items()):
                self.readiness.append((t, identity, 200 if handle.ready() else 503))
            await asyncio.sleep(self.cfg.sample_interval)  # the sampler's period (scenario pacing)

    def memory_point(self) -> dict[str, Any]:
        """Sizes of the bounded structures (summed over the live in-process replicas) and, when tracing,
        the traced memory by part of the process."""
        services = [e.service for e in self.live.values() if isinstance(e, InProcessReplica)]
        point: dict[str, Any] = {
            "t": self.t(),
            "rss_mb": round(rss_bytes() / 2**20, 1),
            "replicas": len(services),
            "journal_entries": sum(len(s.journal._journal) for s in services),
            "tombstones": sum(s.state.history.tombstones for s in services),
            "cached_objects": sum(len(i) for s in services for i in s.informers),
            "sim_history_events": len(self.sim.store._history),
        }
        if tracemalloc.is_tracing():
            point["traced_mb"] = {k: round(v / 2**20, 2) for k, v in traced_by_part().items()}
        return point

    async def sample_rss(self, stop: asyncio.Event) -> None:
        """This process's RSS every second (reported; in process mode it holds no replica), and the
        ratio of counted to true creations every five."""
        tick = 0
        while not stop.is_set():
            self.rss.append((self.t(), rss_bytes()))
            if "warm" not in self.memory and self.t() >= self.cfg.warmup_seconds:
                if not self.cfg.processes:  # compacts the simulated history: only where it shares the process
                    self.trimmed["warm"] = trimmed_rss_bytes(self.sim)
                self.memory["warm"] = self.memory_point()
            if tick % 5 == 0:
                truth = sum(self.gen.truth.created.values()) - self.created_before
                self.ratios.append((self.t(), float(truth), self.counted_created))
            tick += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def sample_processes(self, stop: asyncio.Event) -> None:
        """Process mode: each replica process's RSS from /proc every ``memory_interval`` seconds, the sizes
        of its bounded structures and its live memory every ``structures_every`` readings (memory.py)."""
        tick = 0
        while not stop.is_set():
            t = self.t()
            if self.sampling_done:
                return
            live = {h.pid: h for h in self.live.values() if h.pid is not None}
            for proc in self.processes:
                if proc.stopped is None and proc.pid in live:
                    proc.sample(t)
            if tick % self.cfg.structures_every == 0:
                await self.read_structures(live)
            tick += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.memory_interval)

    async def read_structures(self, live: dict[int, ReplicaHandle]) -> None:
        """Each live process's bounded structures (/debug/snapshot) and live memory (/soak/memory)."""
        for proc in self.processes:
            handle = live.get(proc.pid)
            if proc.stopped is not None or handle is None:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await handle.http.get("/debug/snapshot")
                if resp.status_code == 200:
                    proc.structures_read(self.t(), structures(resp.json()))
                resp = await handle.http.get("/soak/memory")
                if resp.status_code == 200:
                    proc.allocs.append((self.t(), resp.json()))

    async def read_trimmed(self, point: str) -> None:
        """Each live process's figures after a full collection and malloc_trim(0) (replica_proc.py)."""
        for proc in self.processes:
            handle = next((h for h in self.live.values() if h.pid == proc.pid), None)
            if proc.stopped is not None or handle is None:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await handle.http.get("/metrics")
                if resp.status_code == 200:
                    proc.readings["heap_trims"] = heap_trims(resp.text)
                resp = await handle.http.get("/soak/memory", params={"trim": "1"})
                if resp.status_code == 200:
                    proc.readings[point] = {"t": self.t(), **resp.json()}

    async def prune_truth(self, stop: asyncio.Event) -> None:
        """The truth keeps a record per TrainJob ever created (for tests that diff snapshots); drop those of
        deleted jobs so that this process's memory measures the run, not the test oracle."""
        truth = self.gen.truth
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)
            live = self.gen.jobs
            for table in (truth.requests, truth.terminal):
                for uid in [u for u in table if u not in live]:
                    del table[uid]
            self.visibility.prune()

    # -- faults --

    async def episode(self, kind: str) -> dict[str, Any]:
        f = self.sim.faults
        rng = self.rng
        info: dict[str, Any] = {"kind": kind, "t": self.t()}
        watched = ("trainjobs", "trainingruntimes", "clustertrainingruntimes", None)
        if kind == "stall_watches":
            # Start from a calm state, so the stall alone decides staleness. Fresh activity legitimately
            # restarts the inactivity clock: a list, or a new stream after a reset (not after a silent
            # one). So pending faults of earlier episodes are dropped (one could cut a stalled stream),
            # and every informer must be watching, not listing or backing off.
            f.clear()
            # An informer can sit in a backoff of up to 30 s after a run of errors.
            calm = await self.wait_for(lambda: self.all_ready() and self.all_watching(), 30.0)
            resource = rng.choice(("trainjobs", None))
            duration = self.cfg.inactivity_timeout + rng.uniform(*self.cfg.stall_extra)
            start = self.t()
            f.stall_watches(resource=resource)
            await asyncio.sleep(duration)  # the fault itself: a stall outlasting the inactivity timeout
            f.release_watches()
            if calm:
                self.stalls.append((start, self.t(), resource))
            else:
                self.uncalm_stalls += 1
            info.update(resource=resource, seconds=round(duration, 2))
        elif kind == "reset_watches":
            info["streams"] = f.reset_watches(resource=rng.choice(watched))
        elif kind == "reset_next_watches":
            n = rng.randint(1, 4)
            f.reset_next_watches(n, resource=rng.choice(watched), after_events=rng.randint(0, 20))
            info["n"] = n
        elif kind == "compact_410":
            f.compact()
        elif kind.startswith(("throttle_", "error_")):
            status = int(kind.rsplit("_", 1)[1])
            n = rng.randint(1, 4)
            resource = rng.choice(watched)
            watch = rng.choice((None, True, False))
            retry_after = rng.choice((1, 2)) if status in (429, 503, 504) else None
            f.fail_next(n, status=status, retry_after=retry_after, resource=resource, watch=watch)
            info.update(n=n, resource=resource, watch=watch, retry_after=retry_after)
        elif kind == "apiserver_restart":
            abrupt = rng.random() < 0.5
            info.update(abrupt=abrupt, dropped=f.restart(abrupt=abrupt))
        elif kind in ("leader_kill", "leader_graceful_restart"):
            info.update(await self.leader_episode(kill=kind == "leader_kill"))
        else:  # pragma: no cover
            raise ValueError(kind)
        self.injected[kind] += 1
        info["end"] = self.t()
        return info

    async def leader_episode(self, *, kill: bool) -> dict[str, Any]:
        info: dict[str, Any] = {}
        # A replica must have had time to observe the events the leader counted (see journal.py limits).
        await self.wait_for(lambda: self.leader() is not None and self.all_ready(), 15.0)
        leader = self.leader()
        if leader is None:
            self.problems.append(f"{self.t()}: no single leader before a leader fault")
            return {"skipped": "no leader"}
        demoted = 0
        while self.live[leader].resident and demoted < self.cfg.max_demotions:
            # A resident process is never stopped (its memory is followed for the whole run): it loses
            # the Lease instead, as a leader that cannot reach the API does, and stays as a follower.
            demoted += 1
            new = await self.demote(leader)
            if new is None:
                info["demoted"] = demoted
                return info
            leader = new
        info["demoted"] = demoted
        if self.live[leader].resident:
            return info
        info["leader"] = leader
        gone = self.t()
        await self.stop_replica(leader, kill=kill)
        # The replacement pod starts once a survivor leads: a fresh replica that wins the election could
        # not replay what happened before its initial list (journal.py, limits; see docs/reliability.md).
        if not self.cfg.replace_after_takeover:
            info["replacement"] = await self.start_replica(None if kill else leader)
        took_over = await self.wait_for(lambda: self.leader() is not None, 20.0)
        info["takeover_s"] = round(self.t() - gone, 2) if took_over else None
        info["new_leader"] = self.leader()
        if not took_over:
            self.problems.append(f"{self.t()}: no takeover within 20 s after {leader} went away")
        if self.cfg.replace_after_takeover:
            info["replacement"] = await self.start_replica(None if kill else leader)
        return info

    async def demote(self, leader: str) -> str | None:
        """The leader cannot renew: every Lease update fails (503) until it has stopped leading (its renew
        deadline) and the Lease has expired for every replica (its duration after the last renew, and a
        retry period), so that the replicas race for it on equal terms (the old holder would otherwise
        renew at once). Returns the new leader, which may be the same replica."""
        faults = self.sim.faults
        overrides = self.cfg.service_overrides
        faults.fail_next(1_000_000, status=503, retry_after=None, resource="leases", method="PUT")
        failure = faults._failures[-1]
        since = time.monotonic()
        expired = (
            since + float(overrides["lease_duration_seconds"]) + float(overrides["retry_period_seconds"])
        )
        try:
            stepped_down = await self.wait_for(lambda: not self.live[leader].leading(), 15.0)
            await self.wait_for(lambda: time.monotonic() >= expired, 15.0)
        finally:
            with contextlib.suppress(ValueError):
                faults._failures.remove(failure)
        self.demotions += 1
        if not stepped_down:
            self.problems.append(f"{self.t()}: {leader} still led 15 s after its Lease updates began to fail")
            return None
        if not await self.wait_for(lambda: self.leader() is not None, 20.0):
            self.problems.append(f"{self.t()}: no single leader 20 s after {leader} was demoted")
            return None
        # Every replica ready before the next fault. A replica whose relist failed in an earlier episode
        # retries after a draw of up to its backoff step, which the storm has grown to the cap (client-go's
        # shape: 30 s, reset only after 2 quiet minutes): not ready that long is correct, not a fault.
        ready_within = InformerOptions().backoff_cap + 15.0
        if not await self.wait_for(self.all_ready, ready_within):
            not_ready = sorted(identity for identity, e in self.live.items() if not e.ready())
            self.problems.append(
                f"{self.t()}: {ready_within:g} s after {leader} was demoted and {self.leader()} led: "
                f"not ready {not_ready}"
            )
            return None
        return self.leader()

    def progress(self) -> str:
        """One line for an unattended run's log: where the soak is."""
        truth = sum(self.gen.truth.created.values()) - self.created_before
        residents = [p for p in self.processes if p.resident and p.rss]
        memory = ", ".join(f"{p.identity} {p.rss[-1][1] / 2**20:.1f} MB" for p in residents)
        return (
            f"[soak {self.t():7.0f} s] episodes {len(self.episodes)}, leader {self.leader()}, "
            f"terms {len(self.recorder.terms)}, replicas started {self.replica_seq}, "
            f"created: truth {truth:g}, counted {self.counted_created:g}"
            + (f"; RSS {memory}" if memory else "")
        )

    async def faults_loop(self, stop_at: float) -> None:
        deck: list[str] = []
        next_progress = time.monotonic() + self.cfg.progress_every
        while time.monotonic() < stop_at:
            if self.cfg.progress_every and time.monotonic() >= next_progress:
                next_progress += self.cfg.progress_every
                print(self.progress(), file=sys.stderr, flush=True)
            await asyncio.sleep(self.rng.uniform(*self.cfg.fault_gap))  # the gap between faults (scenario)
            if time.monotonic() >= stop_at:
                break
            if not deck:
                deck = list(FAULT_KINDS)
                self.rng.shuffle(deck)
            kind = deck.pop()
            try:
                self.episodes.append(await self.episode(kind))
            except Exception as exc:
                self.problems.append(f"fault episode {kind} raised {exc!r}")
                log.exception("fault episode %s failed", kind)

    # -- main --

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        errors = ErrorLog()
        root = logging.getLogger()
        root.addHandler(errors)
        tracebacks = RecordsAsText()
        root.addHandler(tracebacks)
        loop = asyncio.get_running_loop()

        def loop_handler(_loop: Any, context: dict[str, Any]) -> None:
            self.loop_errors.append(str(context.get("message")) + " " + repr(context.get("exception")))

        loop.set_exception_handler(loop_handler)
        started_tracing = cfg.trace_memory and not tracemalloc.is_tracing()
        if started_tracing:
            tracemalloc.start(1)
        try:
            async with SimulatedCluster(
                bookmark_interval=0.5, history_window=cfg.history_window, watch_timeout=(20.0, 40.0)
            ) as sim:
                self.sim = sim
                self.kubeconfig = sim.write_kubeconfig(self.workdir / "kubeconfig")
                self.gen = WorkloadGenerator(
                    sim.store,
                    seed=cfg.seed,
                    namespaces=cfg.namespaces,
                    max_jobs=cfg.max_jobs,
                    min_delete_age=cfg.min_delete_age,
                )
                self.gen.load_runtimes()
                self.visibility.attach_truth(self.gen.truth)
                self.recorder = Recorder(sim, self.t0)
                self.doubles = DoubleCounts(self.t0)
                unsubscribe = sim.store.subscribe(self.on_lease_write)
                try:
                    return await self._run_inner()
                finally:
                    unsubscribe()
                    # Followers first: then only the leader hands over (to nobody), once.
                    for identity in sorted(self.live, key=lambda i: self.live[i].leading()):
                        with contextlib.suppress(Exception):
                            await self.stop_replica(identity, kill=False)
        finally:
            if self.prom is not None:
                await asyncio.to_thread(self.prom.stop)
            self.slots.close()
            if started_tracing:
                tracemalloc.stop()
            root.removeHandler(errors)
            root.removeHandler(tracebacks)
            self.error_records = errors.records
            loop.set_exception_handler(None)

    def prefill_history(self) -> int:
        """Run generator steps until the simulated API server's watch history is at its high-water mark
        (the window plus the 1/8 it trims in batches). The history (~10 KB per event: object, previous
        version, JSON) is the largest bounded structure in this process; refilled after a compaction it
        reuses the memory of the first fill, but a first fill after the warm-up point would show as
        ~40 MB of RSS growth that says nothing about the service. Returns the steps taken."""
        store = self.sim.store
        # The store trims in batches once the excess reaches window // 8: the longest it gets is one less.
        target = self.cfg.history_window + max(1, self.cfg.history_window // 8) - 1
        steps = 0
        while len(store._history) < target and steps < 20 * target:
            self.gen._safe_step()
            steps += 1
        # With no watcher yet, nothing serialized the events: an event's NDJSON line (and its object's JSON)
        # is made when the first watch stream sends it, and is most of its size. Without this the prefill
        # reached a third of the high-water mark, and the first refill to ~4500 serialized events after the
        # warm-up (35 s without a compaction or restart) showed as a ~25 MB RSS step (docs/reliability.md).
        for event in store._history:
            _ = event.line
        return steps

    async def _run_inner(self) -> dict[str, Any]:
        cfg = self.cfg
        self.prefill_steps = self.prefill_history()
        stop = asyncio.Event()
        scraper = None
        if cfg.prometheus and PROMETHEUS is not None:
            prom = FleetPrometheus(self.workdir, self.targets())
            await asyncio.to_thread(prom.start)
            self.prom = prom
        else:
            scraper = asyncio.create_task(self.scrape_without_prometheus(stop), name="scraper")
        for i in range(cfg.replicas):
            await self.start_replica(resident=cfg.processes and i < cfg.residents)
        if not await self.wait_for(lambda: self.leader() is not None and self.all_ready(), 30.0):
            raise RuntimeError("replicas did not become ready with one leader")
        if self.prom is not None:
            # The first leader's series are in Prometheus (at zero) before the first TrainJob is counted.
            prom_ = self.prom
            try:
                await eventually(
                    lambda: asyncio.to_thread(prom_.query, "kubeflow_trainer_runtime_info"),
                    20.0,
                    interval=0.2,
                    what="the first leader's series in Prometheus",
                )
            except AssertionError:
                self.problems.append("the first leader's series were not in Prometheus 20 s after it led")
        start_truth = self.gen.snapshot()
        self.created_before = sum(self.gen.truth.created.values())
        self.counted_created = 0.0
        start_wall = time.time()
        gen_stop = asyncio.Event()
        background = [
            asyncio.create_task(self.gen.run(cfg.rate, gen_stop), name="generator"),
            asyncio.create_task(self.sample_readiness(stop), name="readiness sampler"),
            asyncio.create_task(self.sample_rss(stop), name="rss sampler"),
            asyncio.create_task(self.prune_truth(stop), name="truth pruner"),
        ]
        if cfg.processes:
            background.append(asyncio.create_task(self.sample_processes(stop), name="process memory"))
        started = time.monotonic()
        await self.faults_loop(started + cfg.fault_seconds)
        fault_seconds = time.monotonic() - started
        # Settle: no more writes, no more faults, every replica caught up and ready, one leader.
        gen_stop.set()
        steps = int(await background[0] or 0)
        self.sim.faults.clear()
        end_rv = self.sim.store.resource_version
        settle_start = time.monotonic()

        def settled() -> bool:
            if self.leader() is None or not self.all_ready():
                return False
            return all(min(e.trainjob_rvs(), default=0) >= end_rv for e in self.live.values())

        ok = await self.wait_for(settled, cfg.settle_timeout)
        if not ok:
            self.problems.append(f"did not settle within {cfg.settle_timeout} s")
        # Housekeeping has flushed the creations still waiting for a runtime, then the leader has renewed
        # the Lease twice (the second renew was built after the last count).
        flushed = await self.wait_for(lambda: all(e.pending() == 0 for e in self.live.values()), 15.0)
        writes = self.lease_writes
        if not (flushed and await self.wait_for(lambda: self.lease_writes >= writes + 2, 15.0)):
            self.problems.append("pending creations not flushed, or no renew, within 15 s of settling")
        settle_seconds = time.monotonic() - settle_start
        if cfg.processes:
            # The last raw readings, then the trimmed ones: the trim lowers RSS, which must not enter the
            # growth or the slope, so the sampler reads /proc no more from here.
            self.sampling_done = True
            live = {h.pid: h for h in self.live.values() if h.pid is not None}
            for proc in self.processes:
                if proc.stopped is None and proc.pid in live:
                    proc.sample(self.t())
            await self.read_structures(live)
            await self.read_trimmed("end")
        gc.collect()
        rss_end = rss_bytes()
        if not cfg.processes:
            self.trimmed["end"] = trimmed_rss_bytes(self.sim)
        self.memory["end"] = self.memory_point()
        stopped_alive = [identity for identity, ref in self.stopped_services if ref() is not None]
        end_truth = self.gen.snapshot()
        leader = self.leader()
        for identity in list(self.live):
            self._check_replica(identity)
        self.recorder.close_open_terms()
        gauge: dict[tuple[str, ...], float] = {}
        scraped_leader_flags: dict[str, float] = {}
        if leader is not None:
            samples = await scrape(self.live[leader])
            for (name, labels), value in samples.items():
                if name == JOBS and value:
                    d = dict(labels)
                    gauge[(d["namespace"], d["runtime_ref"], d["state"])] = value
        for identity, e in self.live.items():
            s = await scrape(e)
            scraped_leader_flags[identity] = s.get(("trainer_metrics_leader", ()), -1.0)
        await self.visible_counts(leader, start_wall)
        stop.set()
        await asyncio.gather(*background[1:], *([scraper] if scraper is not None else []))
        return self.report(
            start_truth=start_truth,
            end_truth=end_truth,
            gauge=gauge,
            leader=leader,
            steps=steps,
            fault_seconds=fault_seconds,
            settle_seconds=settle_seconds,
            rss_end=rss_end,
            leader_flags=scraped_leader_flags,
            stopped_alive=stopped_alive,
        )

    # -- report --

    def promql_report(self, truth: Values, allowance: Values) -> dict[str, Any]:
        """The increments PromQL can see over the whole run against the same truth (edges no replica could
        see taken off) and the same allowance as the leaders' own counts: never below, above only by it."""
        if not self.promql.get("checked"):
            return {"checked": False, "born_above_zero": None}
        result = promql_visible.compare(self.promql["visible"], truth, allowance, names=tuple(COUNTERS))
        return {
            "checked": True,
            "range_s": self.promql["range_s"],
            "totals_visible_truth": result.totals,
            "lost": _keyed(result.lost),
            "over_allowance": _keyed(result.over_allowance),
            "extra_within_allowance": sum(sum(keys.values()) for keys in result.extra.values())
            - sum(sum(keys.values()) for keys in result.over_allowance.values()),
            "born_above_zero": self.promql["born_above_zero"],
        }

    def plot(self, directory: Path, title: str) -> list[Path]:
        """PNGs of each replica process's RSS and of counted (and PromQL-visible) vs truth over time."""
        increments: list[tuple[float, float]] = []  # (soak seconds, created increments PromQL sees there)
        for series in self.raw_series.get(CREATED, []):
            values = [(float(ts) - self.wall0, float(v)) for ts, v in series["values"]]
            for (_, before), (t, after) in itertools.pairwise(values):
                increments.append((t, after - before if after >= before else after))
        increments.sort()
        ratios: list[tuple[float, float | None, float | None]] = []
        seen, i = 0.0, 0
        for t, truth, counted in self.ratios:
            while i < len(increments) and increments[i][0] <= t:
                seen += increments[i][1]
                i += 1
            if truth <= 0:
                continue
            ratios.append((t, counted / truth, seen / truth if increments else None))
        return plot(self.processes, ratios, directory, title)

    def process_summaries(self) -> list[dict[str, Any]]:
        """Process mode: each replica process's memory (memory.py ``ProcessMemory.summary``), the slope over
        the last half of the run after the warm-up (at most the last 30 minutes)."""
        end = self.t()
        window = min(self.cfg.slope_window, max(0.0, (end - self.cfg.warmup_seconds) / 2))
        return [proc.summary(self.cfg.warmup_seconds, window) for proc in self.processes]

    def promql_invariants(self, terms: list[Term]) -> dict[str, Any]:
        """Per series and per target, from every sample Prometheus stored of the served counters and
        histogram counts (``MONOTONIC``): a series goes down only where its replica started a new leader
        term (each term counts from zero), and what PromQL sees of a target (one replica instance) is
        never more than what that instance counted. Both fail when two targets share an address: one
        replica's samples then interleave with another's under one ``pod`` label."""
        if not self.raw_series:
            return {"checked": False}
        starts: dict[str, list[float]] = {}  # pod label -> wall times its replica started a term
        for term in terms:
            starts.setdefault(f"slot-{term.slot}", []).append(term.started_wall)
        went_down: list[dict[str, Any]] = []
        at_term_starts = 0
        for d in promql_visible.decreases(self.raw_series):
            pod = dict(d.labels).get("pod", "")
            (t1, v1), (t2, v2) = d.before, d.after
            if any(t1 - 1.0 <= s <= t2 + 1.0 for s in starts.get(pod, [])):
                at_term_starts += 1
                continue
            went_down.append({"name": d.name, "labels": dict(d.labels), "from": [t1, v1], "to": [t2, v2]})
        by_pod: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for name, series_list in self.raw_series.items():
            for series in series_list:
                pod = str(series["metric"].get("pod"))
                by_pod.setdefault(pod, {}).setdefault(name, []).append(series)
        pods = sorted(by_pod, key=lambda pod: (len(pod), pod))
        over_counted: list[dict[str, Any]] = []
        for pod in pods:
            slot = int(pod.removeprefix("slot-")) if pod.removeprefix("slot-").isdigit() else -1
            counted = self.slot_counted.get(slot, {})
            visible = promql_visible.increments_of(by_pod[pod], MONOTONIC)
            for name, by_key in visible.items():
                for key, value in by_key.items():
                    mine = counted.get(name, {}).get(key, 0.0)
                    if value > mine + 1e-6:
                        over_counted.append(
                            {
                                "pod": pod,
                                "name": name,
                                "key": "|".join(key),
                                "visible": value,
                                "counted": mine,
                            }
                        )
        return {
            "checked": True,
            "series": sum(len(by) for by in self.raw_series.values()),
            "samples": sum(len(series["values"]) for by in self.raw_series.values() for series in by),
            "targets": len(pods),
            "resets_at_term_starts": at_term_starts,
            "went_down": len(went_down),
            "went_down_examples": went_down[:20],
            "over_counted": len(over_counted),
            "over_counted_examples": over_counted[:20],
        }

    def report(
        self,
        *,
        start_truth: Any,
        end_truth: Any,
        gauge: dict[tuple[str, ...], float],
        leader: str | None,
        steps: int,
        fault_seconds: float,
        settle_seconds: float,
        rss_end: int,
        leader_flags: dict[str, float],
        stopped_alive: list[str],
    ) -> dict[str, Any]:
        cfg = self.cfg
        terms = self.recorder.terms
        # Truth deltas over the soak (the replicas started before the first TrainJob was created).
        created = end_truth.created_since(start_truth)
        finished = end_truth.finished_since(start_truth)
        truth: Values = {name: {} for name in (*COUNTERS, ACCEL_COUNT)}
        for (ns, ref), n in created.items():
            truth[CREATED][(ns, ref)] = truth[CREATED].get((ns, ref), 0) + n
            truth[NODES_COUNT][(ref,)] = truth[NODES_COUNT].get((ref,), 0) + n
        # One observation per accelerator class a job requests: the truth's running total, not
        # requests_since (prune_truth drops the records of deleted jobs from truth.requests).
        for ref, n in end_truth.accelerator_observations_since(start_truth).items():
            truth[ACCEL_COUNT][(ref,)] = truth[ACCEL_COUNT].get((ref,), 0) + n
        for (result, reason, ref), n in finished.items():
            truth[FINISHED][(result, reason, ref)] = n
            truth[LIFETIME_COUNT][(result, ref)] = truth[LIFETIME_COUNT].get((result, ref), 0) + n
        # Edges no replica could observe (created/finished and deleted inside a relist gap of every replica
        # that ran) are not countable: take exactly those off, and report how many.
        unobservable, unobservable_counts, unobservable_uids = self.visibility.unobservable(
            start_truth.resource_version
        )
        for name, by_key in unobservable.items():
            for key, n in by_key.items():
                truth[name][key] = truth[name].get(key, 0) - n

        # Sum over terms, and the allowance for each non-graceful hand-over.
        summed: Values = {}
        allowance: Values = {}
        handovers: list[dict[str, Any]] = []
        overlaps: list[str] = []
        ordered = sorted(terms, key=lambda t: t.started)

        def relisted(identity: str, edge_rv: int, seen_rv: int) -> bool:
            return any(
                before < edge_rv and seen_rv <= listed
                for span in self.visibility.spans
                if span.identity == identity
                for before, listed in span.relists
            )

        doubles = self.doubles.classify(ordered, relisted)
        not_recounted: list[dict[str, Any]] = []
        for i, term in enumerate(ordered):
            if term.counted is not None:
                _add_into(summed, term.counted)
            if i == 0:
                continue
            prev = ordered[i - 1]
            if prev.stopped is None or prev.stopped > term.started:
                overlaps.append(
                    f"{prev.identity} [{prev.started}, {prev.stopped}] / {term.identity} @ {term.started}"
                )
            floor = term.floor if term.floor is not None else -1
            exact = prev.final_watermark is None or floor >= prev.final_watermark
            risky = [series for rv, series in prev.at_risk if rv > floor]
            for series in risky:
                for name, key in series:
                    allowance.setdefault(name, {})[key] = allowance.get(name, {}).get(key, 0) + 1
            handovers.append(
                {
                    "from": prev.identity,
                    "to": term.identity,
                    "how": prev.how,
                    "gap_s": round(term.started - (prev.stopped or term.started), 3),
                    "old_watermark": prev.final_watermark,
                    "new_floor": term.floor,
                    "exact": exact,
                    "may_double_count": len(risky),
                }
            )
            # Edges the old term counted above the watermark it published and above the next term's floor that
            # no leader counted again: the next leader should have replayed them (its journal had them at a
            # lower rv, or not at all). If no scrape had shown them before the old term ended, PromQL never
            # sees them: the suspects of an edge PromQL lost while the leaders' own counts lost none.
            for rv, kind, uid, since in prev.at_risk_edges if prev.how != "graceful" else ():
                if rv > floor and self.recorder.times_counted[(kind, uid)] == 1:
                    not_recounted.append(
                        {
                            "kind": kind,
                            "uid": uid,
                            "rv": rv,
                            "since": since,
                            "by": prev.identity,
                            "how": prev.how,
                            "stopped": prev.stopped,
                            "published_at_stop": prev.published_at_stop,
                            "next_floor": term.floor,
                        }
                    )
        # The second documented bound: an edge a follower's relist surfaced with a newer rv than the edge,
        # above the floor it took over from (verified per edge against that replica's relists).
        seen_late = [d for d in doubles if d["cause"] == "seen late with a newer rv"]
        for d in seen_late:
            for name, key in d["series"]:
                allowance.setdefault(name, {})[key] = allowance.get(name, {}).get(key, 0) + 1
        promql = self.promql_report(truth, allowance)
        differences: dict[str, dict[str, float]] = {}
        violations: list[str] = []
        per_counter: dict[str, dict[str, float]] = {}
        for name in (*COUNTERS, ACCEL_COUNT):
            keys = summed.get(name, {}).keys() | truth[name].keys()
            over = under = 0.0
            for key in sorted(keys):
                got = summed.get(name, {}).get(key, 0.0)
                want = truth[name].get(key, 0.0)
                diff = got - want
                if diff:
                    differences.setdefault(name, {})["|".join(key)] = diff
                allowed = allowance.get(name, {}).get(key, 0)
                if diff < 0:
                    under += -diff
                    violations.append(f"{name}{key}: lost {-diff:g} (counted {got:g}, truth {want:g})")
                elif diff > allowed:
                    over += diff - allowed
                    violations.append(
                        f"{name}{key}: {diff:g} over the truth, allowance {allowed} (got {got:g})"
                    )
            per_counter[name] = {
                "truth_total": sum(truth[name].values()),
                "counted_total": sum(summed.get(name, {}).values()),
                "allowance_total": sum(allowance.get(name, {}).values()),
                "lost": under,
                "over_allowance": over,
            }
        truth_jobs = {k: float(v) for k, v in end_truth.jobs.items() if v}
        gauge_diff = {
            "|".join(k): gauge.get(k, 0.0) - truth_jobs.get(k, 0.0)
            for k in gauge.keys() | truth_jobs.keys()
            if gauge.get(k, 0.0) != truth_jobs.get(k, 0.0)
        }

        # Readiness during stalls: in [stall start + timeout + 0.5 s, stall end], replicas alive throughout.
        stall_checks = []
        for start, end, resource in self.stalls:
            lo = start + cfg.inactivity_timeout + 0.5
            if end - lo < 0.3:
                continue
            per: dict[str, list[int]] = {}
            for t, identity, status in self.readiness:
                if lo <= t <= end:
                    per.setdefault(identity, []).append(status)
            recovered = {}
            for identity in per:
                # "True again after it recovered": recovery can wait for the informer's backoff (capped at
                # 30 s) when other faults overlap the stall, so any later 200 counts, not a fixed window.
                later = [s for t, i, s in self.readiness if i == identity and t > end]
                recovered[identity] = 200 in later
            stall_checks.append(
                {
                    "start": start,
                    "end": end,
                    "resource": resource,
                    "not_ready_fraction": {
                        i: round(sum(1 for s in v if s == 503) / len(v), 3) for i, v in per.items() if v
                    },
                    "ready_again_later": recovered,
                }
            )
        after_warmup = [b for t, b in self.rss if t >= cfg.warmup_seconds]
        warm_at = next((t for t, _ in self.rss if t >= cfg.warmup_seconds), 0.0)
        rss_warm = (
            statistics.median(after_warmup[:5]) if after_warmup else (self.rss[0][1] if self.rss else 0)
        )
        trimmed_warm, trimmed_end = self.trimmed.get("warm", 0), self.trimmed.get("end", 0)
        by_kind = Counter(e["kind"] for e in self.episodes)
        lifecycles = sum(finished.values())
        return {
            "config": {k: v for k, v in asdict(cfg).items()},
            "fault_seconds": round(fault_seconds, 1),
            "settle_seconds": round(settle_seconds, 1),
            "generator_steps": steps,
            "prefill_steps": getattr(self, "prefill_steps", 0),
            "lifecycles_finished": lifecycles,
            "unobservable_edges": unobservable_counts,
            "unobservable_examples": unobservable_uids,
            "relists_per_replica": {
                f"{sp.identity}#{i}": len(sp.relists) for i, sp in enumerate(self.visibility.spans)
            },
            "trainjobs_created": sum(created.values()),
            "trainjobs_deleted": sum(created.values())
            - sum(end_truth.jobs.values())
            + sum(start_truth.jobs.values()),
            "live_trainjobs_end": sum(end_truth.jobs.values()),
            "max_jobs": cfg.max_jobs,
            "episodes_by_kind": dict(sorted(by_kind.items())),
            "sim_fault_counters": dict(sorted(self.sim.faults.counters.items())),
            "leader_terms": len(terms),
            "handovers": handovers,
            "doubles_by_cause": dict(Counter(d["cause"] for d in doubles)),
            "uncertain_settled": dict(self.doubles.settled),
            "doubles_not_crash_bound": [d for d in doubles if d["cause"] != "crash bound"][:50],
            "doubles_unexplained": sum(1 for d in doubles if d["cause"] not in DOCUMENTED_DOUBLES),
            "non_exact_handovers": sum(1 for h in handovers if not h["exact"]),
            "kills": by_kind.get("leader_kill", 0),
            "overlapping_terms": overlaps,
            "counters": per_counter,
            "differences": differences,
            "allowance": {n: {"|".join(k): v for k, v in s.items()} for n, s in allowance.items()},
            "count_violations": violations,
            "final_leader": leader,
            "leader_flags_scraped": leader_flags,
            "gauge_series": len(truth_jobs),
            "gauge_differences": gauge_diff,
            "liveness_problems": self.liveness,
            "dead_tasks": self.dead_tasks,
            "error_log_records": self.error_records if hasattr(self, "error_records") else [],
            "loop_exceptions": self.loop_errors,
            "rss_warm_mb": round(rss_warm / 2**20, 1),
            "rss_end_mb": round(rss_end / 2**20, 1),
            "rss_growth": round((rss_end - rss_warm) / rss_warm, 4) if rss_warm else None,
            "rss_peak_mb": round(max((b for _, b in self.rss), default=0) / 2**20, 1),
            "rss_trimmed_warm_mb": round(trimmed_warm / 2**20, 1),
            "rss_trimmed_end_mb": round(trimmed_end / 2**20, 1),
            "rss_trimmed_growth": round((trimmed_end - trimmed_warm) / trimmed_warm, 4)
            if trimmed_warm
            else None,
            "rss_warm_at_s": round(warm_at, 1),
            "rss_mb_every_10s": [
                (round(t), round(b / 2**20, 1)) for i, (t, b) in enumerate(self.rss) if i % 10 == 0
            ],
            "mode": "processes" if cfg.processes else "in-process",
            "processes": self.process_summaries(),
            "demotions": self.demotions,
            "replica_malloc_env": (
                {
                    k: v
                    for k, v in {**image_malloc_env(), **cfg.replica_env}.items()
                    if k.startswith("MALLOC_") and v
                }
                if cfg.processes
                else {}
            ),
            "replica_exits": self.exits,
            "counted_vs_truth": [
                (round(t), round(c / truth, 4) if truth else None) for t, truth, c in self.ratios[::6]
            ],
            # Replicas stopped or killed during the soak; those of them still alive (not garbage) at the end.
            "replicas_stopped": len(self.stopped_services),
            "stopped_services_alive": stopped_alive,
            "memory": self.memory,
            "service_traced_growth": _traced_growth(self.memory, "service"),
            "stalls": stall_checks,
            "stalls_not_checked": self.uncalm_stalls,
            "readiness_samples": len(self.readiness),
            "harness_problems": self.problems,
            "promql": promql,
            "promql_invariants": self.promql_invariants(ordered),
            "at_risk_not_recounted": len(not_recounted),
            "at_risk_not_recounted_examples": not_recounted[:50],
            "counts_outside_terms": self.recorder.outside_terms,
            "lease_writes": self.lease_writes,
            "lease_watermark_decreases": self.watermark_decreases,
            "replicas_started": self.replica_seq,
            "store_trainjobs_end": len(self.sim.store.list(TRAINJOBS, None)[0]),
        }


def _keyed(table: dict[str, dict[tuple[str, ...], float]]) -> dict[str, dict[str, float]]:
    return {name: {"|".join(key): value for key, value in keys.items()} for name, keys in table.items()}


def _traced_growth(memory: dict[str, dict[str, Any]], part: str) -> float | None:
    warm = memory.get("warm", {}).get("traced_mb", {}).get(part)
    end = memory.get("end", {}).get("traced_mb", {}).get(part)
    return round((end - warm) / warm, 4) if warm and end is not None else None


async def run_soak(cfg: SoakConfig, workdir: Path | None = None) -> dict[str, Any]:
    """Run one soak; returns the report (see ``Soak.report``). Errors are reported, not raised."""
    report, _soak = await run_soak_keeping(cfg, workdir)
    return report


async def run_soak_keeping(cfg: SoakConfig, workdir: Path | None = None) -> tuple[dict[str, Any], Soak]:
    """``run_soak``, and the soak itself (its readings, for ``Soak.plot``)."""
    with tempfile.TemporaryDirectory() as tmp:
        if workdir is not None:
            os.makedirs(workdir, exist_ok=True)
        soak = Soak(cfg, workdir or Path(tmp))
        result = await soak.run()
        # The error logs are complete once every replica has stopped (run()'s finally): read them again.
        result["error_log_records"] = soak.error_records + soak.process_errors
        result["loop_exceptions"] = soak.loop_errors
        return result, soak


def render_table(report: dict[str, Any]) -> str:
    lines = []

    def row(name: str, value: Any) -> None:
        lines.append(f"{name:<40} {value}")

    row("mode", report["mode"])
    row("faults / settle (s)", f"{report['fault_seconds']} / {report['settle_seconds']}")
    row("generator steps", report["generator_steps"])
    row("TrainJobs created / finished", f"{report['trainjobs_created']} / {report['lifecycles_finished']}")
    u = report["unobservable_edges"]
    row("edges no replica could see (excluded)", f"created {u['created']}, finished {u['finished']}")
    row("live TrainJobs at end (max_jobs)", f"{report['live_trainjobs_end']} ({report['max_jobs']})")
    for kind in FAULT_KINDS:
        row(f"  episodes: {kind}", report["episodes_by_kind"].get(kind, 0))
    row("  leaders demoted (residents)", report["demotions"])
    row("sim fault counters", json.dumps(report["sim_fault_counters"]))
    row("leader terms / replicas started", f"{report['leader_terms']} / {report['replicas_started']}")
    row("hand-overs not exact (kills etc.)", f"{report['non_exact_handovers']} of {len(report['handovers'])}")
    for name, c in report["counters"].items():
        short = name.removeprefix("kubeflow_trainer_trainjob_")
        row(
            f"  {short}",
            f"truth {c['truth_total']:g}, counted {c['counted_total']:g}, lost {c['lost']:g}, "
            f"double-count allowance {c['allowance_total']:g}, over allowance {c['over_allowance']:g}",
        )
    row("edges counted again, by cause", json.dumps(report["doubles_by_cause"]))
    row("at-risk edges not replayed (suspects)", report["at_risk_not_recounted"])
    row("uncertain edges settled at the floor", json.dumps(report["uncertain_settled"]))
    p = report.get("promql") or {}
    if p.get("checked"):
        row(
            "PromQL-visible vs truth (whole run)",
            f"{json.dumps(p['totals_visible_truth'])}; lost {len(p['lost'])} series, over allowance "
            f"{len(p['over_allowance'])}, born above 0: {p['born_above_zero']}",
        )
    else:
        row("PromQL-visible vs truth (whole run)", "not checked (no prometheus binary)")
    inv = report.get("promql_invariants") or {}
    if inv.get("checked"):
        row(
            "PromQL series / samples / targets",
            f"{inv['series']} / {inv['samples']} / {inv['targets']}",
        )
        row(
            "  served counts that went down",
            f"{inv['went_down']} (resets where a term started: {inv['resets_at_term_starts']})",
        )
        row("  targets seen above what they counted", inv["over_counted"])
    row("gauge series / differences", f"{report['gauge_series']} / {len(report['gauge_differences'])}")
    row(
        "Lease writes / watermark decreases",
        f"{report['lease_writes']} / {len(report['lease_watermark_decreases'])}",
    )
    row("liveness problems / dead tasks", f"{report['liveness_problems']} / {report['dead_tasks']}")
    row("ERROR log records", len(report["error_log_records"]))
    fractions = [min(s["not_ready_fraction"].values(), default=1.0) for s in report["stalls"]]
    row(
        "stalls checked (not calm) / min not-ready share",
        f"{len(fractions)} ({report['stalls_not_checked']}) / {min(fractions, default=None)}",
    )
    if report["mode"] == "processes":
        malloc = " ".join(f"{k}={v}" for k, v in report["replica_malloc_env"].items()) or "glibc defaults"
        lines.append(f"memory of each trainer-metrics process ({malloc}):")
        lines.append(
            "  RSS in MB; slopes over the window (s) after its bounded structures were full, in MB/min (RSS, "
            "glibc heap in use)"
        )
        lines.append("  and blocks/min (Python); trim: RSS at the end after malloc_trim(0); R: resident")
        lines.append(
            f"  {'process':<18} {'life (s)':<13} {'first':>6} {'warm':>6} {'end':>6} {'peak':>6} "
            f"{'growth':>7} {'full at':>7} {'window':>6} {'RSS':>7} {'heap':>7} {'blocks':>7} {'trim':>6}  "
            "structures at end"
        )
        churned = [p for p in report["processes"] if not p["resident"]]
        for proc in [p for p in report["processes"] if p["resident"]]:
            name = f"{proc['identity']}{' (R)' if proc['resident'] else ''}"
            life = f"{proc['started_s']:g}-{proc['stopped_s'] if proc['stopped_s'] is not None else 'end'}"
            growth = "" if proc["rss_growth"] is None else f"{100 * proc['rss_growth']:+.1f}%"
            end = proc.get("structures_end", {})
            sizes = (
                f"journal {end.get('journal_entries')}, tombstones {end.get('tombstones')}, terminal "
                f"{end.get('terminal_entries')}, cached {end.get('cached_objects')}, series "
                f"{end.get('metric_series')}"
                if end
                else ""
            )
            lines.append(
                f"  {name:<18} {life:<13} {_mb(proc['rss_first_mb'])} {_mb(proc['rss_warm_mb'])} "
                f"{_mb(proc['rss_end_mb'])} {_mb(proc['rss_peak_mb'])} {growth:>7} "
                f"{_mb(proc['full_at_s'], 7)} {proc['slope_window_s']:>6g} "
                f"{_signed(proc['rss_slope_mb_per_min'])} "
                f"{_signed(proc.get('heap_in_use_slope_mb_per_min'))} "
                f"{_signed(proc.get('python_blocks_per_min'), 0)} {_mb(proc.get('trimmed_end_mb'))}  {sizes}"
            )
        for proc in [p for p in report["processes"] if p["resident"] and "heap_trims" in p]:
            lines.append(
                f"  {proc['identity']}: {proc['heap_trims']} periodic heap trims (app/replica/heap_trim.py), "
                f"mean {proc['heap_trim_mean_ms']} ms, the longest under {proc['heap_trim_max_le_ms']} ms"
            )
        if churned:
            lives = [p["life_s"] for p in churned]
            ends = [p["rss_end_mb"] for p in churned if p["rss_end_mb"] is not None]
            growths = [p["rss_growth"] for p in churned if p["rss_growth"] is not None]
            lines.append(
                f"  {len(churned)} other processes (killed or restarted), lived "
                f"{min(lives):.0f}-{max(lives):.0f} s (median {statistics.median(lives):.0f}): "
                f"RSS at the end median {statistics.median(ends) if ends else '-'}, "
                f"max {max(ends, default='-')} MB, growth after "
                f"the warm-up at most {100 * max(growths, default=0):+.1f} %"
            )
        row(
            "this (the soak's) process RSS warm / end", f"{report['rss_warm_mb']} / {report['rss_end_mb']} MB"
        )
    else:
        row(
            "RSS warm / end / peak (MB), whole process",
            f"{report['rss_warm_mb']} / {report['rss_end_mb']} / {report['rss_peak_mb']}",
        )
        row(
            "trimmed RSS warm / end / growth",
            f"{report['rss_trimmed_warm_mb']} / {report['rss_trimmed_end_mb']} MB / "
            f"{100 * (report['rss_trimmed_growth'] or 0):.1f} %",
        )
        for point in ("warm", "end"):
            m = report["memory"].get(point)
            if m:
                traced = ", ".join(f"{k} {v}" for k, v in m.get("traced_mb", {}).items())
                row(
                    f"  memory at {point} ({m['t']} s)",
                    f"journal {m['journal_entries']}, tombstones {m['tombstones']}, "
                    f"cached {m['cached_objects']}, sim history {m['sim_history_events']}"
                    + (f"; traced MB: {traced}" if traced else ""),
                )
        row(
            "stopped replicas / still alive at end",
            f"{report['replicas_stopped']} / {report['stopped_services_alive'] or 'none'}",
        )
    row("harness problems", report["harness_problems"] or "none")
    return "\n".join(lines)


def _mb(value: float | None, width: int = 6) -> str:
    return f"{'-' if value is None else f'{value:g}':>{width}}"


def _signed(value: float | None, digits: int = 3, width: int = 7) -> str:
    return f"{'-' if value is None else f'{value:+.{digits}f}':>{width}}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of faults (default 10)")
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--rate", type=float, default=SoakConfig.rate, help="generator steps per second")
    parser.add_argument("--max-jobs", type=int, default=SoakConfig.max_jobs)
    parser.add_argument("--json", type=Path, help="also write the full report here")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="write rss.png and counted-vs-truth.png into DIR (matplotlib)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every replica on this process's event loop (the memory figures are then the whole process's)",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="tracemalloc: traced memory by part at warm-up and end (with --in-process)",
    )
    parser.add_argument(
        "--replica-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in each replica process's environment (after the image's MALLOC_* settings; an empty value "
        "unsets): e.g. --replica-env MALLOC_TRIM_THRESHOLD_= for glibc's default",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="Prometheus' data and the replicas' logs (default: a new temporary directory)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = long_run_config(args.minutes, seed=args.seed, processes=not args.in_process)
    cfg.rate, cfg.max_jobs, cfg.trace_memory = args.rate, args.max_jobs, args.trace_memory
    cfg.replica_env = dict(item.split("=", 1) for item in args.replica_env)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = os.getloadavg()
    cfg.progress_every = 60.0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trainer-metrics-soak-"))
    print(f"replica logs and Prometheus' data in {workdir}", file=sys.stderr, flush=True)
    report, soak = asyncio.run(run_soak_keeping(cfg, workdir))
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    print(f"chaos soak, {args.minutes:g} minutes of faults, seed {cfg.seed}, started {started}")
    print(f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {os.cpu_count()} cores")
    print(render_table(report))
    if args.plot:
        try:
            written = soak.plot(args.plot, f"{args.minutes:g}-minute soak, seed {cfg.seed}")
        except ImportError as exc:
            print(f"no plot: {exc} (matplotlib is in the project's test extra)")
        else:
            print("plots:", ", ".join(str(p) for p in written))
    failures = check(report, cfg)
    for f in failures:
        print("FAIL:", f)
    print("RESULT:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


def long_run_config(minutes: float, *, seed: int = SoakConfig.seed, processes: bool = True) -> SoakConfig:
    """The command line's configuration: in process mode four replicas, two of them residents."""
    return SoakConfig(
        fault_seconds=minutes * 60,
        seed=seed,
        warmup_seconds=min(60.0, max(25.0, minutes * 6)),
        processes=processes,
        replicas=4 if processes else 3,
    )


def check(report: dict[str, Any], cfg: SoakConfig) -> list[str]:
    """Every guarantee the soak checks, as failure messages (empty: all held)."""
    out = []
    out += report["count_violations"]
    if report["overlapping_terms"]:
        out.append(f"leader terms overlapped: {report['overlapping_terms']}")
    if report["gauge_differences"]:
        out.append(f"trainjobs gauge differs from the truth: {report['gauge_differences']}")
    if report["liveness_problems"] or report["dead_tasks"]:
        out.append(f"liveness: {report['liveness_problems']} {report['dead_tasks']}")
    if report["error_log_records"] or report["loop_exceptions"]:
        out.append(f"errors logged: {report['error_log_records'][:5]} {report['loop_exceptions'][:5]}")
    out += memory_failures(report, cfg)
    if report["stopped_services_alive"]:
        out.append(f"stopped replicas not freed: {report['stopped_services_alive']}")
    if report["harness_problems"]:
        out.append(f"harness: {report['harness_problems']}")
    if report["counts_outside_terms"]:
        out.append(f"counts recorded outside any leader term: {report['counts_outside_terms']}")
    if report["doubles_unexplained"]:
        out.append(f"edges counted again for no documented cause: {report['doubles_by_cause']}")
    if report["lease_watermark_decreases"]:
        out.append(f"Lease watermark went down: {report['lease_watermark_decreases'][:5]}")
    promql = report.get("promql") or {}
    if promql.get("checked") and (promql["lost"] or promql["over_allowance"] or promql["born_above_zero"]):
        out.append(
            f"PromQL: lost {promql['lost']}, over allowance {promql['over_allowance']}, "
            f"series born above 0: {promql['born_above_zero']}"
        )
    inv = report.get("promql_invariants") or {}
    if promql.get("checked") and not inv.get("checked"):
        out.append("PromQL: the stored series were not read")
    if inv.get("went_down"):
        out.append(f"PromQL: served counts went down outside a term start: {inv['went_down_examples'][:3]}")
    if inv.get("over_counted"):
        out.append(f"PromQL: targets seen above what they counted: {inv['over_counted_examples'][:3]}")
    for kind in FAULT_KINDS:
        if not report["episodes_by_kind"].get(kind):
            out.append(f"fault kind {kind} never injected")
    out += readiness_failures(report)
    return out


def memory_failures(report: dict[str, Any], cfg: SoakConfig) -> list[str]:
    """Process mode: each resident process's RSS grows at most ``memory_growth_limit`` after the warm-up,
    and, once the window after its bounded structures were full spans ``slope_min_window``, its slope is
    under ``slope_limit``. In-process, the whole process (simulator, generator, checks and replicas) is
    reported and not checked: only a process of its own measures the service."""
    if report["mode"] != "processes":
        return []
    out = []
    residents = [p for p in report["processes"] if p["resident"]]
    if len(residents) < min(cfg.residents, cfg.replicas):
        out.append(f"memory: {len(residents)} resident processes measured")
    for proc in residents:
        name = proc["identity"]
        if proc["rss_growth"] is None:
            out.append(f"memory: no RSS reading of {name} after the warm-up")
        elif proc["rss_growth"] > cfg.memory_growth_limit:
            out.append(
                f"memory: RSS of {name} grew {100 * proc['rss_growth']:.1f} % after the warm-up "
                f"({proc['rss_warm_mb']} -> {proc['rss_end_mb']} MB)"
            )
        slope = proc["rss_slope_mb_per_min"]
        if proc["slope_from_full"] and proc["slope_window_s"] >= cfg.slope_min_window:
            if slope is None or slope > cfg.slope_limit:
                out.append(
                    f"memory: RSS slope of {name} {slope} MB/min over the last {proc['slope_window_s']} s "
                    f"(structures full from {proc['full_at_s']} s)"
                )
        elif cfg.fault_seconds >= cfg.slope_min_window * 2 + cfg.warmup_seconds:
            out.append(f"memory: no {cfg.slope_min_window:g} s window with {name}'s structures full")
    return out


def readiness_failures(report: dict[str, Any]) -> list[str]:
    out = []
    if not report["stalls"]:
        out.append("no stall long enough to check readiness")
    for s in report["stalls"]:
        for identity, frac in s["not_ready_fraction"].items():
            if frac < 0.8:
                out.append(
                    f"stall {s['start']}-{s['end']}: {identity} not ready in only {frac:.0%} of samples"
                )
        for identity, ok in s["ready_again_later"].items():
            if not ok:
                out.append(f"stall {s['start']}-{s['end']}: {identity} never ready again after the stall")
    return out


def run_main() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run_main()
