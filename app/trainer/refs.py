"""Runtime-ref labels and the TrainJob gauge that uses them.

A job's runtime_ref label depends on more than the job: a reference to a runtime not in the snapshot
keeps its label (the runtime may arrive a moment later on its own watch) while at most
``max_unknown`` distinct such refs are in use; beyond that it is "unknown". Admission is sticky while
jobs use the ref; a ref whose runtime arrives stops counting against the cap; a ref whose runtime is
deleted while jobs still use it stays labelled (admitted beyond the cap if need be: it named a real
runtime).

So the gauge is counted per *raw* key (namespace, raw ref, state) and reported per *effective* key
(the ref replaced by its current label); when a ref's label changes, its few raw keys are remapped.
That keeps every update O(1) with no per-job table: a job's raw key is recomputed from its projection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from app.trainer import rules
from app.trainer.events import GaugeKey, TrainerSink
from app.trainer.projection_types import RuntimeProjection

UNKNOWN_RUNTIME_REFS_LIMIT: Final = "unknown_runtime_refs"  # app.metrics.telemetry.LIMITS


class RuntimeRefs:
    """The runtimes by ref label, the cap on unknown refs, and the gauge counts.

    Every change of an effective key's count goes to ``sink.on_jobs_gauge``; ``on_limit`` receives
    UNKNOWN_RUNTIME_REFS_LIMIT each time a ref is refused its own label.
    """

    def __init__(
        self,
        sink: TrainerSink,
        *,
        max_unknown: int,
        on_limit: Callable[[str], None] | None = None,
    ) -> None:
        # The sink, not its bound on_jobs_gauge: calling a stored bound method costs ~15 ns more per
        # gauge change on CPython 3.11.
        self._sink = sink
        self._on_limit = on_limit
        self._max_unknown = max(0, max_unknown)
        # Read by TrainerState to resolve jobs; written only through runtime_known / runtime_gone.
        self.by_ref: dict[str, RuntimeProjection] = {}
        self._raw_counts: dict[GaugeKey, int] = {}
        self._raw_keys_by_ref: dict[str, set[GaugeKey]] = {}
        self._ref_jobs: dict[str, int] = {}  # raw ref -> live jobs using it
        self._admitted: set[str] = set()  # raw refs labelled as themselves without a known runtime
        self._counts: dict[GaugeKey, int] = {}  # effective key -> count (what the sink was told)

    @property
    def unknown_in_use(self) -> int:
        """Distinct refs of live jobs whose runtime is not in the snapshot but keep their label."""
        return len(self._admitted)

    def counts(self) -> dict[GaugeKey, int]:
        """A copy of the counts by effective key."""
        return dict(self._counts)

    def label(self, raw_ref: str) -> str:
        """The runtime_ref label a raw ref gets now."""
        if raw_ref in self.by_ref or raw_ref in self._admitted:
            return raw_ref
        return rules.UNKNOWN

    # --- runtimes ----------------------------------------------------------------------------------

    def runtime_known(self, runtime: RuntimeProjection) -> None:
        """``runtime`` (whose ref is not "unknown") is in the snapshot now."""
        ref = runtime.ref
        before = self.label(ref)
        self.by_ref[ref] = runtime
        self._admitted.discard(ref)  # known now: no longer counts against the cap
        self._remap(ref, before, ref)

    def runtime_gone(self, ref: str) -> None:
        """The runtime of ``ref`` left the snapshot."""
        if ref != rules.UNKNOWN and self.by_ref.get(ref) is not None:
            del self.by_ref[ref]
            if self._ref_jobs.get(ref):
                # Jobs still use it: keep their label stable rather than flip them to "unknown".
                self._admitted.add(ref)

    # --- gauge -------------------------------------------------------------------------------------

    def add(self, raw_key: GaugeKey) -> None:
        raw_ref = raw_key[1]
        if raw_ref != rules.UNKNOWN:
            users = self._ref_jobs.get(raw_ref, 0)
            if users == 0 and raw_ref not in self.by_ref:
                if len(self._admitted) < self._max_unknown:
                    self._admitted.add(raw_ref)
                elif self._on_limit is not None:
                    self._on_limit(UNKNOWN_RUNTIME_REFS_LIMIT)
            self._ref_jobs[raw_ref] = users + 1
        count = self._raw_counts.get(raw_key, 0)
        self._raw_counts[raw_key] = count + 1
        if count == 0:
            self._raw_keys_by_ref.setdefault(raw_ref, set()).add(raw_key)
        self._bump((raw_key[0], self.label(raw_ref), raw_key[2]), 1)

    def remove(self, raw_key: GaugeKey) -> None:
        count = self._raw_counts.get(raw_key, 0)
        if count == 0:  # not tracked (cannot happen with a consistent informer); stay consistent
            return
        raw_ref = raw_key[1]
        self._bump((raw_key[0], self.label(raw_ref), raw_key[2]), -1)
        if count == 1:
            del self._raw_counts[raw_key]
            keys = self._raw_keys_by_ref[raw_ref]
            keys.discard(raw_key)
            if not keys:
                del self._raw_keys_by_ref[raw_ref]
        else:
            self._raw_counts[raw_key] = count - 1
        if raw_ref != rules.UNKNOWN:
            users = self._ref_jobs[raw_ref] - 1
            if users:
                self._ref_jobs[raw_ref] = users
            else:
                del self._ref_jobs[raw_ref]
                self._admitted.discard(raw_ref)

    def move(self, old_key: GaugeKey, new_key: GaugeKey) -> None:
        """One job moves between two raw keys of the same raw ref: ``remove(old_key)`` then
        ``add(new_key)`` without the ref bookkeeping, which a move leaves unchanged."""
        counts = self._raw_counts
        count = counts.get(old_key, 0)
        raw_ref = old_key[1]
        if count == 0:  # not tracked (cannot happen with a consistent informer); stay consistent
            self.add(new_key)
            return
        label = self.label(raw_ref)
        self._bump((old_key[0], label, old_key[2]), -1)
        keys = self._raw_keys_by_ref[raw_ref]
        if count == 1:
            del counts[old_key]
            keys.discard(old_key)
        else:
            counts[old_key] = count - 1
        count = counts.get(new_key, 0)
        counts[new_key] = count + 1
        if count == 0:
            keys.add(new_key)
        self._bump((new_key[0], label, new_key[2]), 1)

    def _bump(self, key: GaugeKey, delta: int) -> None:
        value = self._counts.get(key, 0) + delta
        if value > 0:
            self._counts[key] = value
        else:
            self._counts.pop(key, None)
            value = 0
        self._sink.on_jobs_gauge(key, value)

    def _remap(self, raw_ref: str, old_label: str, new_label: str) -> None:
        """Move a raw ref's gauge counts from one effective label to another (few keys)."""
        if old_label == new_label:
            return
        for ns, _, state in sorted(self._raw_keys_by_ref.get(raw_ref, ())):
            count = self._raw_counts[(ns, raw_ref, state)]
            self._bump((ns, old_label, state), -count)
            self._bump((ns, new_label, state), count)
