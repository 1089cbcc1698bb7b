"""The soak's per-term diagnosis of a PromQL-visible loss (tests/chaos/soak/shortfalls.py)."""

from __future__ import annotations

from typing import Any

from tests.chaos.soak.ledger import CREATED
from tests.chaos.soak.shortfalls import shortfalls
from tests.chaos.soak.terms import Term

KEY = ("default", "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed")


def _term(counted: float, at_risk: int, *, started: float = 10.0, floor: int = 0) -> Term:
    term = Term("replica-1", 3, started=started, started_wall=990.0 + started, floor=floor)
    term.stopped, term.stopped_wall, term.how = 20.0, 1010.0, "killed"
    term.counted = {CREATED: {KEY: counted}}
    term.at_risk = [(100 + i, [(CREATED, KEY)]) for i in range(at_risk)]
    return term


def _raw(values: list[float], pod: str = "slot-3") -> dict[str, list[dict[str, Any]]]:
    metric = {"namespace": KEY[0], "runtime_ref": KEY[1], "pod": pod}
    samples = [[1000.0 + i, str(v)] for i, v in enumerate(values)]
    return {CREATED: [{"metric": metric, "values": samples}]}


def test_a_term_stored_as_high_as_it_counted_has_no_shortfall() -> None:
    assert shortfalls([_term(3, 0)], _raw([0, 0, 1, 3]), {}) == []


def test_counts_the_next_leader_counts_again_need_not_be_stored() -> None:
    assert shortfalls([_term(5, 2)], _raw([0, 0, 3]), {}) == []


def test_a_term_stored_below_what_only_it_counted_is_named_with_its_last_scrapes() -> None:
    scrapes = {"slot-3": [(1009.0, 1.0, 0.01), (1010.0, 0.0, 1.0), (1030.0, 1.0, 0.01)]}
    [found] = shortfalls([_term(5, 1), _term(0, 0, started=30.0)], _raw([0, 0, 2]), scrapes)
    assert (found["term"], found["how"], found["counted"], found["recounted_next"], found["visible"]) == (
        "replica-1",
        "killed",
        5,
        1,
        2.0,
    )
    assert found["last_stored"] == [-8.0, 2.0]
    assert found["scrapes_near_end"] == [[-1.0, 1.0, 0.01], [0.0, 0.0, 1.0]]


def test_counts_at_or_below_the_next_floor_must_be_stored_though_above_what_was_published() -> None:
    """The next leader skips what lies at or below its floor: if that floor is above the watermark the term
    published, its at-risk counts there are counted by nobody else."""
    [found] = shortfalls([_term(5, 2), _term(0, 0, started=30.0, floor=100)], _raw([0, 0, 3]), {})
    assert (found["recounted_next"], found["at_risk_below_next_floor"], found["visible"]) == (1, 1, 3.0)


def test_only_the_terms_own_target_counts() -> None:
    assert len(shortfalls([_term(2, 0)], _raw([0, 2], pod="slot-4"), {})) == 1
