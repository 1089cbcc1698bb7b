"""The ``/metrics`` body: self-telemetry of every replica plus the Trainer metrics while leading.

Content negotiation (``negotiate``): three formats, chosen by the ``Accept`` header's q-values, a tie going
to protobuf, then OpenMetrics, then text:

* protobuf, delimited ``io.prometheus.client.MetricFamily`` (app/metrics/protobuf.py, the Trainer
  histograms as native histograms with their classic buckets): ``application/vnd.google.protobuf`` with
  ``proto=io.prometheus.client.MetricFamily`` and ``encoding=delimited``. Prometheus sends it first
  (q=1, OpenMetrics q=0.8) with ``--enable-feature=native-histograms`` (2.42), or with ``PrometheusProto``
  first in its ``scrape_protocols`` (2.49+: q=0.6 and down);
* OpenMetrics 1.0: ``application/openmetrics-text`` with no version or version >= 1.0.0 (as
  prometheus_client: 0.0.1 is the old draft, served as text). Prometheus' default, first;
* text 0.0.4: ``text/plain`` (any version), ``*/*`` or ``text/*``, and whatever matches nothing (curl).

A media type with q=0 is refused, and so is one whose q is not an RFC 9110 qvalue (``q=-1``, ``q=abc``,
``q=nan``, ``q=2``): a client that writes a weight we cannot read did not ask for that item with weight 1.
Parameter names and the values of ``proto`` and ``encoding`` compare case-insensitively. The body is
gzip-compressed (level 1: fastest, and metric text still compresses ~20x) when ``Accept-Encoding`` accepts
gzip (``gzip``, ``x-gzip`` or ``*`` with q > 0), and also when it refuses uncompressed bodies
(``identity;q=0``, or ``*;q=0`` without ``identity``) without refusing gzip: gzip is then the one answer it
takes (RFC 9110 §12.5.3).

Body layout: the Trainer part first, then self-telemetry, then (OpenMetrics only) the one ``# EOF``.
The Trainer part comes first so its gzip encoding can be cached: a gzip member is a raw deflate
stream between a header and a CRC-32/size trailer, and a deflate stream may be cut into segments
made by independent compressors as long as each but the last ends on a byte-aligned sync flush.
The Trainer segment, the CRC-32 and the length of the Trainer bytes are kept until the Trainer text changes
(keyed on the identity of its parts tuple, app/metrics/series_cache.py); a scrape then compresses only the
few kilobytes of self-telemetry and continues the CRC from the cached value (a CRC can be continued over
appended data, not prepended data: hence the order). When the Trainer text changed, only its changed parts
are compressed again (app/metrics/deflate_parts.py): the segment is made of a piece per family header and
block, kept while that header or block is unchanged. A gzip scrape reads the Trainer text as those parts
only: it never joins them into one uncompressed body (several MB with many pods watched).

All methods run on the event loop thread. A scrape costs: the Trainer text (its parts, joined only when
uncompressed) from its cache (app/metrics/series_cache.py), the self-telemetry registry (collected every
time, its families re-rendered only when they changed: app/metrics/registry_render.py, ~0.3 ms), and, for
the parts of the Trainer text that changed since the last gzip scrape, compressing them (~3 ms of CPU per
MB at level 1, the largest cost after a sync or a scrape format's first use, for bodies of several MB).
The async variant compresses ``_THREAD_MIN_BYTES`` or more in a worker thread (zlib releases the GIL) while
the loop renders the self-telemetry, so the two overlap on two cores; less is compressed on the loop, where
it costs less than the thread's hand-offs.

Bodies of several MB: glibc hands each freshly allocated multi-MB buffer back to the kernel when it is
freed, so every scrape page-faults the new body in (~3-4 ms per 7 MB measured). Setting
MALLOC_MMAP_THRESHOLD_=33554432 and MALLOC_TRIM_THRESHOLD_=134217728 in the container environment
keeps those buffers in the heap and removes that cost.
"""

from __future__ import annotations

import asyncio
import re
import struct
import zlib
from typing import NamedTuple, Protocol

