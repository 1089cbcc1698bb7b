"""Property: the informer's line processing survives anything a server sends (random bytes, truncated
JSON, valid JSON of the wrong shape, deep nesting, huge lines) and accounts for every line: an event,
a bookmark, an ERROR (which stops the watch by design), or a skipped object counted by reason.

Driven through the informer's real list/watch loop over a fake client (tests/support/informer_fakes.py): one
line per chunk to account for each line, arbitrary chunk boundaries for the chunking and the size cap, and
``Decoder.page`` for LIST pages. The real TrainJob projector and a real TrainerState are behind it, so a
handler_error count would reveal a state bug too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.kube.decode import Decoder
from app.kube.informer import Informer, InformerOptions
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.kinds import TRAINJOBS
from app.trainer.state import TrainerState
from tests.badinput import strategies as S
from tests.support.informer_fakes import FakeClient, running

FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
# Backoff and the 410 quick relist still sleep on the event loop: keep those sleeps negligible.
FAST = InformerOptions(backoff_base=0.001, backoff_cap=0.001)
EMPTY_LIST = b'{"metadata":{"resourceVersion":"1"},"items":[]}'


def make(client: FakeClient, max_object_bytes: int = 4 * 1024 * 1024) -> Informer[Any]:
    state = TrainerState(S.recording_sink(), runtime_wait_seconds=0)
    return Informer(
        client,
        TRAINJOBS,
        None,
        TRAINJOB_PROJECTOR,
        state.job_handler,
        options=dataclasses.replace(FAST, max_object_bytes=max_object_bytes),
    )


def tally(inf: Informer[Any]) -> int:
    c = inf.counters
    return c.added + c.modified + c.deleted + c.bookmark + c.error + sum(c.skipped.values())


def watch(
    chunks: list[bytes], *, max_object_bytes: int = 4 * 1024 * 1024, list_body: bytes = EMPTY_LIST
) -> tuple[Informer[Any], list[int]]:
    """An informer given one LIST and one watch stream of ``chunks``, run until it waits for more.

    Also returns ``tally`` at every read of the stream: before each chunk, and after the last one read.
    """

    async def main() -> tuple[Informer[Any], list[int]]:
        client = FakeClient()
        inf = make(client, max_object_bytes)
        tallies: list[int] = []
        client.add_list(list_body)
        client.add_watch(*chunks, on_read=lambda: tallies.append(tally(inf)))
        async with running(inf):
            await client.idle()
        return inf, tallies

    return asyncio.run(main())


def stopped(inf: Informer[Any]) -> bool:
    return sum(inf.counters.watch_restarts.values()) > 0


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
    # What the server's stream holds: newlines delimit lines, empty ones carry nothing.
    segments = [seg for seg in b"\n".join(batch).split(b"\n") if seg]
    inf, before = watch([seg + b"\n" for seg in segments])
    c = inf.counters
    assert c.relists["internal"] == 0, "an exception escaped line processing"
    assert c.skipped["handler_error"] == 0
    processed = segments[: len(before)] if stopped(inf) else segments
    after = [*before[1:], tally(inf)]
    for i, line in enumerate(processed):
        if stopped(inf) and i == len(processed) - 1:  # the line that stopped the watch: an ERROR
            assert c.error == 1 or b"ERROR" in line
        else:
            assert after[i] > before[i], f"line left no trace in the counters: {line[:200]!r}"


@pytest.mark.parametrize("junk", [b"\x00" * 10, b"not json", b"[1,2,3]", b"42", b'"x"', b'{"type":'])
def test_junk_lines_are_skipped_as_malformed(junk: bytes) -> None:
    inf, _ = watch([junk + b"\n"])
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
    inf, _ = watch([_nested_line(depth) + b"\n"])
    assert len(inf) == 1


@pytest.mark.parametrize("depth", [1100, 5000])
def test_deeply_nested_watch_line_is_skipped_not_raised(depth: int) -> None:
    inf, _ = watch([_nested_line(depth) + b"\n"])
    assert inf.counters.skipped["malformed"] + len(inf) == 1


def test_deeply_nested_list_item_does_not_block_the_list() -> None:
    item = orjson.loads(_nested_line(10)[len(b'{"type":"ADDED","object":') : -1])
    other = {**item, "metadata": {**item["metadata"], "name": "k", "uid": "v"}}
    ok = orjson.dumps({"metadata": {"resourceVersion": "9"}, "items": [item, other]})
    deep = b"[" * 3000 + b"]" * 3000
    page = ok.replace(b'"podTemplateOverrides":', b'"podTemplateOverrides":' + deep + b',"x":', 1)
    items: dict[str, Any] = {}
    unusable: set[str] = set()
    rv, _ = Decoder(TRAINJOB_PROJECTOR).page(page, {}, items, unusable, lambda *skipped: None)
    assert rv == "9"
    assert "ns/k" in items  # the well-formed item is kept
    assert "ns/j" in items or "ns/j" in unusable  # the deep one is decoded or counted, not fatal
    inf, _ = watch([], list_body=page)  # and the informer syncs on it
    assert inf.synced and inf.resource_version == "9" and inf.get("ns/k") is not None


def test_same_unusable_line_twice_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    line = (
        b'{"type":"ADDED","object":{"metadata":{"name":"j","namespace":"ns","resourceVersion":"4","uid":7}}}'
    )
    with caplog.at_level(logging.WARNING):
        inf, _ = watch([line + b"\n", line + b"\n"])
    assert inf.counters.skipped["malformed"] == 2
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


# --- chunked stream and the size cap ---------------------------------------------------------------


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
    # reference: one line per chunk, up to the first oversized one (and never given that one)
    head = list(itertools.takewhile(lambda line: len(line) <= MAX, batch))
    ref, _ = watch([line + b"\n" for line in head], max_object_bytes=MAX)
    # an ERROR among them ends the watch before the oversized line is reached
    expected_too_large = int(len(head) < len(batch) and not stopped(ref))
    chunked, _ = watch(_chunks(b"\n".join(batch) + b"\n", cuts), max_object_bytes=MAX)
    c = chunked.counters
    assert c.skipped["too_large"] == expected_too_large
    if expected_too_large:
        assert c.watch_restarts["oversized_line"] == 1 and c.relists["oversized_line"] == 1
    assert tally(chunked) == tally(ref) + expected_too_large
    assert chunked.keys() == ref.keys()
