"""The Trainer part's gzip compressed part by part (app/metrics/deflate_parts.py), alone and in a scrape."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence

import pytest

from app.metrics import exposition as exposition_module
from app.metrics.cached_family import Format
from app.metrics.deflate_parts import PartDeflater, deflate
from app.metrics.exposition import MetricsExposition
from app.metrics.telemetry import SelfTelemetry
from app.metrics.trainer_metrics import TrainerMetricState

from .helpers import REF, created


def _inflate(deflated: bytes) -> bytes:
    """A raw deflate segment ended by a sync flush, read as a decoder reads the body's stream."""
    return zlib.decompressobj(-zlib.MAX_WBITS).decompress(deflated)


def _parts(*texts: str) -> list[bytes]:
    return [t.encode() for t in texts]


def test_the_segment_is_the_text() -> None:
    parts = _parts("# HELP a x\n", 'a{k="1"} 1.0\n' * 200, "", 'b{k="2"} 2.0\n' * 300)
    text = b"".join(parts)
    segment = PartDeflater(1).compress(text, parts)
    assert _inflate(segment.deflated) == text
    assert segment.crc == zlib.crc32(text) and segment.source is text


def test_an_unchanged_part_is_not_compressed_again() -> None:
    deflater = PartDeflater(1)
    parts = _parts("header\n", "block one\n" * 100, "block two\n" * 100)
    first = deflater.compress(b"".join(parts), parts)
    changed = [parts[0], parts[1], b"block two, changed\n" * 100]
    assert deflater.missing(changed) == [changed[2]]
    second = deflater.compress(b"".join(changed), changed)
    assert _inflate(second.deflated) == b"".join(changed)
    # The unchanged parts' pieces are the same bytes: the first segment starts with them.
    assert second.deflated[: len(first.deflated) // 2] == first.deflated[: len(first.deflated) // 2]


def test_only_the_latest_texts_pieces_are_kept() -> None:
    deflater = PartDeflater(1)
    old = _parts("a\n" * 50, "b\n" * 50)
    deflater.compress(b"".join(old), old)
    new = [old[0], b"c\n" * 50]
    deflater.compress(b"".join(new), new)
    assert deflater.missing(old) == [old[1]]  # the replaced part's piece went with it
    deflater.clear()
    assert deflater.missing(new) == new


def test_empty_parts_need_no_piece_and_a_repeated_part_is_compressed_once() -> None:
    deflater = PartDeflater(1)
    block = b"x 1.0\n" * 20
    parts = [b"", block, b"", block]
    assert deflater.missing(parts) == [block]
    assert _inflate(deflater.compress(block + block, parts).deflated) == block + block


def test_a_piece_dropped_while_compressing_is_compressed_at_assembly() -> None:
    # Two scrapes at once: the second's text replaced the kept pieces while the first compressed its own
    # missing parts in a worker thread.
    deflater = PartDeflater(1)
    a = _parts("shared\n" * 40, "first\n" * 40)
    deflater.compress(b"".join(a), a)
    first = [a[0], b"first, changed\n" * 40]
    fresh = deflater.missing(first)
    pieces = deflate(fresh, 1)
    other = _parts("other\n" * 40)
    deflater.compress(b"".join(other), other)  # a[0]'s piece is dropped here
    segment = deflater.segment(b"".join(first), first, fresh, pieces)
    assert _inflate(segment.deflated) == b"".join(first)


def test_series_cache_parts_join_to_each_formats_body() -> None:
    state = TrainerMetricState()
    for i in range(300):
        state.on_countable(created(i, ns=f"team-{i % 7}"))
        state.on_jobs_gauge((f"team-{i}", REF, "running"), i)
    for fmt, render in (
        (Format.TEXT, state.render_text),
        (Format.OPENMETRICS, state.render_openmetrics),
        (Format.PROTOBUF, state.render_protobuf),
    ):
        body = render()
        assert b"".join(state.parts(fmt)) == body


async def test_a_scrape_after_a_change_compresses_only_the_changed_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    telemetry = SelfTelemetry()
    state = TrainerMetricState()
    for i in range(6000):  # past the size from which compression moves to a thread
        state.on_jobs_gauge((f"ns-{i}", REF, "running"), 1)
    exposition = MetricsExposition(telemetry.registry)
    exposition.set_trainer_source(state)
    compressed: list[int] = []
    real = exposition_module.deflate

    def counting(parts: Sequence[bytes], level: int) -> list[bytes]:
        compressed.append(sum(map(len, parts)))
        return real(parts, level)

    monkeypatch.setattr(exposition_module, "deflate", counting)
    body, _ = await exposition.build_metrics_response_async(None, "gzip")
    trainer = state.render_text()
    assert gzip.decompress(body).startswith(trainer)
    assert compressed == [len(trainer)]  # the first scrape compresses everything (in a thread)

    state.on_jobs_gauge(("ns-4321", REF, "running"), 7)  # one series, in one block of 64
    compressed.clear()
    body, _ = await exposition.build_metrics_response_async(None, "gzip")
    trainer = state.render_text()
    assert b'kubeflow_trainer_trainjobs{namespace="ns-4321"' in trainer
    assert gzip.decompress(body).startswith(trainer)
    assert len(compressed) == 1 and 0 < compressed[0] < len(trainer) // 50

    compressed.clear()  # nothing changed: the whole segment is reused
    body, _ = await exposition.build_metrics_response_async(None, "gzip")
    assert compressed == [] and gzip.decompress(body).startswith(trainer)
