"""LineSplitter: a chunked watch body into lines, whatever the chunk boundaries, none above the cap."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.kube.lines import LineSplitter


def split(chunks: list[bytes], max_bytes: int = 1024) -> tuple[list[bytes], bool]:
    splitter = LineSplitter(max_bytes)
    out: list[bytes] = []
    for chunk in chunks:
        lines, oversized = splitter.feed(chunk)
        out += [bytes(line) for line in lines]
        if oversized:
            return out, True
    return out, False


def test_lines_within_and_across_chunks() -> None:
    assert split([b'{"a":1}\n{"b":2}\n']) == ([b'{"a":1}', b'{"b":2}'], False)
    assert split([b'{"a"', b":1", b'}\n{"b":2', b"}\n"]) == ([b'{"a":1}', b'{"b":2}'], False)
    assert split([b"x", b"\n", b"\n\ny\n"]) == ([b"x", b"y"], False)  # empty lines are dropped
    assert split([b"no newline yet"]) == ([], False)  # an unfinished line is held back


def test_a_line_continued_by_a_chunk_that_ends_it_at_once() -> None:
    splitter = LineSplitter(100)
    assert splitter.feed(b"abc") == ([], False)
    lines, oversized = splitter.feed(b"\ndef\n")
    assert [bytes(x) for x in lines] == [b"abc", b"def"] and not oversized


@pytest.mark.parametrize(
    ("chunks", "before"),
    [
        ([b"ok\n" + b"x" * 11 + b"\nnot reached\n"], [b"ok"]),  # a whole long line in one chunk
        ([b"ok\nxxxxxx", b"xxxxxx"], [b"ok"]),  # the held-back tail grows past the cap
        ([b"xxxxxxxx", b"xxxx\nok\n"], []),  # the line completed by the next chunk is too long
        ([b"x" * 10 + b"\n"], [b"x" * 10]),  # exactly at the cap is fine
    ],
)
def test_a_line_above_the_cap_stops_the_stream_after_the_lines_before_it(
    chunks: list[bytes], before: list[bytes]
) -> None:
    lines, oversized = split(chunks, max_bytes=10)
    assert lines == before
    assert oversized == (chunks != [b"x" * 10 + b"\n"])


@given(
    st.lists(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b), max_size=12),
    st.lists(st.integers(0, 600), max_size=10),
)
def test_chunk_boundaries_do_not_change_the_lines(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points) if b > a]
    assert split(chunks) == (lines, False)
