"""Native (exponential) histogram buckets of one series, and their protobuf fields.

Prometheus' native histograms (served in the protobuf exposition only) have bucket boundaries at the powers
of ``2 ** (2 ** -schema)``: bucket ``i`` holds the observations in ``(base ** (i - 1), base ** i]``. The
choices here (docs/metrics.md, "Native histograms"):

* ``SCHEMA`` 3: each power of two in 8 buckets, a bucket 9.05 % wide (``2 ** (1/8)``), so a quantile is
  known within about 9 % (histogram_quantile interpolates inside the bucket holding the rank) over any
  range, from the seconds of a quick start to the weeks of a pre-training run. Schema 2 would be 19 %,
  schema 4 4.4 % with twice the buckets.
* ``ZERO_THRESHOLD`` 2 ** -128 (client_golang's default): observations with ``|v| <= ZERO_THRESHOLD`` are
  counted in the zero bucket. Every Trainer observation is 0 (a CPU-only job's accelerators, a lifetime
  clamped at 0 under clock skew) or at least a millisecond, so any threshold in between buckets them the
  same; the smallest one keeps histogram_quantile of a series of zeros at ~0 (it interpolates inside the
  zero bucket) and is a bucket boundary of every schema. Being above 0, it also marks the histogram as
  native for Prometheus 2.42 even before its first observation (a series born at zero has none).
* ``BUCKET_LIMIT`` 160 populated buckets per series: at schema 3 that is six decades of distinct values
  (1 s to 11 days with no gap), more than a Trainer histogram spreads over in practice. Beyond it the
  series halves its resolution (schema - 1, each pair of buckets merged) until it fits, as client_golang
  does when its zero bucket may not grow; for the rest of the leader term, since Prometheus reads a
  higher schema as a counter reset and a lower one as none (a new term counts from zero: schema 3 again).

Non-negative observations only (every Trainer histogram's; app/metrics/trainer_metrics.py clamps): a negative
one would land in the zero bucket.
"""

from __future__ import annotations

import math
from bisect import bisect_left

from app.metrics import protobuf as pb

__all__ = ["BUCKET_LIMIT", "MIN_SCHEMA", "SCHEMA", "ZERO_THRESHOLD", "NativeBuckets", "bucket_index"]

SCHEMA = 3
ZERO_THRESHOLD = 2.0**-128
BUCKET_LIMIT = 160
MIN_SCHEMA = -4  # the lowest schema Prometheus accepts

# Per schema > 0: the upper bounds of the buckets within [0.5, 1), the fractions math.frexp returns
# (client_golang's nativeHistogramBounds): 0.5 * 2 ** (j / 2 ** schema).
_BOUNDS = {s: [math.ldexp(2.0 ** (j / 2**s), -1) for j in range(2**s)] for s in range(1, 9)}

# Empty buckets between two populated ones up to which one span continues (with zero deltas) instead of a
# new span starting: a span costs two varints, an empty bucket one byte (client_golang's choice too).
_MAX_GAP = 2

_ZERO_THRESHOLD_FIELD = pb.field_double(6, ZERO_THRESHOLD)


def bucket_index(value: float, schema: int) -> int:
    """The index of the bucket ``value`` (> 0) falls in, as Prometheus and client_golang compute it."""
    frac, exp = math.frexp(value)
    if schema > 0:
        bounds = _BOUNDS[schema]
        return bisect_left(bounds, frac) + (exp - 1) * len(bounds)
    key = exp - 1 if frac == 0.5 else exp
    return (key + (1 << -schema) - 1) >> -schema


class NativeBuckets:
    """One series' native buckets: schema, zero count and counts by bucket index."""

    __slots__ = ("buckets", "schema", "zero")

    def __init__(self) -> None:
        self.schema = SCHEMA
        self.zero = 0
        self.buckets: dict[int, int] = {}

    def observe(self, value: float) -> None:
        if value <= ZERO_THRESHOLD:
            self.zero += 1
            return
        index = bucket_index(value, self.schema)
        buckets = self.buckets
        if index in buckets:
            buckets[index] += 1
            return
        buckets[index] = 1
        if len(buckets) > BUCKET_LIMIT:
            self._coarsen()

    def _coarsen(self) -> None:
        """Halve the resolution until the buckets fit: bucket i of schema s is within bucket ceil(i / 2) of
        schema s - 1 (whose base is the square of s's)."""
        while len(self.buckets) > BUCKET_LIMIT and self.schema > MIN_SCHEMA:
            merged: dict[int, int] = {}
            for index, count in self.buckets.items():
                half = (index + 1) >> 1
                merged[half] = merged.get(half, 0) + count
            self.buckets = merged
            self.schema -= 1

    def fields(self) -> bytes:
        """The native fields of the ``Histogram`` message (5 schema, 6 zero threshold, 7 zero count, 12
        positive spans, 13 positive deltas, packed), in field order after the classic ones."""
        out = [pb.field_varint(5, pb.zigzag(self.schema)), _ZERO_THRESHOLD_FIELD]
        out.append(pb.field_varint(7, self.zero))
        if self.buckets:
            spans, deltas = self._spans()
            out.extend(spans)
            out.append(pb.field_bytes(13, deltas))
        return b"".join(out)

    def _spans(self) -> tuple[list[bytes], bytes]:
        spans: list[bytes] = []
        deltas = bytearray()
        previous_count = 0
        span_start = span_length = 0
        previous_end = 0  # the index after the previous span (0 before the first: its offset is absolute)
        last: int | None = None
        for index in sorted(self.buckets):
            if last is not None and index - last - 1 <= _MAX_GAP:
                for _ in range(index - last - 1):  # empty buckets inside the span: count 0
                    deltas += pb.varint(pb.zigzag(-previous_count))
                    previous_count = 0
                span_length += index - last
            else:
                if last is not None:
                    spans.append(_span(span_start - previous_end, span_length))
                    previous_end = span_start + span_length
                span_start, span_length = index, 1
            count = self.buckets[index]
            deltas += pb.varint(pb.zigzag(count - previous_count))
            previous_count = count
            last = index
        if last is not None:
            spans.append(_span(span_start - previous_end, span_length))
        return spans, bytes(deltas)


def _span(offset: int, length: int) -> bytes:
    return pb.field_bytes(12, pb.field_varint(1, pb.zigzag(offset)) + pb.field_varint(2, length))
