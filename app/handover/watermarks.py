"""The hand-over watermark in the Lease: its annotation format, and what a replica publishes and takes
over from (docs/leadership.md, "The hand-over watermark").

Watermarks are kept per TrainJob watch stream ("" for one watch over all namespaces, else a namespace),
because resourceVersions are ordered within one watch only. The annotation is the bare number for the
single stream and a JSON object by namespace otherwise.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from app.kube.lease import LeaseRecord

__all__ = [
    "WATERMARK_ANNOTATION",
    "LeaseWatermarks",
    "Watermarks",
    "format_watermarks",
    "max_watermarks",
    "parse_watermarks",
]

log = logging.getLogger(__name__)

WATERMARK_ANNOTATION = "trainer-metrics.kubeflow.org/watermark"

Watermarks = dict[str, int]  # per watch stream: "" (all namespaces) or a namespace name


def format_watermarks(watermarks: Mapping[str, int]) -> str:
    """One stream: the bare resourceVersion; several: a JSON object by namespace."""
    if set(watermarks) == {""}:
        return str(watermarks[""])
    return json.dumps(watermarks, sort_keys=True, separators=(",", ":"))


def parse_watermarks(annotations: Mapping[str, str]) -> Watermarks | None:
    """The watermarks in a Lease's annotations; None when absent or malformed (logged)."""
    raw = annotations.get(WATERMARK_ANNOTATION)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, int) and not isinstance(value, bool):
        return {"": value}
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
    ):
        return value
    log.warning("ignoring malformed hand-over watermark %r in the Lease", raw[:64])
    return None


def max_watermarks(a: Mapping[str, int], b: Mapping[str, int]) -> Watermarks:
    """Per stream, the higher of two watermarks (a stream in either)."""
    return {stream: max(a.get(stream, -1), b.get(stream, -1)) for stream in a.keys() | b.keys()}


class LeaseWatermarks:
    """What one replica has seen of the watermarks in the Lease, and the policy built on it: which
    watermarks to publish and which floor to take over from."""

    def __init__(self, identity: str) -> None:
        self._identity = identity
        self._seen: Watermarks | None = None  # per stream, the highest seen in the Lease
        self._seen_other_leader = False  # a Lease record held by another replica was seen

    def observe(self, record: LeaseRecord) -> None:
        """Every Lease record read (the elector's ``on_observed``, and the first read before running)."""
        if record.holder_identity and record.holder_identity != self._identity:
            self._seen_other_leader = True
        watermarks = parse_watermarks(record.annotations)
        if watermarks is None:
            return
        seen = self._seen if self._seen is not None else {}
        for stream, rv in watermarks.items():
            if rv > seen.get(stream, -1):
                seen[stream] = rv
        self._seen = seen

    @property
    def seen(self) -> Watermarks:
        """Per stream, the highest watermark seen in the Lease (empty: none). ``takeover_floor`` never
        returns less for a stream named here, so the journal may forget what lies at or below it."""
        return dict(self._seen) if self._seen is not None else {}

    def annotations(self, own: Mapping[str, int]) -> dict[str, str]:
        """The Lease annotations to write, given this replica's own (``CountJournal.watermarks``)."""
        # Never publish less than the Lease has said: a replica that led before and takes the Lease again
        # still holds its old term's watermark when the acquiring write is built (start_leading runs after
        # it), and writing that would let the next takeover recount what the leaders in between counted.
        watermarks = max_watermarks(own, self._seen or {})
        return {WATERMARK_ANNOTATION: format_watermarks(watermarks)} if watermarks else {}

    def takeover_floor(self, previous: LeaseRecord | None) -> Watermarks | int | None:
        """The resourceVersion up to which the previous leader counted, for ``CountJournal.start_leading``.

        The record we took over says it; if its watermark is missing or unreadable, the highest one
        seen in the Lease while following is the best knowledge. With none at all: 0 (count all we
        remember) when no other replica was ever seen holding the Lease, since then nobody else counted;
        otherwise None (unknown: count only from now on) rather than recount another leader's events.
        """
        if previous is not None:
            watermarks = parse_watermarks(previous.annotations)
            if watermarks is not None:
                # Every watermark a leader published was counted up to, so a lower value than one seen
                # before (a Lease written by an older version, or restored) must not lower the floor.
                return max_watermarks(watermarks, self._seen or {})
        if self._seen is not None:
            return dict(self._seen)
        return 0 if not self._seen_other_leader else None
