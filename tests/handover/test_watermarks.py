"""LeaseWatermarks: the floor a new leader takes over from, and the watermarks it publishes
(docs/leadership.md, "The hand-over watermark")."""

from __future__ import annotations

from app.handover.watermarks import WATERMARK_ANNOTATION, LeaseWatermarks
from app.kube.lease import LeaseRecord


def record(holder: str, watermark: str | None) -> LeaseRecord:
    annotations = {WATERMARK_ANNOTATION: watermark} if watermark is not None else {}
    return LeaseRecord(holder, 15, None, None, 0, annotations, "1")


def test_the_floor_is_the_taken_over_watermark_never_below_one_seen() -> None:
    lease = LeaseWatermarks("b")
    lease.observe(record("a", "50"))
    assert lease.takeover_floor(record("a", "70")) == {"": 70}
    # A Lease restored with an older value must not lower the floor below what was published before.
    assert lease.takeover_floor(record("a", "40")) == {"": 50}


def test_an_unreadable_watermark_falls_back_to_the_highest_seen() -> None:
    lease = LeaseWatermarks("b")
    lease.observe(record("a", '{"team-a":5,"team-b":9}'))
    lease.observe(record("a", '{"team-a":7}'))
    assert lease.takeover_floor(record("a", "garbage")) == {"team-a": 7, "team-b": 9}


def test_without_any_watermark_count_all_unless_another_leader_was_seen() -> None:
    assert LeaseWatermarks("b").takeover_floor(None) == 0
    lease = LeaseWatermarks("b")
    lease.observe(record("b", None))  # our own record says nothing about others
    assert lease.takeover_floor(None) == 0
    lease.observe(record("a", None))
    assert lease.takeover_floor(record("a", None)) is None


def test_published_watermarks_never_go_below_the_lease() -> None:
    lease = LeaseWatermarks("a")
    assert lease.annotations({}) == {}
    lease.observe(record("b", "90"))
    # A former leader's own watermark from its earlier term is lower than what the Lease says now.
    assert lease.annotations({"": 60}) == {WATERMARK_ANNOTATION: "90"}
    assert lease.annotations({"": 120}) == {WATERMARK_ANNOTATION: "120"}
