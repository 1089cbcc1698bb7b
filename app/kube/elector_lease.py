"""The elector's side of the Lease record: what it has seen of it, and since when (``ObservedLease``:
client-go's observedRecord / observedRawRecord / observedTime, validity judged by our own monotonic
clock), and the bodies it writes (``LeaseBodies``).

Its own module because "is the record still in force" is the judgement the safety argument of
app/kube/elector.py rests on; the state it reads is kept, and changed, in one place, apart from the
state machine's phases.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from app.kube.lease import LeaseRecord, MalformedLease, lease_body, parse_lease

__all__ = ["LeaseBodies", "ObservedLease"]

# Logged under the elector's name: a failing annotations provider is the election's business.
log = logging.getLogger("app.kube.elector")

_ABSENT: Any = object()  # observed spec sentinel: nothing observed yet


class ObservedLease:
    """The Lease as last seen (the whole object for its resourceVersion, its parsed record, or that it
    was unreadable) and when its spec last changed by our clock."""

    __slots__ = ("_spec", "deletion_seen", "lease", "malformed", "record", "time")

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self._spec: Any = _ABSENT
        self.record: LeaseRecord | None = None
        self.malformed = False
        self.time = 0.0
        self.deletion_seen = False  # a 404 replaced a record held by someone else (LeaseElector._create)

    def update(self, lease: dict[str, Any] | None, clock: Callable[[], float]) -> MalformedLease | None:
        """Remember ``lease`` (None: absent) as seen now; restart the expiry clock only if its spec
        changed. Returns the parse error when the Lease has just become unreadable, so that the caller
        warns once per unreadable spell, not on every look."""
        spec = None if lease is None else lease.get("spec")
        if self._spec is _ABSENT or spec != self._spec:
            self.time = clock()
            self._spec = copy.deepcopy(spec)
        self.lease = lease
        self.deletion_seen = False
        if lease is None:
            self.record, self.malformed = None, False
            return None
        try:
            self.record, self.malformed = parse_lease(lease), False
        except MalformedLease as exc:
            first = not self.malformed
            self.record, self.malformed = None, True
            return exc if first else None
        return None

    def see_deletion(self, clock: Callable[[], float]) -> None:
        """The Lease is gone (404) while a record held by someone else was last seen: the disappearance
        counts as a change seen now, once, so that record stays in force a whole lease duration more."""
        if not self.deletion_seen:
            self.deletion_seen = True
            self.time = clock()

    def valid_at(self, now: float, unreadable_duration: float) -> bool:
        """client-go isLeaseValid: observedTime + the record's leaseDurationSeconds is still ahead.
        ``unreadable_duration``: what an unreadable record is assumed to say (a normal lease)."""
        if self.record is not None:
            duration: float = self.record.lease_duration_seconds
        elif self.malformed:
            duration = unreadable_duration
        else:
            return False  # no Lease at all
        return self.time + duration > now


class LeaseBodies:
    """The Lease bodies one elector writes: its Lease's name and namespace, and the annotations its
    provider gives (the hand-over watermarks), guarded so that a failing provider never costs the Lease."""

    __slots__ = ("_annotations", "_name", "_namespace")

    def __init__(
        self, name: str, namespace: str, annotations: Callable[[], Mapping[str, str]] | None
    ) -> None:
        self._name = name
        self._namespace = namespace
        self._annotations = annotations

    def body(
        self,
        base: dict[str, Any] | None,
        *,
        holder: str,
        duration: int,
        acquire: datetime,
        renew: datetime,
        transitions: int,
    ) -> dict[str, Any]:
        """``base`` (the object last read, None to create) with this spec and our annotations."""
        return lease_body(
            base,
            name=self._name,
            namespace=self._namespace,
            holder=holder,
            duration=duration,
            acquire=acquire,
            renew=renew,
            transitions=transitions,
            annotations=self._our_annotations(),
        )

    def _our_annotations(self) -> Mapping[str, str] | None:
        if self._annotations is None:
            return None
        try:
            return self._annotations()
        except Exception:
            # A failing watermark provider must not cost us the Lease: write the rest, keep the old value.
            log.exception("lease %s: annotations() failed; keeping the previous ones", self._name)
            return None
