"""The Prometheus protobuf exposition (delimited ``io.prometheus.client.MetricFamily``), encoded by hand.

Why by hand: prometheus-client cannot produce it, and the ``protobuf`` runtime would be a dependency of a
few hundred kilobytes for what is a handful of varints and length-prefixed fields. The wire format is
small: a field is a key (field number << 3 | wire type) and then a varint (wire type 0), eight bytes of a
little-endian double (1), or a varint length and that many bytes (2: strings and sub-messages). A body is
a sequence of MetricFamily messages, each preceded by its length as a varint (``encoding=delimited``).

Fields are written in field-number order and default values (0, "", empty) are left out, which is what
a proto3 serializer writes: tests/metrics/test_protobuf.py compares these bytes with the ``protobuf``
library's serialization of the same messages (metrics.proto as Prometheus 2.42 parses it, proto3), so
"what Prometheus reads" is checked byte for byte, not only decoded.

Per-series chunks: a MetricFamily is its header fields (name, help, type) followed by its metrics, each
one field 4 (``metric_field``), so a series' chunk is a complete field that the cached-series engine
(app/metrics/cached_family.py) keeps and joins exactly as it does text lines; ``delimited`` puts the family's
length in front. This module also encodes a prometheus_client registry (the self-telemetry, a few
kilobytes, encoded per scrape as its text is).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence, Sized
from enum import IntEnum
from itertools import groupby
from typing import TypeVar

from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar as ClientExemplar

__all__ = [
    "CONTENT_TYPE_PROTOBUF",
    "MetricType",
    "delimited",
    "encode_client_exemplar",
    "encode_registry",
    "family_header",
    "field_bytes",
    "field_double",
    "field_varint",
    "label_pairs",
    "metric_field",
    "timestamp",
    "varint",
    "zigzag",
]

CONTENT_TYPE_PROTOBUF = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)

_DOUBLE = struct.Struct("<d")


class MetricType(IntEnum):
    """``io.prometheus.client.MetricType``."""

    COUNTER = 0
    GAUGE = 1
    SUMMARY = 2
    UNTYPED = 3
    HISTOGRAM = 4
    GAUGE_HISTOGRAM = 5


# Field numbers of metrics.proto used outside this module (Metric's value fields).
METRIC_GAUGE = 2
METRIC_COUNTER = 3
METRIC_SUMMARY = 4
METRIC_UNTYPED = 5
METRIC_HISTOGRAM = 7

# Varints below 128 are one byte: precomputed, they are most lengths and counts.
_SMALL = [bytes((i,)) for i in range(128)]


def varint(n: int) -> bytes:
    """An unsigned varint (``n`` >= 0): seven bits a byte, least significant first."""
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> int:
    """sint32/sint64 encoding: 0, -1, 1, -2 ... as 0, 1, 2, 3 ..."""
    return n << 1 if n >= 0 else (-n << 1) - 1


def field_varint(field: int, n: int) -> bytes:
    """A varint field; nothing for 0 (the default). ``n`` must be >= 0."""
    if not n:
        return b""
    return _SMALL[field << 3] + varint(n)


def field_double(field: int, x: float) -> bytes:
    """A double field; nothing for +0.0 (the default: -0.0 has a sign bit and is written)."""
    if x == 0.0 and math.copysign(1.0, x) > 0:
        return b""
    return _SMALL[(field << 3) | 1] + _DOUBLE.pack(x)


def field_bytes(field: int, data: bytes) -> bytes:
    """A length-delimited field (a string or a sub-message), written even when empty: a sub-message's
    presence is information (an empty Counter is a counter at 0)."""
    return _SMALL[(field << 3) | 2] + varint(len(data)) + data


def field_string(field: int, text: str) -> bytes:
    """A string field; nothing for "" (the default)."""
    if not text:
        return b""
    return field_bytes(field, text.encode("utf-8", "replace"))


def label_pair(name: str, value: str) -> bytes:
    """One ``LabelPair`` as field 1 of its parent (Metric or Exemplar). An empty value is left out, as a
    proto3 serializer does; Prometheus drops an empty label either way."""
    return field_bytes(1, field_string(1, name) + field_string(2, value))


def label_pairs(pairs: Iterable[tuple[str, str]]) -> bytes:
    """Label pairs in the order given (the callers sort them by name, as client_golang does)."""
    return b"".join(label_pair(name, value) for name, value in pairs)


def timestamp(seconds: float) -> bytes:
    """A ``google.protobuf.Timestamp`` message for epoch ``seconds`` (Prometheus keeps milliseconds)."""
    whole = math.floor(seconds)
    nanos = min(round((seconds - whole) * 1e9), 999_999_999)
    return field_varint(1, whole) + field_varint(2, nanos)


def family_header(name: str, documentation: str, mtype: MetricType) -> bytes:
    """The MetricFamily fields before its metrics: name, help, type."""
    return field_string(1, name) + field_string(2, documentation) + field_varint(3, int(mtype))


def metric_field(metric: bytes) -> bytes:
    """One Metric as field 4 of its MetricFamily: a series' chunk."""
    return field_bytes(4, metric)


