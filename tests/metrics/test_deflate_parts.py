"""The Trainer part's gzip compressed part by part (app/metrics/deflate_parts.py), alone and in a scrape."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from app.metrics import exposition as exposition_module
from app.metrics.cached_family import Format
from app.metrics.deflate_parts import DeflatedPart, Part, PartDeflater, crc32_after, deflate, join_parts
from app.metrics.exposition import CONTENT_TYPE_PROTOBUF, MetricsExposition
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
    segment = PartDeflater(1).compress(parts)
    assert _inflate(segment.deflated) == text
    assert segment.crc == zlib.crc32(text) and segment.size == len(text) and segment.source is parts


@pytest.mark.parametrize("size", [0, 1, 1000, 64 * 1024, 200_000])
def test_a_compressed_part_appends_its_crc_without_its_text(size: int) -> None:
    """crc(A+B) from crc(A) and B's CRC and length (zlib's crc32_combine, by the CRC of as many zeros)."""
    head = b'a{k="1"} 1.0\n' * 50
    text = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    part = DeflatedPart(text)
    assert part.text() == text and len(part) == size
    assert crc32_after(zlib.crc32(head), part) == zlib.crc32(head + text)


def test_compressed_parts_go_into_the_segment_as_they_are() -> None:
    kept = DeflatedPart(b'pod_info{pod="a"} 1.0\n' * 400)
    parts: list[Part] = [b"# HELP a x\n", kept, b'b{k="2"} 2.0\n' * 30, kept]
    text = join_parts(parts)
    deflater = PartDeflater(1)
    assert deflater.missing(parts) == [parts[0], parts[2]]  # nothing to compress for the kept part
    segment = deflater.compress(parts)
    assert _inflate(segment.deflated) == text
    assert segment.crc == zlib.crc32(text) and segment.size == len(text)
    assert segment.deflated.count(kept.piece) == 2


def test_an_unchanged_part_is_not_compressed_again() -> None:
    deflater = PartDeflater(1)
    parts = _parts("header\n", "block one\n" * 100, "block two\n" * 100)
    first = deflater.compress(parts)
    changed = [parts[0], parts[1], b"block two, changed\n" * 100]
    assert deflater.missing(changed) == [changed[2]]
    second = deflater.compress(changed)
    assert _inflate(second.deflated) == b"".join(changed)
    # The unchanged parts' pieces are the same bytes: the first segment starts with them.
    assert second.deflated[: len(first.deflated) // 2] == first.deflated[: len(first.deflated) // 2]


def test_only_the_latest_texts_pieces_are_kept() -> None:
    deflater = PartDeflater(1)
    old = _parts("a\n" * 50, "b\n" * 50)
    deflater.compress(old)
    new = [old[0], b"c\n" * 50]
    deflater.compress(new)
    assert deflater.missing(old) == [old[1]]  # the replaced part's piece went with it
    deflater.clear()
    assert deflater.missing(new) == new


def test_empty_parts_need_no_piece_and_a_repeated_part_is_compressed_once() -> None:
    deflater = PartDeflater(1)
    block = b"x 1.0\n" * 20
    parts = [b"", block, b"", block]
    assert deflater.missing(parts) == [block]
    assert _inflate(deflater.compress(parts).deflated) == block + block


def test_a_piece_dropped_while_compressing_is_compressed_at_assembly() -> None:
    # Two scrapes at once: the second's text replaced the kept pieces while the first compressed its own
    # missing parts in a worker thread.
    deflater = PartDeflater(1)
    a = _parts("shared\n" * 40, "first\n" * 40)
    deflater.compress(a)
    first = [a[0], b"first, changed\n" * 40]
    fresh = deflater.missing(first)
    pieces = deflate(fresh, 1)
    other = _parts("other\n" * 40)
    deflater.compress(other)  # a[0]'s piece is dropped here
    segment = deflater.segment(first, fresh, pieces)
    assert _inflate(segment.deflated) == b"".join(first)


def _state_with_jobs(count: int) -> TrainerMetricState:
    state = TrainerMetricState()
    for i in range(count):
        state.on_countable(created(i, ns=f"team-{i % 7}"))
        state.on_jobs_gauge((f"team-{i}", REF, "running"), i)
    return state


def test_series_cache_parts_join_to_each_formats_body() -> None:
    state = _state_with_jobs(300)
    for fmt, render in (
        (Format.TEXT, state.render_text),
        (Format.OPENMETRICS, state.render_openmetrics),
        (Format.PROTOBUF, state.render_protobuf),
    ):
        parts = state.render_parts(fmt)
        assert b"".join(parts) == render()
        assert state.render_parts(fmt) is parts  # unchanged: the same tuple, the gzip cache's key
    state.on_jobs_gauge(("team-1", REF, "running"), 9)
    assert state.render_parts(Format.TEXT) is not parts


_ACCEPT = {
    Format.TEXT: None,
    Format.OPENMETRICS: "application/openmetrics-text",
    Format.PROTOBUF: f"{CONTENT_TYPE_PROTOBUF}; proto=io.prometheus.client.MetricFamily; encoding=delimited",
}


@pytest.mark.parametrize("fmt", list(Format))
async def test_a_gzip_scrape_never_joins_the_trainer_text(fmt: Format) -> None:
    state = _state_with_jobs(3000)  # past the size from which the async variant compresses in a thread
    bodies = state._series._bodies  # the joined bodies: none may be made for a gzip scrape
    served: list[float] = []
    state.add_served_listener(lambda now, _: served.append(now))
    # No self-telemetry: the whole body is the Trainer text (and OpenMetrics' # EOF), stable across scrapes.
    exposition = MetricsExposition(CollectorRegistry())
    exposition.set_trainer_source(state)
    accept = _ACCEPT[fmt]
    for variant in ("sync", "async"):
        state.on_jobs_gauge(("team-1", REF, "running"), len(served))  # a change: compressed again
        for _ in range(2):  # compressed, then from the cached segment
            if variant == "sync":
                body, headers = exposition.build_metrics_response(accept, "gzip")
            else:
                body, headers = await exposition.build_metrics_response_async(accept, "gzip")
            assert headers["Content-Encoding"] == "gzip" and bodies == [None, None, None]
        unpacked = gzip.decompress(body)
        plain, headers = exposition.build_metrics_response(accept, None)
        assert "Content-Encoding" not in headers and bodies[fmt] is not None
        assert unpacked == plain
    assert len(served) == 6  # one served render per scrape, whatever the path


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
