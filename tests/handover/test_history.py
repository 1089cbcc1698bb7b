"""The ran-before / admitted-before facts in the Lease (app/handover/history.py): their format, bounds, and
tolerance of a malformed annotation."""

from __future__ import annotations

import logging
import uuid

import pytest

from app.handover.history import (
    ADMITTED_BEFORE_ANNOTATION,
    HISTORY_LIMIT,
    MAX_PUBLISHED,
    RAN_BEFORE_ANNOTATION,
    format_history,
    parse_history,
)


def uids(n: int, seed: int = 0) -> list[str]:
    return [str(uuid.UUID(int=(seed << 64) + i + 1)) for i in range(n)]


def test_round_trip_is_exact_and_compact() -> None:
    ran, admitted = uids(3), uids(2, seed=1)
    annotations = format_history(ran, admitted)
    assert parse_history(annotations) == (sorted(ran), sorted(admitted))
    assert len(annotations[RAN_BEFORE_ANNOTATION]) == 64  # 48 bytes of base64: 22 characters a uid


def test_nothing_to_say_is_an_empty_value_and_absent_annotations_read_as_nothing() -> None:
    assert format_history([], []) == {RAN_BEFORE_ANNOTATION: "", ADMITTED_BEFORE_ANNOTATION: ""}
    assert parse_history({}) == ([], [])


def test_a_uid_that_is_not_a_uuid_is_left_out() -> None:
    assert parse_history(format_history(["not-a-uuid", *uids(1)], [])) == (uids(1), [])


def test_beyond_the_cap_the_rest_is_left_out_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    hits: list[str] = []
    many = uids(MAX_PUBLISHED + 5)
    with caplog.at_level(logging.WARNING):
        annotations = format_history(many, [], on_limit=hits.append)
    ran, _ = parse_history(annotations)
    assert len(ran) == MAX_PUBLISHED and set(ran) <= set(many)
    assert hits == [HISTORY_LIMIT]
    assert len(annotations[RAN_BEFORE_ANNOTATION]) < 45_000  # well inside the API server's 256 KiB


@pytest.mark.parametrize("bad", ["%%%", "AAAA", "QUJD" * 7])
def test_a_malformed_annotation_reads_as_nothing(bad: str) -> None:
    assert parse_history({RAN_BEFORE_ANNOTATION: bad, ADMITTED_BEFORE_ANNOTATION: bad}) == ([], [])