_P = TypeVar("_P", bound=Sized)  # a chunk: bytes, or one kept compressed whose len() is its text's


def delimited(header: bytes, chunks: Sequence[_P]) -> list[bytes | _P]:
    """One MetricFamily with its length in front, as parts to join (the chunks are not copied here; their
    ``len`` is their encoded length, compressed ones included)."""
    size = len(header) + sum(len(c) for c in chunks)
    return [varint(size), header, *chunks]


# --- a prometheus_client registry (the self-telemetry) ------------------------------------------------------


def encode_client_exemplar(exemplar: ClientExemplar) -> bytes:
    """An ``Exemplar`` message from a prometheus_client exemplar."""
    ts = exemplar.timestamp
    out = label_pairs(sorted(exemplar.labels.items())) + field_double(2, float(exemplar.value))
    if ts is not None:
        out += field_bytes(3, timestamp(float(ts)))
    return out


def _scalar(field: int, value: float, exemplar: ClientExemplar | None = None) -> bytes:
    inner = field_double(1, float(value))
    if exemplar is not None:
        inner += field_bytes(2, encode_client_exemplar(exemplar))
    return field_bytes(field, inner)


def _labels_of(labels: dict[str, str], drop: str = "") -> bytes:
    return label_pairs(sorted((k, v) for k, v in labels.items() if k != drop))


_Samples = Sequence[tuple[str, dict[str, str], float, ClientExemplar | None]]


def _histogram(samples: _Samples, name: str) -> bytes:
    count = 0.0
    total = 0.0
    buckets: list[bytes] = []
    for sample_name, labels, value, exemplar in samples:
        if sample_name == name + "_bucket":
            bucket = field_varint(1, int(value)) + field_double(2, float(labels["le"]))
            if exemplar is not None:
                bucket += field_bytes(3, encode_client_exemplar(exemplar))
            buckets.append(field_bytes(3, bucket))
        elif sample_name in (name + "_count", name + "_gcount"):
            count = value
        elif sample_name in (name + "_sum", name + "_gsum"):
            total = value
    return field_varint(1, int(count)) + field_double(2, float(total)) + b"".join(buckets)


def _summary(samples: _Samples, name: str) -> bytes:
    count = 0.0
    total = 0.0
    quantiles: list[bytes] = []
    for sample_name, labels, value, _ in samples:
        if sample_name == name and "quantile" in labels:
            quantile = field_double(1, float(labels["quantile"])) + field_double(2, float(value))
            quantiles.append(field_bytes(3, quantile))
        elif sample_name == name + "_count":
            count = value
        elif sample_name == name + "_sum":
            total = value
    return field_varint(1, int(count)) + field_double(2, float(total)) + b"".join(quantiles)


def encode_registry(registry: Collector) -> bytes:
    """Every metric family of ``registry`` as delimited MetricFamily messages (empty families left out, as
    client_golang's gatherer leaves them out). Counters are named with ``_total`` (the protobuf family name
    is the sample name); ``_created`` samples are not encoded; info and stateset families become gauges."""
    out: list[bytes] = []
    for metric in registry.collect():
        mtype = metric.type
        if mtype == "counter":
            header = family_header(metric.name + "_total", metric.documentation, MetricType.COUNTER)
            chunks = [
                metric_field(_labels_of(s.labels) + _scalar(METRIC_COUNTER, s.value, s.exemplar))
                for s in metric.samples
                if s.name == metric.name + "_total"
            ]
        elif mtype in ("gauge", "info", "stateset", "unknown"):
            name = metric.name + "_info" if mtype == "info" else metric.name
            untyped = mtype == "unknown"
            kind = MetricType.UNTYPED if untyped else MetricType.GAUGE
            field = METRIC_UNTYPED if untyped else METRIC_GAUGE
            header = family_header(name, metric.documentation, kind)
            chunks = [metric_field(_labels_of(s.labels) + _scalar(field, s.value)) for s in metric.samples]
        elif mtype in ("histogram", "gaugehistogram", "summary"):
            drop = "quantile" if mtype == "summary" else "le"
            kind = {
                "histogram": MetricType.HISTOGRAM,
                "gaugehistogram": MetricType.GAUGE_HISTOGRAM,
                "summary": MetricType.SUMMARY,
            }[mtype]
            header = family_header(metric.name, metric.documentation, kind)
            # One Metric per label set (without le / quantile), in the order the samples come.
            plain = [(s.name, s.labels, s.value, s.exemplar) for s in metric.samples]
            chunks = []
            for labels, group in groupby(plain, key=lambda s: _labels_of(s[1], drop)):
                samples = list(group)
                if mtype == "summary":
                    body = field_bytes(METRIC_SUMMARY, _summary(samples, metric.name))
                else:
                    body = field_bytes(METRIC_HISTOGRAM, _histogram(samples, metric.name))
                chunks.append(metric_field(labels + body))
        else:  # pragma: no cover - prometheus_client has no other type
            continue
        if chunks:
            out.extend(delimited(header, chunks))
    return b"".join(out)
