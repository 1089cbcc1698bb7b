"""EdgeHistory: what TrainerState must remember about a job beyond its current projection, so that time
to running and admission wait are observed once per job (docs/design/product.md §6, invariant 2).

A job's projection says whether it runs (is resumed) *now*. Whether it ran (was resumed) *before* is in no
field the controller writes: a preempted TrainJob and one waiting for its first admission look the same
(Suspended=True, reason Suspended, child Jobs suspended; trainjob_controller.go setSuspendedCondition in
kubeflow/trainer v2.3.0). So this replica remembers it, and the replicas pass it to each other:

- ``ran`` / ``admitted``: live, not terminal jobs this replica saw running (resumed) that are not now.
  A preempted job's next run is not a first one. These hold the few preempted jobs, not the population.
- ``inherited``: the same facts read from the Lease (app/handover/history.py), published by the leader
  that saw them. "It ran" never stops being true, so facts are merged, never replaced. Without them, a
  replica that started while a job was preempted would take the job's next run for its first, and count
  it again once leading. The Lease outlives every replica, so a full restart keeps them too.
- ``tombstones``: a bounded set of recently deleted uids, with what was recorded for each, so that a
  spurious delete + re-add of the same uid does not count its edges again.

Keys are ``TrainJobProjection.uid_key`` values (16 bytes for a UUID). Everything is O(1) per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Final

__all__ = [
    "TOMB_ADMITTED",
    "TOMB_RAN",
    "TOMB_TERMINAL",
    "EdgeHistory",
    "UidKey",
]

UidKey = bytes | str

# What a tombstone remembers of a deleted uid (bits), so that a spurious re-add counts none of it again.
TOMB_TERMINAL: Final = 1  # its terminal edge was recorded
TOMB_RAN: Final = 2  # it was seen running (time to running observed or not observable)
TOMB_ADMITTED: Final = 4  # it was seen resumed (admission wait observed or not observable)


class _BoundedSet:
    """An insertion-ordered set that forgets its oldest members beyond ``limit``: inherited facts come
    from another process, so their number must be bounded here whatever the Lease says."""

    __slots__ = ("_items", "_limit")

    def __init__(self, limit: int) -> None:
        self._items: OrderedDict[UidKey, None] = OrderedDict()
        self._limit = max(0, limit)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[UidKey]:
        return iter(self._items)

    def add(self, key: UidKey) -> None:
        if not self._limit:
            return
        self._items[key] = None
        if len(self._items) > self._limit:
            self._items.popitem(last=False)

    def discard(self, key: UidKey) -> None:
        self._items.pop(key, None)


class EdgeHistory:
    def __init__(self, *, max_tombstones: int = 4096, max_inherited: int = 8192) -> None:
        self.ran: set[UidKey] = set()
        self.admitted: set[UidKey] = set()
        self._inherited_ran = _BoundedSet(max_inherited)
        self._inherited_admitted = _BoundedSet(max_inherited)
        self._tombstones: OrderedDict[UidKey, int] = OrderedDict()
        self._max_tombstones = max(0, max_tombstones)

    # --- queries ---------------------------------------------------------------------------------

    def ran_before(self, uid: UidKey) -> bool:
        return uid in self.ran or uid in self._inherited_ran

    def admitted_before(self, uid: UidKey) -> bool:
        return uid in self.admitted or uid in self._inherited_admitted

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)

    @property
    def inherited(self) -> int:
        return len(self._inherited_ran) + len(self._inherited_admitted)

    # --- transitions -----------------------------------------------------------------------------

    def left_running(self, uid: UidKey) -> None:
        self.ran.add(uid)

    def running_again(self, uid: UidKey) -> None:
        """It runs: its projection says so from now on, and leaving running puts it back in ``ran``."""
        self.ran.discard(uid)
        self._inherited_ran.discard(uid)

    def suspended_again(self, uid: UidKey) -> None:
        self.admitted.add(uid)

    def resumed_again(self, uid: UidKey) -> None:
        self.admitted.discard(uid)
        self._inherited_admitted.discard(uid)

    def terminal(self, uid: UidKey) -> None:
        """The terminal-dedup set guards the job from now on."""
        self.ran.discard(uid)
        self.admitted.discard(uid)
        self._inherited_ran.discard(uid)
        self._inherited_admitted.discard(uid)

    def deleted(self, uid: UidKey, *, terminal: bool, running: bool, resumed: bool) -> None:
        """Forget the job, remembering in a tombstone which of its edges are behind it."""
        tomb = TOMB_TERMINAL if terminal else 0
        if running or self.ran_before(uid):
            tomb |= TOMB_RAN
        if resumed or self.admitted_before(uid):
            tomb |= TOMB_ADMITTED
        self.terminal(uid)
        if self._max_tombstones:
            self._tombstones[uid] = tomb
            if len(self._tombstones) > self._max_tombstones:
                self._tombstones.popitem(last=False)

    def pop_tombstone(self, uid: UidKey) -> int | None:
        """The TOMB_* bits of a deleted uid seen again (and forget them), None if not a recent one."""
        return self._tombstones.pop(uid, None)

    # --- hand-over between replicas --------------------------------------------------------------

    def inherit(self, ran: Iterable[UidKey], admitted: Iterable[UidKey]) -> int:
        """Merge facts another replica published (uids that ran / were resumed before). A uid this
        replica saw deleted is skipped (its tombstone has the facts). Returns how many were new."""
        new = 0
        for source, local, inherited in (
            (ran, self.ran, self._inherited_ran),
            (admitted, self.admitted, self._inherited_admitted),
        ):
            for uid in source:
                if uid in local or uid in inherited or uid in self._tombstones:
                    continue
                inherited.add(uid)
                new += 1
        return new

    def forget_inherited_except(self, present: set[UidKey]) -> int:
        """Drop inherited facts of jobs not in ``present`` (the uids in the synced caches): such jobs
        were deleted before this replica listed them. Returns how many were dropped."""
        dropped = 0
        for inherited in (self._inherited_ran, self._inherited_admitted):
            for uid in [u for u in inherited if u not in present]:
                inherited.discard(uid)
                dropped += 1
        return dropped

    def inherited_keys(self) -> set[UidKey]:
        return set(self._inherited_ran) | set(self._inherited_admitted)

    def published(self) -> tuple[list[UidKey], list[UidKey]]:
        """(ran before, admitted before) as this replica knows them: its own facts and the inherited ones
        (a job among them may be running again now; the fact stays true)."""
        ran = list(self.ran)
        ran.extend(u for u in self._inherited_ran if u not in self.ran)
        admitted = list(self.admitted)
        admitted.extend(u for u in self._inherited_admitted if u not in self.admitted)
        return ran, admitted
