"""Edges counted more than once, caught as they happen and named by their cause."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from tests.chaos.soak.ledger import Series
from tests.chaos.soak.terms import EDGE_KINDS, Term, edge_uid
from tests.chaos.tap import Record

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
        # (kind, uid, first count, this count, the series this count incremented, the edge's stream)
        self.found: list[tuple[str, Any, tuple[str, float, int], tuple[str, float, int], Series, str]] = []

    def count(self, identity: str, record: Record, series: Series) -> None:
        kind = record["kind"]
        if kind not in EDGE_KINDS:
            return  # histograms only (time to running, admission wait): no counter to compare
        key = (kind, edge_uid(record))
        now = (identity, round(record["t"] - self.t0, 3), record["rv"])
        prior = self.first.get(key)
        if prior is not None:
            self.found.append((kind, key[1], prior, now, series, record.get("stream", "")))
            return
        self.first[key] = now
        if len(self.first) > self.window:
            self.first.popitem(last=False)

    def settle(self, counted: bool) -> None:
        self.settled["counted" if counted else "already counted"] += 1

    def classify(
        self, terms: list[Term], relisted: Callable[[str, int, int, str], bool]
    ) -> list[dict[str, Any]]:
        """``relisted(identity, edge_rv, seen_rv, stream)``: a relist of that replica's informer of the
        edge's stream covered the edge (its watch was down at ``edge_rv``) and listed the object at
        ``seen_rv``."""

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
        for kind, uid, (who1, t1, rv1), (who2, t2, rv2), series, stream in self.found:
            first, again = term_of(who1, t1), term_of(who2, t2)
            floor = again.floor_of(stream) if again is not None else None
            published = None
            if first is not None:
                published = first.published_at_stop if stream == "" else first.pod_published_at_stop
            if who1 == who2 and first is again:
                cause = "same identity"
            elif floor is not None and rv1 <= floor < rv2 and relisted(who2, rv1, rv2, stream):
                cause = "seen late with a newer rv"
            elif (
                first is not None
                and first.how != "graceful"
                and rv1 > (published or 0)
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
                        "published_at_stop": published,
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
