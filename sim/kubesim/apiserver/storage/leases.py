"""Lease (coordination.k8s.io/v1) helpers. The rules the apiserver enforces on Lease writes (MicroTime layout,
int32 fields, leaseDurationSeconds > 0, leaseTransitions >= 0) are in
:mod:`kubesim.apiserver.schema.validation` with the
other kinds' (docs/design/k8s-protocol.md §4)."""

from __future__ import annotations

from datetime import UTC, datetime


def now_micro() -> str:
    """metav1.MicroTime: always exactly six fractional digits (isoformat() drops them at .000000)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
