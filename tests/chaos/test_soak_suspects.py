"""The soak's suspects (tests/chaos/soak/report.py): an edge a leader counted above the watermark it
published, that no leader counted again, is "shown" when a served render of that term showed it (the served
ledger's record, tests/chaos/tap.py ``shown``), else "lost", which fails the soak."""

from __future__ import annotations

from tests.chaos.soak.ledger import CREATED
from tests.chaos.soak.terms import Term, shown_key

SERIES = [(CREATED, ("team-a", "rt"))]


def term() -> Term:
    return Term("replica-1", 0, 0.0, 0.0, floor=100)


def test_an_at_risk_edge_a_served_render_showed_is_shown_and_one_it_did_not_is_not() -> None:
    t = term()
    t.count(110, SERIES, ("created", "u1", 0))
    t.count(120, SERIES, ("created", "u2", 0))
    t.shown.update([110])
    t.published(105)
    assert t.was_shown(110, 0)
    assert not t.was_shown(120, 0)


def test_an_edge_a_relist_found_is_named_by_the_rv_after_the_one_held_before_the_gap() -> None:
    """The served ledger tracks such an edge at ``since`` + 1, where another replica's watch saw it."""
    t = term()
    t.count(130, SERIES, ("finished", "u3", 104))
    assert shown_key(130, 104) == 105
    t.shown.add(105)
    t.published(101)
    assert t.was_shown(130, 104)


def test_what_no_at_risk_edge_can_be_named_by_is_forgotten() -> None:
    t = term()
    t.count(110, SERIES, ("created", "u1", 0))
    t.shown.update([103, 110, 140])
    t.published(105)  # 103 names no at-risk edge: below the lowest one's name
    assert t.shown == {110, 140}
    t.published(200)  # nothing at risk any more
    assert t.shown == set()
