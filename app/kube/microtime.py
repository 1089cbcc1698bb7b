"""Kubernetes ``metav1.MicroTime``: RFC 3339 in UTC with exactly six fractional digits.

The API server decodes MicroTime with one fixed Go layout, so "…:05Z" or "…:05.123Z" is rejected with a
400 (docs/design/k8s-protocol.md §4). ``datetime.isoformat()`` drops the fraction when
``microsecond == 0``, which is why we always format explicitly with ``%f``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

# The layout the server accepts: 6 fractional digits, then "Z" or a ±hh:mm offset.
_MICROTIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(?:Z|[+-]\d{2}:\d{2})$")


def format_microtime(value: datetime) -> str:
    """Serialize as MicroTime. A naive datetime is taken to be UTC already (never local time)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime(_FORMAT)


def parse_microtime(text: str) -> datetime:
    """Parse a MicroTime (``Z`` or ``+hh:mm`` offset) into an aware UTC datetime; ValueError otherwise."""
    if not isinstance(text, str) or not _MICROTIME_RE.match(text):
        raise ValueError(f"not a MicroTime (want YYYY-MM-DDTHH:MM:SS.ffffffZ): {text!r}")
    # fromisoformat (3.11+) understands "Z" and offsets; the regex above already enforced the 6 digits.
    return datetime.fromisoformat(text).astimezone(UTC)