from prometheus_client import CollectorRegistry

from app.metrics.cached_family import Format
from app.metrics.deflate_parts import LEVEL, DeflatedText, Part, PartDeflater, deflate
from app.metrics.protobuf import CONTENT_TYPE_PROTOBUF
from app.metrics.registry_render import RegistryRenderer, openmetrics_family, protobuf_family, text_family

__all__ = [
    "CONTENT_TYPE_OPENMETRICS",
    "CONTENT_TYPE_PROTOBUF",
    "CONTENT_TYPE_TEXT",
    "Format",
    "MetricsExposition",
    "MetricsResponse",
    "TrainerSource",
    "accepts_gzip",
    "negotiate",
    "wants_openmetrics",
]

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_CONTENT_TYPES = {
    Format.TEXT: CONTENT_TYPE_TEXT,
    Format.OPENMETRICS: CONTENT_TYPE_OPENMETRICS,
    Format.PROTOBUF: CONTENT_TYPE_PROTOBUF,
}
_EOF = b"# EOF\n"
_PROTOBUF_MEDIA = "application/vnd.google.protobuf"
_PROTOBUF_PROTO = "io.prometheus.client.metricfamily"  # compared lower-cased


# gzip member header (RFC 1952): magic, CM=deflate, no flags, MTIME=0 (none), XFL=4 (fastest
# compression), OS=255 (unknown).
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
# Changed Trainer parts this large together are compressed in a worker thread by the async variant, beside
# the self-telemetry's render on the loop; below it (~0.4 ms of zlib) the hand-offs, each waiting for the
# busy loop, cost more than they save.
_THREAD_MIN_BYTES = 128 * 1024
_NO_TRAINER = DeflatedText((), b"", 0, 0)  # a follower's Trainer segment


class TrainerSource(Protocol):
    """What the exposition needs from the Trainer metrics (TrainerMetricState implements it). Each render is
    a served one: a scrape calls exactly one of them."""

    def render_text(self) -> bytes:
        """Text format 0.0.4."""
        ...

    def render_openmetrics(self) -> bytes:
        """OpenMetrics 1.0 families without the final ``# EOF``."""
        ...

    def render_protobuf(self) -> bytes:
        """Delimited protobuf MetricFamily messages."""
        ...

    def render_parts(self, fmt: Format) -> tuple[Part, ...]:
        """The parts whose join is ``fmt``'s body, in order: the same tuple while nothing changed (the gzip
        cache keys on it), the same bytes objects while unchanged (it keeps a piece per part)."""
        ...


class MetricsResponse(NamedTuple):
    body: bytes
    headers: dict[str, str]  # Content-Type, Vary, and Content-Encoding when compressed


def _parse_params(item: str) -> tuple[str, dict[str, str]]:
    media, *params = item.split(";")
    values: dict[str, str] = {}
    for param in params:
        key, sep, value = param.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip().strip('"')
    return media.strip().lower(), values


# RFC 9110 §12.4.2: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


def _q(params: dict[str, str]) -> float:
    """The item's weight; 0 (refused) when its q is not a qvalue."""
    q = params.get("q")
    if q is None:
        return 1.0
    return float(q) if _QVALUE.fullmatch(q) else 0.0


def _version_at_least_1(version: str) -> bool:
    head = version.split(".", 1)[0]
    return head.isdigit() and int(head) >= 1


def _format_of(media: str, params: dict[str, str]) -> Format | None:
    """The format an Accept item asks for, or None (a type we do not serve)."""
    if media == _PROTOBUF_MEDIA:
        proto = params.get("proto", "").lower()
        encoding = params.get("encoding", "").lower()
        return Format.PROTOBUF if proto == _PROTOBUF_PROTO and encoding == "delimited" else None
    if media == "application/openmetrics-text":
        version = params.get("version")
        # Like prometheus_client: no version means the latest; 0.0.1 (old Prometheus) gets text.
        return Format.OPENMETRICS if version is None or _version_at_least_1(version) else None
    if media in ("text/plain", "text/*", "*/*"):
        return Format.TEXT
    return None


