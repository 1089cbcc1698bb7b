"""The soak's per-term diagnosis of a PromQL-visible loss (tests/chaos/soak/shortfalls.py)."""

from __future__ import annotations

from typing import Any

from tests.chaos.soak.ledger import CREATED
from tests.chaos.soak.shortfalls import shortfalls
from tests.chaos.soak.terms import Term

KEY = ("default", "trainer.kubeflow.org/ClusterTrainingRuntime//torch-distributed")


def _term(counted: float, at_risk: int) -> Term:
    term = Term("replica-1", 3, started=10.0, started_wall=1000.0, floor=0)
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
    [found] = shortfalls([_term(5, 1), _term(1, 0)], _raw([0, 0, 2]), scrapes)
    assert (found["term"], found["how"], found["counted"], found["at_risk"], found["visible"]) == (
        "replica-1",
        "killed",
        5,
        1,
        2.0,
    )
    assert found["last_stored"] == [-8.0, 2.0]
    assert found["scrapes_near_end"] == [[-1.0, 1.0, 0.01], [0.0, 0.0, 1.0]]


def test_only_the_terms_own_target_counts() -> None:
    assert len(shortfalls([_term(2, 0)], _raw([0, 2], pod="slot-4"), {})) == 1
