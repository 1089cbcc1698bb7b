"""The batch path: the lines a chunk completes decoded in one msgspec call (``Ingest.process_lines``).

Whatever a batch holds, the outcome must be that of ``process_line`` on each line: the same handler
calls, counters, resourceVersion, logs and WatchStop. Checked on the Ingest directly (batch vs one line at
a time) and through the reflector (one chunk vs one chunk per line, an oversized line, a partial line).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from app.kube.cache import Cache
from app.kube.decode import Decoder
from app.kube.informer_telemetry import InformerCounters
from app.kube.ingest import Ingest, WatchStop
from app.kube.lines import Line
from tests.kube.test_informer_unit import Rig, line, page
from tests.support.informer_fakes import Projector, Recorder, Thing, obj, running


def nonzero(counts: Any) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def make_ingest() -> tuple[Ingest[Thing], Projector, Recorder]:
    projector, recorder, counters = Projector(), Recorder(), InformerCounters()
    decoder = Decoder(projector)
    cache = Cache(recorder, counters, name="things", same_uid=decoder.same_uid)
    ingest = Ingest(decoder, cache, counters, name="things", clock=lambda: 5.0)
    ingest.replace({}, "1", set())
    return ingest, projector, recorder


def outcome(lines: list[bytes], *, batch: bool, caplog: pytest.LogCaptureFixture) -> tuple[Any, ...]:
    """Everything observable after feeding ``lines`` (as zero-copy views, as the splitter gives them)."""
    ingest, projector, recorder = make_ingest()
    buf = b"\n".join(lines)
    views: list[Line] = []
    start = 0
    for ln in lines:
        views.append(memoryview(buf)[start : start + len(ln)])
        start += len(ln) + 1
    per_line = 0
    process_line = ingest.process_line

    def counting(ln: Line) -> None:
        nonlocal per_line
        per_line += 1
        process_line(ln)

    ingest.process_line = counting  # type: ignore[method-assign]
    caplog.clear()
    stop = None
    try:
        if batch:
            ingest.process_lines(views)
        else:
            for v in views:
                ingest.process_line(v)
    except WatchStop as exc:
        stop = (exc.reason, exc.relist, exc.fresh)
    c = ingest.counters
    logs = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("app.kube")]
    return (
        recorder.calls,
        (c.added, c.modified, c.deleted, c.bookmark, c.error, nonzero(c.skipped)),
        ingest.resource_version,
        ingest.last_event,
        logs,
        stop,
        projector.tolerant,
        per_line if batch else None,
    )


def same_as_per_line(lines: list[bytes], caplog: pytest.LogCaptureFixture) -> tuple[Any, ...]:
    caplog.set_level(logging.INFO)
    batched = outcome(lines, batch=True, caplog=caplog)
    single = outcome(lines, batch=False, caplog=caplog)
    assert batched[:-1] == single[:-1]
    return batched


GOOD = [line("ADDED", obj("a", 10)), line("MODIFIED", obj("a", 11, value=2)), line("ADDED", obj("b", 12))]


def test_a_clean_batch_is_decoded_in_one_call(caplog: pytest.LogCaptureFixture) -> None:
    calls, counters, rv, _, logs, stop, tolerant, per_line = same_as_per_line(GOOD, caplog)
    assert per_line == 0 and tolerant == 0  # no line went through process_line or the tolerant path
    assert calls == [
        ("added", "ns/a", "10", False),
        ("updated", "ns/a", "10", "11"),
        ("added", "ns/b", "12", False),
    ]
    assert counters[:2] == (2, 1) and rv == "12" and logs == [] and stop is None


def test_a_batch_with_a_malformed_line_falls_back_line_by_line(caplog: pytest.LogCaptureFixture) -> None:
    lines = [GOOD[0], b"this is not json", GOOD[1], b"this is not json", GOOD[2]]
    calls, counters, rv, _, logs, _, _, per_line = same_as_per_line(lines, caplog)
    assert per_line == len(lines)
    assert len(calls) == 3 and rv == "12" and counters[5] == {"malformed": 2}
    assert len(logs) == 1  # the rate limit logs the first malformed line once


@pytest.mark.parametrize(
    "odd",
    [
        b"   ",  # whitespace only: decode_lines would drop it
        b"\r",
        line("ADDED", obj("x", 20)) + b"," + line("ADDED", obj("y", 21)),  # two values on one line
        b'{"type":"ADDED","object":{"metadata":{"name":"m","uid":"u","namespace":"ns","resourceVersion":"',
        b'30"}}}',  # ... and its end on the next line: lines never merge
        line("ADDED", obj("a", 13, value="not-an-int")),  # typed failure, tolerant projection
        line("ADDED", {"metadata": {"name": "nouid", "namespace": "ns", "resourceVersion": "14"}}),
        line("SURPRISE", obj("a", 15)),
        line("BOOKMARK", {"kind": "Thing", "metadata": {"resourceVersion": "99"}}),
        b"[" * 3000 + b"]" * 3000,  # deeper than the recursion limit
    ],
)
def test_odd_lines_in_a_batch_match_per_line_decoding(odd: bytes, caplog: pytest.LogCaptureFixture) -> None:
    same_as_per_line([GOOD[0], odd, GOOD[1]], caplog)
    same_as_per_line([odd, GOOD[2]], caplog)


def test_split_value_across_lines_in_a_batch(caplog: pytest.LogCaptureFixture) -> None:
    head = b'{"type":"ADDED","object":{"metadata":{"name":"m","uid":"u","namespace":"ns","resourceVersion":"'
    calls, counters, *_ = same_as_per_line([GOOD[0], head, b'30"}}}', GOOD[1]], caplog)
    assert counters[5] == {"malformed": 2} and len(calls) == 2


def test_an_error_event_mid_batch_stops_there(caplog: pytest.LogCaptureFixture) -> None:
    error = line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    calls, counters, rv, _, logs, stop, _, _ = same_as_per_line([GOOD[0], error, GOOD[2]], caplog)
    assert calls == [("added", "ns/a", "10", False)] and rv == "10"  # the line after the ERROR is not applied
    assert stop == ("expired", "expired", True) and counters[4] == 1 and len(logs) == 1


def test_a_deletion_in_a_batch(caplog: pytest.LogCaptureFixture) -> None:
    unusable_delete = line("DELETED", {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "16"}})
    calls, *_ = same_as_per_line([GOOD[0], line("DELETED", obj("b", 15)), unusable_delete, GOOD[2]], caplog)
    assert calls == [
        ("added", "ns/a", "10", False),
        ("deleted", "ns/a", "10"),
        ("added", "ns/b", "12", False),
    ]


def test_empty_and_single_line_batches() -> None:
    ingest, _, recorder = make_ingest()
    ingest.process_lines([])
    ingest.process_lines([GOOD[0]])
    assert recorder.calls == [("added", "ns/a", "10", False)]


# --- through the reflector: chunks as the server sends them ----------------------------------------


async def watch_outcome(chunks: list[bytes]) -> tuple[Any, ...]:
    rig = Rig()
    async with running(rig.informer):
        await rig.start()
        assert rig.stream is not None
        rig.client.add_list(page([], 50))  # for the relist after an oversized line
        rig.stream.push(*chunks)
        await rig.client.idle()
        inf = rig.informer
        c = inf.counters
        return (
            rig.recorder.calls,
            inf.resource_version,
            nonzero(c.skipped),
            nonzero(c.relists),
            nonzero(c.watch_restarts),
        )


LINES = [line("ADDED", obj(f"j{i}", 10 + i)) for i in range(200)]


@pytest.mark.parametrize("cut", [0, 1, 7, 100, -1])
async def test_one_chunk_or_line_by_line_give_the_same_result(cut: int) -> None:
    body = b"".join(ln + b"\n" for ln in LINES)
    # A chunk boundary anywhere (mid-line: the first chunk ends with a partial line).
    pos = len(body) // 2 + cut
    split_chunks = await watch_outcome([body[:pos], body[pos:]])
    per_line = await watch_outcome([ln + b"\n" for ln in LINES])
    assert split_chunks == per_line
    assert len(per_line[0]) == len(LINES) and per_line[1] == "209"


async def test_a_batch_followed_by_an_oversized_line() -> None:
    # max_object_bytes is 4 MiB by default: the lines before the oversized one are applied, then relist.
    big = b'{"type":"ADDED","object":{"x":"' + b"y" * (4 * 1024 * 1024 + 10)
    result = await watch_outcome(
        [b"".join(ln + b"\n" for ln in LINES[:5]) + big[:1000], big[1000:] + b'"}}\n']
    )
    calls, _, skipped, relists, _ = result
    assert [call[1] for call in calls[:5]] == [f"ns/j{i}" for i in range(5)]
    assert skipped == {"too_large": 1} and relists.get("oversized_line") == 1


async def test_a_batch_ending_with_a_partial_line_completes_with_the_next_chunk() -> None:
    body = b"".join(ln + b"\n" for ln in LINES[:3])
    partial = LINES[3][:20]
    result = await watch_outcome([body + partial, LINES[3][20:] + b"\n" + LINES[4] + b"\n"])
    assert [call[1] for call in result[0]] == [f"ns/j{i}" for i in range(5)] and result[1] == "14"


async def test_a_malformed_line_in_a_chunk_is_skipped_once(caplog: pytest.LogCaptureFixture) -> None:
    chunk = b"".join(ln + b"\n" for ln in [*LINES[:3], b"{not json", *LINES[3:6]])
    calls, rv, skipped, _, _ = await watch_outcome([chunk])
    assert len(calls) == 6 and rv == "15" and skipped == {"malformed": 1}
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 1


def test_a_block_with_empty_lines_drops_them_as_the_splitter_does(caplog: pytest.LogCaptureFixture) -> None:
    ingest, _, recorder = make_ingest()
    ingest.process_block(b"\n" + GOOD[0] + b"\n\n" + GOOD[1] + b"\n")
    ingest.process_block(b"")
    ingest.process_block(b"\n\n")
    assert recorder.calls == [("added", "ns/a", "10", False), ("updated", "ns/a", "10", "11")]
    assert ingest.counters.skipped["malformed"] == 0 and not caplog.records
