"""The elector's interface: its configuration (with the checks that make the safety argument of
app/kube/elector.py hold), the callbacks it drives, and the status it reports.

Its own module because these are what callers (app/replica/service.py, app/api/views.py) build and read, while
the state machine in app/kube/elector.py is what they never look inside. Generic like all of app/kube:
no Settings, no Trainer names.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from app.kube.lease import LeaseRecord

__all__ = ["JITTER_FACTOR", "ElectorConfig", "ElectorStatus", "LeaderCallbacks", "safe_call"]

# Callback failures are logged under the elector's name: they are the election's business.
log = logging.getLogger("app.kube.elector")

JITTER_FACTOR = 1.2  # client-go's JitterUntil factor for the acquire loop


@dataclass(frozen=True, slots=True)
class ElectorConfig:
    lease_name: str
    lease_namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        # The client-go checks: they are what makes "stop before takeover" hold (the safety argument in
        # app/kube/elector.py's docstring).
        for name in ("lease_name", "lease_namespace", "identity"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        for name in ("lease_duration", "renew_deadline", "retry_period"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError("renew_deadline must be greater than 1.2 * retry_period")

    @property
    def lease_duration_seconds(self) -> int:
        """What we write into the Lease: whole seconds, rounded up so followers never wait *less*."""
        return max(1, math.ceil(self.lease_duration))


class LeaderCallbacks(Protocol):
    def on_started_leading(self, previous: LeaseRecord | None) -> None:
        """Synchronous and quick. ``previous``: the record we took over (None if we created the Lease)."""
        ...

    def on_stopped_leading(self) -> None:
        """Called at once when leadership is lost or given up, before any release request."""
        ...

    def on_new_leader(self, identity: str | None) -> None:
        """The observed holder changed (our own identity included); None = no holder / no Lease."""
        ...


@dataclass(frozen=True, slots=True)
class ElectorStatus:
    identity: str
    is_leader: bool
    holder: str | None  # as last observed in the Lease; None = free, absent, or unreadable
    lease_name: str
    lease_namespace: str
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int | None
    annotations: Mapping[str, str] = field(default_factory=dict)
    transitions_seen: int = 0  # leadership changes of this replica (became leader / stopped leading)
    last_change: datetime | None = None  # wall time of the last change of is_leader or of the observed holder


def safe_call(name: str, fn: Callable[..., None], *args: Any) -> None:
    # Callbacks belong to other layers; their bugs must not break the election (or leave it half-done).
    try:
        fn(*args)
    except Exception:
        log.exception("leader election callback %s failed", name)
