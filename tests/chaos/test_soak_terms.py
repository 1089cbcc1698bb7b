"""How the soak names the end of a leader term (tests/chaos/soak/terms.py ``how_it_ended``) and what that
makes of an edge the next leader counts again (tests/chaos/soak/doubles.py).

A leader that cannot renew steps down at its renew deadline, publishing only its served watermark: what a
scraper saw above it is counted again, the crash bound (docs/leadership.md, "A leader that cannot renew").
The soak may ask that replica for a graceful stop a moment later, before it has read the ``term_stop``
record of the step-down. The 30-minute soak under two CPU burners met exactly that: a leader took over,
replayed 547 events, missed its 2 s renew deadline 1.9 s later and stepped down; the soak's graceful
restart came after, and the 64 edges its successor counted again were named "other" instead of the crash
bound, failing the run.
"""

from __future__ import annotations

from tests.chaos.soak.doubles import DoubleCounts
from tests.chaos.soak.ledger import CREATED
from tests.chaos.soak.terms import Term, how_it_ended

JOB = [(CREATED, ("team-a", "rt"))]


def test_a_term_that_stopped_before_the_stop_was_asked_ended_on_its_own() -> None:
    assert how_it_ended(("graceful", 100.0), 99.5) == "stopped"
    assert how_it_ended(("killed", 100.0), 99.5) == "stopped"


def test_a_term_that_stopped_after_the_request_ended_as_asked() -> None:
    assert how_it_ended(("graceful", 100.0), 100.2) == "graceful"
    assert how_it_ended(("killed", 100.0), 100.0) == "killed"
    assert how_it_ended(None, 100.0) == "stopped"  # lost its Lease while nobody asked anything


def _recounted(first_how: str) -> str:
    t0 = 1000.0
    doubles = DoubleCounts(t0)
    first = Term("replica-9", 0, 10.0, 0.0, floor=200)
    first.stopped, first.how, first.published_at_stop = 12.0, first_how, 200
    again = Term("replica-16", 1, 13.0, 0.0, floor=200)
    record = {"kind": "created", "uid": "job-1", "rv": 266, "t": t0 + 11.0}
    doubles.count("replica-9", record, JOB)
    doubles.count("replica-16", {**record, "t": t0 + 13.5}, JOB)
    (found,) = doubles.classify([first, again], lambda *_: False)
    return str(found["cause"])


def test_an_edge_counted_again_after_a_step_down_is_the_crash_bounds() -> None:
    assert _recounted("stopped") == "crash bound"


def test_an_edge_counted_again_after_a_graceful_stop_has_no_documented_cause() -> None:
    assert _recounted("graceful") == "other"
