"""The label vocabularies every Trainer rule shares, and the name checks that keep junk out of labels.

Its own module because every other rule module reads these values (states, "unknown", "none") and the
bounds of the per-process memo tables, and none of them owns them.
"""

from __future__ import annotations

import re
from typing import Final

# --- label vocabularies ------------------------------------------------------------------------

UNKNOWN: Final = "unknown"
NONE: Final = "none"

SUSPENDED: Final = "suspended"
PENDING: Final = "pending"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"

JOB_STATES: Final = (SUSPENDED, PENDING, RUNNING, SUCCEEDED, FAILED)
RESULTS: Final = (SUCCEEDED, FAILED)

# Label values are capped so that a hand-edited object can never put a huge string in a series.
MAX_LABEL_VALUE: Final = 63  # a Kubernetes label value's own limit
# A namespace is a DNS-1123 label (<= 63 characters).
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A resource name (ResourceList key): [DNS-subdomain prefix "/"] qualified name (<= 63 characters).
_RESOURCE_NAME: Final = re.compile(
    r"(?:([a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*)/)?"
    r"([A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
)
MAX_RESOURCE_NAME: Final = 253 + 1 + 63
# Small per-process memo tables for derivations that repeat across jobs (a handful of runtime refs,
# a few accelerator resource lists, timestamps shared by jobs created in the same second). Bounded:
# cleared when full, so a flood of distinct hostile values costs at most one table of entries.
_MEMO_MAX: Final = 4096
_MAX_MEMO_KEY: Final = 320  # longer strings are never memoised (they are invalid anyway)


def is_dns_label(value: str) -> bool:
    """A DNS-1123 label: what a Kubernetes namespace name must be (lowercase, <= 63 characters)."""
    return len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def is_resource_name(value: str) -> bool:
    """A Kubernetes resource name: ``[prefix/]name``, prefix a DNS subdomain (<= 253), name a qualified
    name (<= 63). Anything else cannot be a real resource and must never become a label value."""
    if len(value) > MAX_RESOURCE_NAME:
        return False
    m = _RESOURCE_NAME.fullmatch(value)
    return m is not None and (m.group(1) is None or len(m.group(1)) <= 253)
