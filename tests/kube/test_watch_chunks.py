"""A watch body through the reflector, whatever its chunking: one chunk or one chunk per line, a chunk
ending mid-line, a malformed line amid good ones, an oversized line after good ones. The outcome (handler
calls, resourceVersion, counters, logs) must not depend on how the bytes were cut.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.informer_fakes import obj, running
from tests.support.informer_rig import Rig, line, page


def nonzero(counts: Any) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


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


async def test_lines_then_an_oversized_line_in_one_chunk() -> None:
    # max_object_bytes is 4 MiB by default: the lines before the oversized one are applied, then relist.
    big = b'{"type":"ADDED","object":{"x":"' + b"y" * (4 * 1024 * 1024 + 10)
    result = await watch_outcome(
        [b"".join(ln + b"\n" for ln in LINES[:5]) + big[:1000], big[1000:] + b'"}}\n']
    )
    calls, _, skipped, relists, _ = result
    assert [call[1] for call in calls[:5]] == [f"ns/j{i}" for i in range(5)]
    assert skipped == {"too_large": 1} and relists.get("oversized_line") == 1


async def test_a_chunk_ending_with_a_partial_line_completes_with_the_next_chunk() -> None:
    body = b"".join(ln + b"\n" for ln in LINES[:3])
    partial = LINES[3][:20]
    result = await watch_outcome([body + partial, LINES[3][20:] + b"\n" + LINES[4] + b"\n"])
    assert [call[1] for call in result[0]] == [f"ns/j{i}" for i in range(5)] and result[1] == "14"


async def test_a_malformed_line_in_a_chunk_is_skipped_once(caplog: pytest.LogCaptureFixture) -> None:
    chunk = b"".join(ln + b"\n" for ln in [*LINES[:3], b"{not json", *LINES[3:6]])
    calls, rv, skipped, _, _ = await watch_outcome([chunk])
    assert len(calls) == 6 and rv == "15" and skipped == {"malformed": 1}
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 1


async def test_a_line_nested_deeper_than_the_recursion_limit() -> None:
    # The typed decoder raises RecursionError: retried under a higher limit, then skipped as malformed.
    deep = b'{"type":"ADDED","object":' + b"[" * 5000 + b"]" * 5000 + b"}"
    calls, rv, skipped, _, _ = await watch_outcome(
        [b"".join(ln + b"\n" for ln in [LINES[0], deep, LINES[1]])]
    )
    assert [call[1] for call in calls] == ["ns/j0", "ns/j1"] and rv == "11" and skipped == {"malformed": 1}
