"""Leader terms, in order, as the replicas' taps recorded them: what each counted, and what of it was at risk
of being counted again by the next."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.handover.streams import POD_STREAM_PREFIX as POD_STREAM
from app.handover.streams import floor_of
from kubesim.trainer.cluster import SimulatedCluster
from tests.chaos.soak.ledger import Series, Values, published_watermarks
from tests.chaos.tap import Record


@dataclass
class Term:
    identity: str
    slot: int
    started: float  # soak seconds
    started_wall: float  # time.time(), for Prometheus' sample timestamps
    floor: int | None  # the TrainJob stream's
    stopped: float | None = None
    stopped_wall: float | None = None
    counted: Values = field(default_factory=dict)  # what this term counted, per series
    max_rv: int | None = None  # the highest rv it counted on the TrainJob stream
    published_at_stop: int | None = None  # the TrainJob stream's watermark in the Lease when it ended
    how: str = "open"  # open, stopped (lost or released), killed, graceful
    # (rv, series) of the events this term counted above the watermark published in the Lease: while the
    # term runs, those above the last watermark seen written (pruned as it moves); when it has ended, above
    # the one published when it ended. Those above the next term's floor may be counted twice. Per stream
    # (``STREAMS``): the TrainJob stream's here, the pods stream's in ``pod_at_risk``.
    at_risk: list[tuple[int, Series]] = field(default_factory=list)
    # The same events, with what names them: (rv, kind, uid, since), for ``at_risk_not_recounted``.
    at_risk_edges: list[tuple[int, str, str, int]] = field(default_factory=list)
    # The lowest rv each count shown by a served render may have happened at (the served ledger's record,
    # tests/chaos/tap.py ``shown``), kept for as long as an at-risk edge may need it.
    shown: set[int] = field(default_factory=set)
    # The floor of each stream the previous leader published (None: nothing known).
    floors: dict[str, int] | None = None
    # The pods stream's: the highest rv counted, the watermark at the end, at-risk events and edges, shown.
    pod_max_rv: int | None = None
    pod_published_at_stop: int | None = None
    pod_at_risk: list[tuple[int, Series]] = field(default_factory=list)
    pod_at_risk_edges: list[tuple[int, str, str, int]] = field(default_factory=list)
    pod_shown: set[int] = field(default_factory=set)

    @property
    def final_watermark(self) -> int | None:
        """What the journal's watermark was when the term ended: the floor, or the highest rv counted."""
        values = [v for v in (self.floor, self.max_rv) if v is not None]
        return max(values) if values else None

    def floor_of(self, stream: str) -> int | None:
        """The floor this term counts ``stream`` from (app/handover/streams.py floor_of)."""
        if stream == "":
            return self.floor
        if self.floors is None:
            return None
        return floor_of(self.floors, stream)

    def final_watermark_of(self, stream: str) -> int | None:
        if stream == "":
            return self.final_watermark
        values = [v for v in (self.floor_of(stream), self.pod_max_rv) if v is not None]
        return max(values) if values else None

    def risk_of(self, stream: str) -> list[tuple[int, Series]]:
        return self.at_risk if stream == "" else self.pod_at_risk

    def risk_edges_of(self, stream: str) -> list[tuple[int, str, str, int]]:
        return self.at_risk_edges if stream == "" else self.pod_at_risk_edges

    def count(
        self, rv: int, series: Series, edge: tuple[str, str, int] | None = None, stream: str = ""
    ) -> None:
        for name, key in series:
            by = self.counted.setdefault(name, {})
            by[key] = by.get(key, 0.0) + 1.0
        if stream == "":
            self.max_rv = rv if self.max_rv is None else max(self.max_rv, rv)
        else:
            self.pod_max_rv = rv if self.pod_max_rv is None else max(self.pod_max_rv, rv)
        self.risk_of(stream).append((rv, series))
        if edge is not None:
            self.risk_edges_of(stream).append((rv, *edge))

    def published(self, watermark: int | Mapping[str, int]) -> None:
        """The Lease carries ``watermark`` now (one number: the TrainJob stream's; else by stream): what this
        term counted at or below it is not at risk."""
        marks = {"": watermark} if isinstance(watermark, int) else watermark
        if "" in marks:
            self.at_risk, self.at_risk_edges, self.shown = _prune(
                marks[""], self.at_risk, self.at_risk_edges, self.shown
            )
        if POD_STREAM in marks:
            self.pod_at_risk, self.pod_at_risk_edges, self.pod_shown = _prune(
                marks[POD_STREAM], self.pod_at_risk, self.pod_at_risk_edges, self.pod_shown
            )

    def was_shown(self, rv: int, since: int, stream: str = "") -> bool:
        """A served render of this term showed the count of the edge counted at ``rv`` (``since``: 0, or
        the rv its informer held before the relist that found it)."""
        return shown_key(rv, since) in (self.shown if stream == "" else self.pod_shown)


