"""Property: the informer's line processing survives anything a server sends (random bytes, truncated
JSON, valid JSON of the wrong shape, deep nesting, huge lines) and accounts for every line: an event,
a bookmark, an ERROR (which stops the watch by design), or a skipped object counted by reason.

Driven at unit level like tests/kube/test_informer_unit.py: ``_process_line`` for single lines,
``_consume`` over a fake response for chunking and the size cap, ``_decode_page`` for LIST pages;
the real TrainJob projector and a real TrainerState are behind it, so a handler_error count would
reveal a state bug too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.kube.informer import Informer, InformerOptions, _WatchStop
from app.kube.resources import TRAINJOBS
from app.trainer.projections import TRAINJOB_PROJECTOR
from app.trainer.state import TrainerState
from tests.badinput import strategies as S
from tests.badinput.test_state_fuzz import RecordingSink

FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def make(max_object_bytes: int = 4 * 1024 * 1024) -> Informer[Any]:
    state = TrainerState(RecordingSink(), runtime_wait_seconds=0)
    return Informer(
        cast(Any, None),
        TRAINJOBS,
        None,
        TRAINJOB_PROJECTOR,
        state.job_handler,
        options=InformerOptions(max_object_bytes=max_object_bytes),
    )


def tally(inf: Informer[Any]) -> int:
    c = inf.counters
    return c.added + c.modified + c.deleted + c.bookmark + c.error + sum(c.skipped.values())


def feed(inf: Informer[Any], line: bytes) -> bool:
    """Process one line; True when it stopped the watch (an ERROR event: by design)."""
    before = tally(inf)
    try:
        inf._process_line(line)
    except _WatchStop:
        assert inf.counters.error == 1 or b"ERROR" in line
        return True
    assert tally(inf) > before, f"line left no trace in the counters: {line[:200]!r}"
    assert inf.counters.skipped["handler_error"] == 0
    return False


event_types = st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "added", "", "SYNC"])
lines = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda t, o: S.encode({"type": t, "object": o}), event_types, S.trainjobs()),
    st.builds(lambda t, o: S.encode({"type": t, "object": o}), event_types, S.junk),
    S.junk.map(S.encode),
    # truncated JSON
    st.tuples(S.trainjobs(), st.integers(1, 500)).map(
        lambda t: S.encode({"type": "ADDED", "object": t[0]})[: t[1]]
    ),
)


@FUZZ
@given(st.lists(lines, min_size=1, max_size=8))
@example(
    [b"\x00\xff", b"{", b"[]", b"null", b'"ADDED"', b'{"type":"ADDED"}', b'{"type":"ADDED","object":[]}']
)
@example([b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":7}}}'])
def test_no_line_escapes_and_every_line_is_accounted_for(batch: list[bytes]) -> None:
    inf = make()
    for line in batch:
        if feed(inf, line):
            break


@pytest.mark.parametrize("junk", [b"\x00" * 10, b"not json", b"[1,2,3]", b"42", b'"x"', b'{"type":'])
def test_junk_lines_are_skipped_as_malformed(junk: bytes) -> None:
    inf = make()
    inf._process_line(junk)
    assert inf.counters.skipped["malformed"] == 1
    assert len(inf) == 0


def _nested_line(depth: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    return (
        b'{"type":"ADDED","object":{"metadata":{"name":"j","uid":"u","namespace":"ns","resourceVersion":"3"},'
        b'"spec":{"podTemplateOverrides":' + inner + b"}}}"
    )


@pytest.mark.parametrize("depth", [100, 900])
def test_moderately_nested_objects_are_decoded(depth: int) -> None:
    inf = make()
    inf._process_line(_nested_line(depth))
    assert len(inf) == 1


@pytest.mark.parametrize("depth", [1100, 5000])
def test_deeply_nested_watch_line_is_skipped_not_raised(depth: int) -> None:
    inf = make()
    inf._process_line(_nested_line(depth))
    assert inf.counters.skipped["malformed"] + len(inf) == 1


def test_deeply_nested_list_item_does_not_block_the_list() -> None:
    inf = make()
    item = orjson.loads(_nested_line(10)[len(b'{"type":"ADDED","object":') : -1])
    other = {**item, "metadata": {**item["metadata"], "name": "k", "uid": "v"}}
    ok = orjson.dumps({"metadata": {"resourceVersion": "9"}, "items": [item, other]})
    deep = b"[" * 3000 + b"]" * 3000
    page = ok.replace(b'"podTemplateOverrides":', b'"podTemplateOverrides":' + deep + b',"x":', 1)
    items: dict[str, Any] = {}
    unusable: set[str] = set()
    rv, _ = inf._decode_page(page, items, unusable)
    assert rv == "9"
    assert "ns/k" in items  # the well-formed item is kept
    assert "ns/j" in items or "ns/j" in unusable  # the deep one is decoded or counted, not fatal


def test_same_unusable_line_twice_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    inf = make()
    line = (
        b'{"type":"ADDED","object":{"metadata":{"name":"j","namespace":"ns","resourceVersion":"4","uid":7}}}'
    )
    with caplog.at_level(logging.WARNING):
        inf._process_line(line)
        inf._process_line(line)
    assert inf.counters.skipped["malformed"] == 2
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


# --- chunked stream and the size cap ---------------------------------------------------------------


class FakeContent:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def readany(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


class FakeResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.content = FakeContent(chunks)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


MAX = 2048
stream_lines = st.one_of(
    lines.filter(lambda b: b"\n" not in b and b.strip()),
    st.integers(MAX - 3, MAX + 3).map(lambda n: b"x" * n),  # around the cap
    st.just(b"y" * 100_000),
)


@FUZZ
@given(st.lists(stream_lines, min_size=1, max_size=6), st.lists(st.integers(0, 10**6), max_size=8))
def test_stream_chunking_does_not_change_what_is_processed_and_long_lines_are_too_large(
    batch: list[bytes], cuts: list[int]
) -> None:
    # reference: line by line until the first oversized one
    ref = make(MAX)
    expected_too_large = 0
    for line in batch:
        if len(line) > MAX:
            expected_too_large = 1
            break
        try:
            ref._process_line(line)
        except _WatchStop:
            break
    chunked = make(MAX)
    data = b"\n".join(batch) + b"\n"
    stop: _WatchStop | None = None
    try:
        asyncio.run(chunked._consume(cast(Any, FakeResponse(_chunks(data, cuts)))))
    except _WatchStop as exc:
        stop = exc
    assert chunked.counters.skipped["too_large"] == expected_too_large
    if expected_too_large:
        assert stop is not None and stop.reason == "oversized_line" and stop.relist == "oversized_line"
    assert tally(chunked) == tally(ref) + expected_too_large
    assert chunked.keys() == ref.keys()
