"""Leader terms, in order, as the replicas' taps recorded them: what each counted, and what of it was at risk
of being counted again by the next."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from kubesim.trainer.cluster import SimulatedCluster
from tests.chaos.soak.ledger import Series, Values, published_watermark
from tests.chaos.tap import Record


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
    # The lowest rv each count shown by a served render may have happened at (the served ledger's record,
    # tests/chaos/tap.py ``shown``), kept for as long as an at-risk edge may need it.
    shown: set[int] = field(default_factory=set)

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
        if self.shown:  # what no at-risk edge can be named by any more (an edge is shown after its count)
            lowest = min((shown_key(rv, since) for rv, _k, _u, since in self.at_risk_edges), default=None)
            if lowest is None:
                self.shown.clear()
            elif min(self.shown) < lowest:
                self.shown = {k for k in self.shown if k >= lowest}

    def was_shown(self, rv: int, since: int) -> bool:
        """A served render of this term showed the count of the edge counted at ``rv`` (``since``: 0, or
        the rv its informer held before the relist that found it)."""
        return shown_key(rv, since) in self.shown


def shown_key(rv: int, since: int) -> int:
    """How the served ledger names a counted edge: the lowest rv it may have happened at."""
    return since + 1 if since else rv


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

    def shown(self, identity: str, record: Record) -> None:
        term = self.open.get(identity)
        if term is not None:
            term.shown.update(record["rvs"])

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