def negotiate(accept: str | None) -> Format:
    """The format for an ``Accept`` header: the highest q among those asked for (the module docstring)."""
    if not accept:
        return Format.TEXT
    best: dict[Format, float] = {}
    for item in accept.split(","):
        media, params = _parse_params(item)
        fmt = _format_of(media, params)
        if fmt is not None:
            best[fmt] = max(best.get(fmt, 0.0), _q(params))
    # Ties go to the richer format: protobuf (native histograms), then OpenMetrics (exemplars).
    chosen = max(best.items(), key=lambda kv: (kv[1], kv[0]), default=(Format.TEXT, 0.0))
    return chosen[0] if chosen[1] > 0 else Format.TEXT


def wants_openmetrics(accept: str | None) -> bool:
    """True when ``negotiate`` picks OpenMetrics for ``Accept``."""
    return negotiate(accept) is Format.OPENMETRICS


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when ``Accept-Encoding`` takes gzip: gzip, x-gzip or ``*`` with q > 0, or identity refused and
    gzip not (the module docstring)."""
    if not accept_encoding:
        return False
    gzip: float | None = None  # the weight of gzip as listed (x-gzip is its alias), None: not listed
    identity: float | None = None
    star: float | None = None
    for item in accept_encoding.split(","):
        coding, params = _parse_params(item)
        q = _q(params)
        if coding in ("gzip", "x-gzip"):
            gzip = max(gzip or 0.0, q)
        elif coding == "identity":
            identity = q
        elif coding == "*":
            star = q
    if gzip is None:
        gzip = star
    if gzip is not None:
        return gzip > 0
    # gzip not named, not even by "*": still the only answer left when uncompressed is refused.
    identity_refused = identity == 0 or (identity is None and star == 0)
    return identity_refused and star is None


class MetricsExposition:
    """Builds ``/metrics`` responses from the self-telemetry registry and the leader-only Trainer source.

    ``set_trainer_source(state)`` when this replica starts leading, ``set_trainer_source(None)`` when it
    stops: the very next response includes, or no longer includes, the Trainer metrics.
    """

    def __init__(self, registry: CollectorRegistry, *, gzip_level: int = LEVEL) -> None:
        if not 1 <= gzip_level <= 9:
            raise ValueError("gzip_level must be within 1..9")
        # Self-telemetry per format, each family's bytes kept while it is unchanged (registry_render.py).
        self._self_renderers = {
            Format.TEXT: RegistryRenderer(registry, text_family),
            Format.OPENMETRICS: RegistryRenderer(registry, openmetrics_family),
            Format.PROTOBUF: RegistryRenderer(registry, protobuf_family),
        }
        self._gzip_level = gzip_level
        self._source: TrainerSource | None = None
        self._segments: dict[Format, DeflatedText] = {}  # by format, for the current source
        self._deflaters = {fmt: PartDeflater(gzip_level) for fmt in Format}

    @property
    def trainer_source(self) -> TrainerSource | None:
        return self._source

    def set_trainer_source(self, source: TrainerSource | None) -> None:
        self._source = source
        self._segments.clear()
        for deflater in self._deflaters.values():
            deflater.clear()

    def build_metrics_response(self, accept: str | None, accept_encoding: str | None) -> MetricsResponse:
        """The response for one scrape, built synchronously (compression included)."""
        return self._build(negotiate(accept), accepts_gzip(accept_encoding))

    async def build_metrics_response_async(
        self, accept: str | None, accept_encoding: str | None
    ) -> MetricsResponse:
        """Like :meth:`build_metrics_response`, compressing a changed Trainer part in a worker thread while
        the loop renders the self-telemetry (zlib releases the GIL: the two run on two cores at once)."""
        fmt, gzip = negotiate(accept), accepts_gzip(accept_encoding)
        source = self._source
        if not gzip or source is None:
            return self._build(fmt, gzip)
        parts = source.render_parts(fmt)
        segment = self._cached_segment(fmt, parts)
        if segment is not None:
            return self._finish_gzip(fmt, segment)
        deflater = self._deflaters[fmt]
        fresh = deflater.missing(parts)
        # A loop turn between the Trainer part's render, its compression and the self-telemetry's render:
        # timers and probes due meanwhile run (ingestion does not: the caller's urgent section holds it),
        # so the loop is held for one of them at a time.
        if sum(map(len, fresh)) >= _THREAD_MIN_BYTES:
            # The parts are immutable bytes: the loop may change the state meanwhile, safely.
            compressing = asyncio.ensure_future(asyncio.to_thread(deflate, fresh, self._gzip_level))
            await asyncio.sleep(0)
            tail = self._self_part(fmt)
            pieces = await compressing
        else:
            await asyncio.sleep(0)
            pieces = deflate(fresh, self._gzip_level)
            await asyncio.sleep(0)
            tail = self._self_part(fmt)
        if self._source is not source:
            # Leadership changed meanwhile: answer for the new situation (a follower must not serve
            # Trainer metrics rendered a moment ago as leader).
            return self._build(fmt, True)
        segment = deflater.segment(parts, fresh, pieces)
        return self._finish_gzip(fmt, self._store_segment(fmt, segment), tail)

    # --- internals ---------------------------------------------------------------------------------

    def _build(self, fmt: Format, gzip: bool) -> MetricsResponse:
        """The response built on the calling thread."""
        if not gzip:
            return self._finish(fmt, self._trainer_part(fmt))
        return self._finish_gzip(fmt, self._trainer_segment(fmt))

    def _trainer_segment(self, fmt: Format) -> DeflatedText:
        source = self._source
        if source is None:
            return _NO_TRAINER
        parts = source.render_parts(fmt)
        segment = self._cached_segment(fmt, parts)
        if segment is None:
            segment = self._store_segment(fmt, self._deflaters[fmt].compress(parts))
        return segment

    def _trainer_part(self, fmt: Format) -> bytes:
        source = self._source
        if source is None:
            return b""
        if fmt is Format.PROTOBUF:
            return source.render_protobuf()
        return source.render_openmetrics() if fmt is Format.OPENMETRICS else source.render_text()

    def _self_part(self, fmt: Format) -> bytes:
        body = self._self_renderers[fmt].render()
        # OpenMetrics ends with the body's one "# EOF": the self part is last (see the module docstring).
        return body + _EOF if fmt is Format.OPENMETRICS else body

    def _cached_segment(self, fmt: Format, parts: tuple[Part, ...]) -> DeflatedText | None:
        # By identity: a changed text is a new tuple, and the segment keeps its own alive.
        cached = self._segments.get(fmt)
        if cached is not None and cached.source is parts:
            return cached
        return None

    def _store_segment(self, fmt: Format, segment: DeflatedText) -> DeflatedText:
        self._segments[fmt] = segment
        return segment

    def _finish(self, fmt: Format, trainer: bytes) -> MetricsResponse:
        # Self-telemetry (and # EOF): fresh on every scrape.
        return MetricsResponse(trainer + self._self_part(fmt), self._headers(fmt))

    def _finish_gzip(self, fmt: Format, segment: DeflatedText, tail: bytes | None = None) -> MetricsResponse:
        if tail is None:
            tail = self._self_part(fmt)
        compressor = zlib.compressobj(self._gzip_level, zlib.DEFLATED, -zlib.MAX_WBITS)
        last = compressor.compress(tail) + compressor.flush(zlib.Z_FINISH)
        crc = zlib.crc32(tail, segment.crc)
        size = (segment.size + len(tail)) & 0xFFFFFFFF
        body = b"".join((_GZIP_HEADER, segment.deflated, last, struct.pack("<II", crc, size)))
        headers = self._headers(fmt)
        headers["Content-Encoding"] = "gzip"
        return MetricsResponse(body, headers)

    @staticmethod
    def _headers(fmt: Format) -> dict[str, str]:
        return {"Content-Type": _CONTENT_TYPES[fmt], "Vary": "Accept, Accept-Encoding"}
