"""``io.prometheus.client`` (metrics.proto) for the ``protobuf`` library, built from its definition at import
time (no protoc, no generated module): the messages exactly as Prometheus 2.42 declares them
(prompb/io/prometheus/client/metrics.proto, proto3), so that decoding with them is decoding as Prometheus
does, and their serialization is what a proto3 encoder writes for the same values."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]

__all__ = ["MetricFamily", "decode_delimited", "encode_delimited", "message"]

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (message, [(field name, number, type, label, type name of a message or enum field)])
_MESSAGES: list[tuple[str, list[tuple[str, int, int, int, str]]]] = [
    ("LabelPair", [("name", 1, _F.TYPE_STRING, _OPTIONAL, ""), ("value", 2, _F.TYPE_STRING, _OPTIONAL, "")]),
    ("Gauge", [("value", 1, _F.TYPE_DOUBLE, _OPTIONAL, "")]),
    (
        "Counter",
        [
            ("value", 1, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("exemplar", 2, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Exemplar"),
        ],
    ),
    (
        "Quantile",
        [("quantile", 1, _F.TYPE_DOUBLE, _OPTIONAL, ""), ("value", 2, _F.TYPE_DOUBLE, _OPTIONAL, "")],
    ),
    (
        "Summary",
        [
            ("sample_count", 1, _F.TYPE_UINT64, _OPTIONAL, ""),
            ("sample_sum", 2, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("quantile", 3, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.Quantile"),
        ],
    ),
    ("Untyped", [("value", 1, _F.TYPE_DOUBLE, _OPTIONAL, "")]),
    (
        "Histogram",
        [
            ("sample_count", 1, _F.TYPE_UINT64, _OPTIONAL, ""),
            ("sample_count_float", 4, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("sample_sum", 2, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("bucket", 3, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.Bucket"),
            ("schema", 5, _F.TYPE_SINT32, _OPTIONAL, ""),
            ("zero_threshold", 6, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("zero_count", 7, _F.TYPE_UINT64, _OPTIONAL, ""),
            ("zero_count_float", 8, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("negative_span", 9, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.BucketSpan"),
            ("negative_delta", 10, _F.TYPE_SINT64, _REPEATED, ""),
            ("negative_count", 11, _F.TYPE_DOUBLE, _REPEATED, ""),
            ("positive_span", 12, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.BucketSpan"),
            ("positive_delta", 13, _F.TYPE_SINT64, _REPEATED, ""),
            ("positive_count", 14, _F.TYPE_DOUBLE, _REPEATED, ""),
        ],
    ),
    (
        "Bucket",
        [
            ("cumulative_count", 1, _F.TYPE_UINT64, _OPTIONAL, ""),
            ("cumulative_count_float", 4, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("upper_bound", 2, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("exemplar", 3, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Exemplar"),
        ],
    ),
    (
        "BucketSpan",
        [("offset", 1, _F.TYPE_SINT32, _OPTIONAL, ""), ("length", 2, _F.TYPE_UINT32, _OPTIONAL, "")],
    ),
    (
        "Exemplar",
        [
            ("label", 1, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.LabelPair"),
            ("value", 2, _F.TYPE_DOUBLE, _OPTIONAL, ""),
            ("timestamp", 3, _F.TYPE_MESSAGE, _OPTIONAL, ".google.protobuf.Timestamp"),
        ],
    ),
    (
        "Metric",
        [
            ("label", 1, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.LabelPair"),
            ("gauge", 2, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Gauge"),
            ("counter", 3, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Counter"),
            ("summary", 4, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Summary"),
            ("untyped", 5, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Untyped"),
            ("histogram", 7, _F.TYPE_MESSAGE, _OPTIONAL, ".io.prometheus.client.Histogram"),
            ("timestamp_ms", 6, _F.TYPE_INT64, _OPTIONAL, ""),
        ],
    ),
    (
        "MetricFamily",
        [
            ("name", 1, _F.TYPE_STRING, _OPTIONAL, ""),
            ("help", 2, _F.TYPE_STRING, _OPTIONAL, ""),
            ("type", 3, _F.TYPE_ENUM, _OPTIONAL, ".io.prometheus.client.MetricType"),
            ("metric", 4, _F.TYPE_MESSAGE, _REPEATED, ".io.prometheus.client.Metric"),
        ],
    ),
]
_METRIC_TYPES = ["COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM"]


def _build() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="io/prometheus/client/metrics.proto",
        package="io.prometheus.client",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    enum = proto.enum_type.add(name="MetricType")
    for number, name in enumerate(_METRIC_TYPES):
        enum.value.add(name=name, number=number)
    for message_name, fields in _MESSAGES:
        msg = proto.message_type.add(name=message_name)
        for name, number, ftype, label, type_name in fields:
            field = msg.field.add(name=name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
    pool.Add(proto)
    return pool


_POOL = _build()


def message(name: str) -> Any:
    """The message class ``io.prometheus.client.<name>``."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"io.prometheus.client.{name}"))


MetricFamily = message("MetricFamily")


def decode_delimited(body: bytes) -> list[Any]:
    """A delimited body as MetricFamily messages (as Prometheus' readDelimited reads it)."""
    out = []
    pos = 0
    while pos < len(body):
        size, pos = _DecodeVarint(body, pos)
        family = MetricFamily()
        family.ParseFromString(body[pos : pos + size])
        out.append(family)
        pos += size
    return out


def encode_delimited(families: list[Any]) -> bytes:
    """The protobuf library's serialization of ``families``, delimited."""
    from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

    out = []
    for family in families:
        data = family.SerializeToString()
        out.append(_VarintBytes(len(data)) + data)
    return b"".join(out)