def _prune(
    watermark: int,
    at_risk: list[tuple[int, Series]],
    edges: list[tuple[int, str, str, int]],
    shown: set[int],
) -> tuple[list[tuple[int, Series]], list[tuple[int, str, str, int]], set[int]]:
    if at_risk and min(rv for rv, _ in at_risk) <= watermark:
        at_risk = [(rv, s) for rv, s in at_risk if rv > watermark]
        edges = [e for e in edges if e[0] > watermark]
    if shown:  # what no at-risk edge can be named by any more (an edge is shown after its count)
        lowest = min((shown_key(rv, since) for rv, _k, _u, since in edges), default=None)
        if lowest is None:
            shown = set()
        elif min(shown) < lowest:
            shown = {k for k in shown if k >= lowest}
    return at_risk, edges, shown


# The kinds of edge named by what they happened to (a TrainJob's uid, or a pod's: ``edge_uid``).
EDGE_KINDS = ("created", "finished", "pod_failed")


def edge_uid(record: Record) -> str:
    """What a ``count`` record's edge happened to: the pod for a pod's failure, else the TrainJob."""
    return str(record.get("subject") or record["uid"])


def shown_key(rv: int, since: int) -> int:
    """How the served ledger names a counted edge: the lowest rv it may have happened at."""
    return since + 1 if since else rv


def how_it_ended(requested: tuple[str, float] | None, stopped_at: float) -> str:
    """How a term that stopped at ``stopped_at`` (time.monotonic(), one clock for every process of the
    host) ended, given the stop the soak asked of its replica, if any, and when: a term that had stopped
    before the request (a step-down: its renew deadline passed) ended on its own, "stopped", even when its
    ``term_stop`` record is read after the request; a graceful stop would have handed over, a step-down
    cannot (docs/leadership.md, "A leader that cannot renew": the crash bound)."""
    if requested is None or stopped_at < requested[1]:
        return "stopped"
    return requested[0]


class Recorder:
    """Leader terms, in order, from each replica's ``term_start`` / ``count`` / ``term_stop`` records
    (tests/chaos/tap.py). A term's counts are the sum of its ``count`` records: every count goes through
    the journal's ``_count`` (live, replayed at the take-over, or settled)."""

    def __init__(self, sim: SimulatedCluster, t0: float) -> None:
        self.sim = sim
        self.t0 = t0
        self.terms: list[Term] = []
        self.open: dict[str, Term] = {}
        # identity -> (how its stop was asked: "graceful" or "killed", time.monotonic() of the request)
        self.pending_how: dict[str, tuple[str, float]] = {}
        self.outside_terms = 0  # count records of a replica that was not leading: a harness problem
        self.times_counted: Counter[tuple[str, str]] = Counter()  # (kind, uid): by all terms together

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    def start(self, identity: str, slot: int, record: Record) -> None:
        term = Term(identity, slot, self.rel(record["t"]), record["wall"], record["floor"])
        floors = record.get("floors")
        term.floors = dict(floors) if floors or record["floor"] is not None else None
        self.open[identity] = term
        self.terms.append(term)

    def count(self, identity: str, record: Record, series: Series) -> None:
        term = self.open.get(identity)
        if term is None:
            self.outside_terms += 1
            return
        kind = record["kind"]
        uid = edge_uid(record)
        edge = (kind, uid, record.get("since", 0)) if kind in EDGE_KINDS else None
        term.count(record["rv"], series, edge, record.get("stream", ""))
        if edge is not None:
            self.times_counted[(kind, uid)] += 1

    def shown(self, identity: str, record: Record) -> None:
        term = self.open.get(identity)
        if term is not None:
            for stream, rv in record["rvs"]:
                (term.shown if stream == "" else term.pod_shown).add(rv)

    def stop(self, identity: str, t: float, wall: float) -> None:
        """The term of ``identity`` ended at ``t`` (its ``term_stop``, or the kill of its process)."""
        term = self.open.pop(identity, None)
        if term is None:
            return
        term.stopped, term.stopped_wall = self.rel(t), wall
        marks = published_watermarks(self.sim) or {}
        term.published_at_stop = marks.get("")
        term.pod_published_at_stop = marks.get(POD_STREAM)
        term.how = how_it_ended(self.pending_how.get(identity), t)
        term.published({"": marks.get("", 0), POD_STREAM: marks.get(POD_STREAM, 0)})

    def lease_written(self, holder: str | None, watermark: Mapping[str, int]) -> None:
        term = self.open.get(holder or "")
        if term is not None:
            term.published(watermark)

    def close_open_terms(self) -> None:
        """The open term (the final leader) is taken as ending now."""
        for term in self.open.values():
            term.stopped = self.rel(time.monotonic())
            term.stopped_wall = time.time()
