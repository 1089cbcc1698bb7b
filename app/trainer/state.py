"""TrainerState: informer notifications in, app/trainer/events.py events out.

It holds the runtime snapshot, the TrainJob gauge table and the terminal-dedup set, and decides
what is countable (product.md §3 and §6):

- created: a TrainJob added after the initial list (``on_added(initial=False)``), once per uid;
- finished: the first not-terminal → terminal edge per uid. A job terminal in the initial list is
  recorded (not counted); one added later already terminal (created and finished while the watch
  was down) counts created AND finished; duplicate terminal updates, relists and re-adds of a uid
  never recount. The dedup entry is dropped on delete; a small bounded tombstone set of recently
  deleted uids keeps a spurious delete + re-add of the same uid from recounting.

It is a plain synchronous object (handlers run on the event loop and must be cheap): every
notification does O(1) dict work. No per-job table is kept beside the informer's cache: a job's
gauge key is recomputed from the old projection the informer hands back. That is only sound if the
mapping from a job to its label cannot change behind our back, which the one moving part (the cap on
unknown runtime refs) guarantees by keeping counts per *raw* ref and remapping a ref's few gauge
keys when its label changes (a runtime arrives, or a deleted one is kept as admitted).

Runtime refs: a reference to a runtime not in the snapshot keeps its label (the runtime may arrive
a moment later on its own watch) while at most ``max_unknown_runtime_refs`` distinct such refs are
in use; beyond that it is "unknown". Admission is sticky while jobs use the ref; a ref whose
runtime arrives stops counting against the cap; a ref whose runtime is deleted while jobs still
use it stays labelled (admitted beyond the cap if need be: it named a real runtime).

JobCreated for a job whose resolution depends on a runtime not yet known (no numNodes or no
resourcesPerNode of its own) waits up to ``runtime_wait_seconds`` in a FIFO queue; the runtime's
arrival or ``flush_pending(now)`` (called on every runtime event, opportunistically on job events,
and periodically by the service) emits it. A JobFinished of a still-pending job waits behind its
JobCreated so the two are emitted in order. Events keep the resourceVersion of the state that
produced the edge, so a delayed JobCreated can reach the sink after events with higher rvs.
"""

from __future__ import annotations

import base64
import heapq
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from app.kube.resources import TRAINER_GROUP
from app.trainer import rules
from app.trainer.events import GaugeKey, JobCreated, JobFinished, RuntimeInfo, TrainerSink
from app.trainer.projections import (
    BAD_NAMESPACE,
    MALFORMED,
    STATE_BY_FLAGS,
    RuntimeProjection,
    TrainJobProjection,
    compact_uid,
    uid_text,
)

log = logging.getLogger(__name__)

_MAX_LOGGED_MALFORMED: Final = 10_000  # bound on the "already logged" uid set
_MAX_LOGGED_KEY: Final = 300  # characters of a key / name / uid in a warning line
UNKNOWN_RUNTIME_REFS_LIMIT: Final = "unknown_runtime_refs"  # app.metrics.telemetry.LIMITS
ACCELERATOR_CLASSES_LIMIT: Final = "accelerator_classes"  # app.metrics.telemetry.LIMITS
# Distinct accelerator_class label values (besides "none") before further classes become "other".
MAX_ACCELERATOR_CLASSES: Final = 32
OTHER_ACCELERATOR_CLASS: Final = "other"


def _short(text: str) -> str:
    return text if len(text) <= _MAX_LOGGED_KEY else f"{text[:_MAX_LOGGED_KEY]}...({len(text)} chars)"


def _gauge_key(job: TrainJobProjection) -> GaugeKey:
    """(namespace label, raw runtime ref, state) of a job: the job's raw gauge key."""
    f = job.flags
    return (
        rules.UNKNOWN if f & BAD_NAMESPACE else job.namespace,
        job.runtime_ref,
        job.result or STATE_BY_FLAGS[f & 7],
    )


class _TerminalFields(msgspec.Struct, frozen=True, gc=False):
    key: str  # "namespace/name"
    uid: bytes | str  # as TrainJobProjection.uid_key stores it (shared with the projection)
    result: str  # succeeded | failed: what was (or would have been) counted
    raw_reason: str  # the terminal condition's reason as written (capped)
    terminal_time: float | None  # lastTransitionTime of the terminal condition, epoch seconds
    recorded_time: float  # wall clock when this replica recorded it, epoch seconds

    def __post_init__(self) -> None:
        uid = _TERMINAL_UID_SLOT.__get__(self)
        if type(uid) is str:
            _TERMINAL_UID_SLOT.__set__(self, compact_uid(uid))


_TERMINAL_UID_SLOT: Final[Any] = _TerminalFields.__dict__["uid"]


class TerminalEntry(_TerminalFields, frozen=True, gc=False):
    """One entry of the terminal-dedup set (shares its strings with the job's projection)."""

    @property  # type: ignore[misc]
    def uid(self) -> str:
        return uid_text(_TERMINAL_UID_SLOT.__get__(self))

    @property
    def namespace(self) -> str:
        # Derived, not stored (memory): namespaces and names never contain "/".
        ns, sep, _ = self.key.partition("/")
        return ns if sep else ""

    @property
    def name(self) -> str:
        return self.key.partition("/")[2] or self.key

    @property
    def reason(self) -> str:
        """The reason label counted: "none", one of rules.FAILURE_REASONS, or "other"."""
        return rules.reason_bucket(self.result, self.raw_reason)


class _Pending(msgspec.Struct, gc=False):
    job: TrainJobProjection  # the state that produced the created edge (rv, spec)
    raw_ref: str
    deadline: float
    finished: TrainJobProjection | None = None  # a terminal edge seen while waiting
    since: int = 0  # app/trainer/events.py, for the created edge
    finished_since: int = 0


class _JobHandler:
    """``InformerHandler[TrainJobProjection]``."""

    def __init__(self, state: TrainerState) -> None:
        self._s = state

    def on_added(self, obj: TrainJobProjection, initial: bool) -> None:
        self._s._job_added(obj, initial)

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self._s._job_updated(old, new)

    def on_deleted(self, last: TrainJobProjection) -> None:
        self._s._job_deleted(last)

    def on_relist(self, since: int | None) -> None:
        """The informer starts (``since``: the rv it held before the gap) or ends (None) a relist diff."""
        self._s._relist_since = since or 0


class _RuntimeHandler:
    """``InformerHandler[RuntimeProjection]`` shared by the TrainingRuntime and ClusterTrainingRuntime
    informers (a runtime's identity includes its kind)."""

    def __init__(self, state: TrainerState) -> None:
        self._s = state

    def on_added(self, obj: RuntimeProjection, initial: bool) -> None:
        self._s._runtime_put(None, obj)

    def on_updated(self, old: RuntimeProjection, new: RuntimeProjection) -> None:
        self._s._runtime_put(old, new)

    def on_deleted(self, last: RuntimeProjection) -> None:
        self._s._runtime_deleted(last)


def _rv(resource_version: int | str) -> int:
    """The resourceVersion (as TrainJobProjection.rv stores it) as an int for the journal's watermark;
    0 when it is not a number (resourceVersions are opaque by contract, numeric in practice)."""
    if type(resource_version) is int:
        return resource_version
    try:
        return int(resource_version) if resource_version.isdigit() else 0  # type: ignore[union-attr]
    except ValueError:  # pragma: no cover - isdigit() admits a few non-ASCII digits int() rejects
        return 0


class TrainerState:
    def __init__(
        self,
        sink: TrainerSink,
        *,
        max_unknown_runtime_refs: int = 100,
        runtime_wait_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_tombstones: int = 4096,
        on_limit: Callable[[str], None] | None = None,
        max_accelerator_classes: int = MAX_ACCELERATOR_CLASSES,
    ) -> None:
        """``on_limit(limit)`` is called with "unknown_runtime_refs" each time a runtime ref is refused
        its own label because ``max_unknown_runtime_refs`` distinct unknown refs are in use (its jobs
        count under "unknown"), and with "accelerator_classes" for each JobCreated whose accelerator
        class is counted as "other" because ``max_accelerator_classes`` distinct classes are in use
        already (a class, once used, keeps its label: the histogram series it created stay); wire it to
        SelfTelemetry.limit_hit."""
        self._sink = sink
        self._on_limit = on_limit
        self._max_unknown = max(0, max_unknown_runtime_refs)
        self._max_accelerator_classes = max(0, max_accelerator_classes)
        self._accelerator_classes: set[str] = set()
        self._wait = max(0.0, runtime_wait_seconds)
        self._clock = clock
        self._wall_clock = wall_clock
        self._max_tombstones = max(0, max_tombstones)

        self.job_handler = _JobHandler(self)
        self.runtime_handler = _RuntimeHandler(self)

        # runtime snapshot
        self._inventory: dict[tuple[str, str, str], RuntimeProjection] = {}  # (kind, namespace, name)
        self._by_ref: dict[str, RuntimeProjection] = {}  # ref label -> runtime

        # gauge: counts per raw key (namespace, raw ref, state); the sink sees effective keys
        self._raw_counts: dict[GaugeKey, int] = {}
        self._raw_keys_by_ref: dict[str, set[GaugeKey]] = {}
        self._ref_jobs: dict[str, int] = {}  # raw ref -> live jobs using it
        self._admitted: set[str] = set()  # raw refs labelled as themselves without a known runtime
        self._counts: dict[GaugeKey, int] = {}  # effective key -> count (what the sink holds)

        # terminal-dedup set by uid, and recently deleted uids -> were they recorded terminal
        # (keyed by TrainJobProjection.uid_key: 16 bytes for a UUID, shared with the projection)
        self._terminal: dict[bytes | str, TerminalEntry] = {}
        self._tombstones: OrderedDict[bytes | str, bool] = OrderedDict()

        # JobCreated waiting for a runtime: FIFO by deadline (constant wait => insertion order)
        self._pending: dict[bytes | str, _Pending] = {}
        self._pending_queue: deque[tuple[float, bytes | str]] = deque()
        self._pending_by_ref: dict[str, dict[bytes | str, None]] = {}

        self._malformed_logged: set[bytes | str] = set()  # uid keys (jobs) and uids (runtimes)
        # The rv an informer held before the gap while it applies a relist diff, else 0 (see events.py).
        self._relist_since = 0

    # --- read side (debug endpoints, metric layer) ---------------------------------------------

    def runtime_info(self) -> list[RuntimeInfo]:
        """One entry per current runtime (labels of kubeflow_trainer_runtime_info), sorted.

        A runtime whose name or namespace is not a valid Kubernetes name (its ``ref`` is "unknown": no
        TrainJob can reference it) is left out, so such a name never becomes a label value."""
        return [
            RuntimeInfo(
                namespace=r.namespace,
                name=r.name,
                api_group=TRAINER_GROUP,
                kind=r.kind,
                ml_policy=r.ml_policy,
                pod_group_policy=r.pod_group_policy,
                framework=r.framework,
            )
            for _, r in sorted(self._inventory.items())
            if r.ref != rules.UNKNOWN
        ]

    def runtimes(self) -> list[RuntimeProjection]:
        """The runtime inventory for /debug/snapshot (``ref``, policies, framework, ``num_nodes``,
        accelerator, ``resource_version``), sorted by (kind, namespace, name)."""
        return [r for _, r in sorted(self._inventory.items())]

    def runtime(self, ref: str) -> RuntimeProjection | None:
        return self._by_ref.get(ref)

    @property
    def unknown_runtime_refs(self) -> int:
        """Distinct refs of live jobs whose runtime is not in the snapshot but keep their label."""
        return len(self._admitted)

    @property
    def terminal_count(self) -> int:
        return len(self._terminal)

    @property
    def pending_count(self) -> int:
        """JobCreated events waiting for their runtime."""
        return len(self._pending)

    def jobs_gauge(self) -> dict[GaugeKey, int]:
        """A copy of the current TrainJob counts by effective (namespace, runtime_ref, state)."""
        return dict(self._counts)

    def terminal_entries(
        self, limit: int, continue_token: str | None = None
    ) -> tuple[list[TerminalEntry], str | None]:
        """A page of the terminal-dedup set in (namespace, name, uid) order, and the token of the next
        page (``None`` on the last page). Raises ``ValueError`` for a token this did not produce.

        O(n log limit) per page: a debug endpoint, not a hot path; no index is kept for it.
        """
        limit = max(1, limit)
        after = _decode_token(continue_token) if continue_token else None

        def sort_key(e: TerminalEntry) -> tuple[str, str, str]:
            return (e.namespace, e.name, e.uid)

        candidates: Iterable[TerminalEntry] = self._terminal.values()
        if after is not None:
            candidates = (e for e in candidates if sort_key(e) > after)
        page = heapq.nsmallest(limit + 1, candidates, key=sort_key)
        if len(page) <= limit:
            return page, None
        page = page[:limit]
        return page, _encode_token(sort_key(page[-1]))

    # --- pending JobCreated ----------------------------------------------------------------------

    def flush_pending(self, now: float | None = None) -> int:
        """Emit the JobCreated events whose wait for a runtime has expired (with what is known now).

        ``now`` is a ``clock`` reading (defaults to the clock). Returns how many were emitted.
        """
        if not self._pending_queue:
            return 0
        if now is None:
            now = self._clock()
        emitted = 0
        queue = self._pending_queue
        while queue and queue[0][0] <= now:
            _, uid = queue.popleft()
            entry = self._pending.get(uid)
            if entry is None or entry.deadline > now:
                continue  # already emitted (runtime arrived, job deleted) or re-queued
            self._emit_pending(uid)
            emitted += 1
        return emitted

    def _maybe_flush(self) -> None:
        if self._pending_queue and self._pending_queue[0][0] <= self._clock():
            self.flush_pending()

    def _emit_pending(self, uid: bytes | str) -> None:
        entry = self._pending.pop(uid)
        waiting = self._pending_by_ref.get(entry.raw_ref)
        if waiting is not None:
            waiting.pop(uid, None)
            if not waiting:
                del self._pending_by_ref[entry.raw_ref]
        self._sink.on_countable(self._created_event(entry.job, entry.since))
        if entry.finished is not None:
            self._sink.on_countable(self._finished_event(entry.finished, entry.finished_since))

    def _resolve_pending(self, ref: str) -> None:
        waiting = self._pending_by_ref.get(ref)
        if waiting:
            for uid in list(waiting):
                self._emit_pending(uid)

    # --- events ----------------------------------------------------------------------------------

    def _effective(self, raw_ref: str) -> str:
        if raw_ref in self._by_ref or raw_ref in self._admitted:
            return raw_ref
        return rules.UNKNOWN

    def _created_event(self, job: TrainJobProjection, since: int) -> JobCreated:
        raw = job.runtime_ref
        runtime = self._by_ref.get(raw)
        nodes = rules.requested_nodes(job.num_nodes, runtime.num_nodes if runtime is not None else None)
        cls, count = rules.requested_accelerators(
            job.accelerator_class,
            job.accelerators_per_node,
            runtime.accelerator_class if runtime is not None else None,
            runtime.accelerators_per_node if runtime is not None else 0,
            nodes,
        )
        if cls != rules.NONE and cls not in self._accelerator_classes:
            if len(self._accelerator_classes) < self._max_accelerator_classes:
                self._accelerator_classes.add(cls)
            else:
                cls = OTHER_ACCELERATOR_CLASS
                if self._on_limit is not None:
                    self._on_limit(ACCELERATOR_CLASSES_LIMIT)
        return JobCreated(
            rv=_rv(job.rv),
            uid=job.uid,
            namespace=job.namespace_label,
            runtime_ref=self._effective(raw),
            requested_nodes=nodes,
            accelerator_class=cls,
            requested_accelerators=count,
            since=since,
        )

    def _finished_event(self, job: TrainJobProjection, since: int) -> JobFinished:
        return JobFinished(
            rv=_rv(job.rv),
            uid=job.uid,
            result=job.result,
            reason=rules.reason_bucket(job.result, job.reason),
            runtime_ref=self._effective(job.runtime_ref),
            lifetime_seconds=rules.lifetime_seconds(job.created, job.terminal_time),
            namespace=job.namespace_label,
            since=since,
        )

    def _count_created(self, job: TrainJobProjection) -> None:
        raw = job.runtime_ref
        needs_runtime = job.num_nodes is None or job.accelerator_class is None
        if needs_runtime and self._wait > 0 and raw != rules.UNKNOWN and raw not in self._by_ref:
            deadline = self._clock() + self._wait
            uid = job.uid_key
            self._pending[uid] = _Pending(job=job, raw_ref=raw, deadline=deadline, since=self._relist_since)
            self._pending_queue.append((deadline, uid))
            self._pending_by_ref.setdefault(raw, {})[uid] = None
            return
        self._sink.on_countable(self._created_event(job, self._relist_since))

    def _count_finished(self, job: TrainJobProjection) -> None:
        entry = self._pending.get(job.uid_key)
        if entry is not None:  # keep per-uid order: finished after its created
            entry.finished = job
            entry.finished_since = self._relist_since
            return
        self._sink.on_countable(self._finished_event(job, self._relist_since))

    def _record_terminal(self, job: TrainJobProjection) -> None:
        uid = job.uid_key
        self._terminal[uid] = TerminalEntry(
            key=job.key,
            uid=uid,
            result=job.result,
            raw_reason=job.reason,
            terminal_time=job.terminal_time,
            recorded_time=self._wall_clock(),
        )

    # --- TrainJob notifications ------------------------------------------------------------------

    def _job_added(self, job: TrainJobProjection, initial: bool) -> None:
        self._maybe_flush()
        self._check_malformed(job)
        self._gauge_add(job)
        uid = job.uid_key
        if initial:
            # Existed before we started: never created; if terminal, finished before we looked.
            if job.result and uid not in self._terminal:
                self._record_terminal(job)
            return
        seen_terminal = self._tombstones.pop(uid, None)
        seen = seen_terminal is not None or uid in self._terminal or uid in self._pending
        if not seen:
            self._count_created(job)
        if job.result and uid not in self._terminal:
            self._record_terminal(job)
            if not seen_terminal:
                self._count_finished(job)

    def _job_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        # The hot path (nearly every watch event): O(1), the state of each side computed once, and no
        # gauge work when the job's (namespace, runtime_ref, state) did not change.
        uid = new.uid_key
        if old.uid_key != uid:
            # Same name, different object: deleted and recreated between two observations.
            self._job_deleted(old)
            self._job_added(new, initial=False)
            return
        if self._pending_queue:
            self._maybe_flush()
        new_flags = new.flags
        if new_flags & MALFORMED:
            self._check_malformed(new)
        old_flags = old.flags
        old_state = old.result or STATE_BY_FLAGS[old_flags & 7]
        new_state = new.result or STATE_BY_FLAGS[new_flags & 7]
        ref = new.runtime_ref
        if (
            old_state != new_state
            or old.runtime_ref != ref
            or old.namespace != new.namespace
            or (old_flags ^ new_flags) & BAD_NAMESPACE
        ):
            old_key = _gauge_key(old)
            new_key = (rules.UNKNOWN if new_flags & BAD_NAMESPACE else new.namespace, ref, new_state)
            if old_key[1] == ref:
                self._gauge_move(old_key, new_key)
            else:
                self._gauge_remove(old_key)
                self._gauge_add_key(new_key)
        if new.result and uid not in self._terminal:
            self._record_terminal(new)
            if not old.result:  # the edge; an unrecorded old terminal state was never an edge we saw
                self._count_finished(new)

    def _job_deleted(self, last: TrainJobProjection) -> None:
        self._maybe_flush()
        uid = last.uid_key
        if uid in self._pending:
            self._emit_pending(uid)  # it was created; count it with what we know now
        self._gauge_remove(_gauge_key(last))
        recorded = self._terminal.pop(uid, None) is not None
        self._malformed_logged.discard(uid)
        if self._max_tombstones:
            self._tombstones[uid] = recorded
            if len(self._tombstones) > self._max_tombstones:
                self._tombstones.popitem(last=False)

    def _check_malformed(self, job: TrainJobProjection) -> None:
        uid = job.uid_key
        if not job.flags & MALFORMED or uid in self._malformed_logged:
            return
        if len(self._malformed_logged) >= _MAX_LOGGED_MALFORMED:
            self._malformed_logged.clear()  # bounded; at worst a job is logged twice
        self._malformed_logged.add(uid)
        log.warning(
            "TrainJob %s (uid %s, resourceVersion %s) has unusable fields; counted with defaults",
            _short(job.key),
            _short(job.uid),
            _short(job.resource_version),
        )

    # --- gauge bookkeeping -----------------------------------------------------------------------

    def _gauge_add(self, job: TrainJobProjection, raw_key: GaugeKey | None = None) -> None:
        self._gauge_add_key(_gauge_key(job) if raw_key is None else raw_key)

    def _gauge_remove(self, raw_key: GaugeKey) -> None:
        count = self._raw_counts.get(raw_key, 0)
        if count == 0:  # not tracked (cannot happen with a consistent informer); stay consistent
            return
        raw_ref = raw_key[1]
        self._bump((raw_key[0], self._effective(raw_ref), raw_key[2]), -1)
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

    def _gauge_move(self, old_key: GaugeKey, new_key: GaugeKey) -> None:
        """One job moves between two raw keys of the same raw ref: ``_gauge_remove(old_key)`` then
        ``_gauge_add(new_key)`` without the ref bookkeeping, which a move leaves unchanged."""
        counts = self._raw_counts
        count = counts.get(old_key, 0)
        raw_ref = old_key[1]
        if count == 0:  # not tracked (cannot happen with a consistent informer); stay consistent
            self._gauge_add_key(new_key)
            return
        label = self._effective(raw_ref)
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

    def _gauge_add_key(self, raw_key: GaugeKey) -> None:
        raw_ref = raw_key[1]
        if raw_ref != rules.UNKNOWN:
            users = self._ref_jobs.get(raw_ref, 0)
            if users == 0 and raw_ref not in self._by_ref:
                if len(self._admitted) < self._max_unknown:
                    self._admitted.add(raw_ref)
                elif self._on_limit is not None:
                    self._on_limit(UNKNOWN_RUNTIME_REFS_LIMIT)
            self._ref_jobs[raw_ref] = users + 1
        count = self._raw_counts.get(raw_key, 0)
        self._raw_counts[raw_key] = count + 1
        if count == 0:
            self._raw_keys_by_ref.setdefault(raw_ref, set()).add(raw_key)
        self._bump((raw_key[0], self._effective(raw_ref), raw_key[2]), 1)

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

    # --- runtime notifications -------------------------------------------------------------------

    def _runtime_put(self, old: RuntimeProjection | None, new: RuntimeProjection) -> None:
        if new.malformed and new.uid not in self._malformed_logged:
            # product.md §6.6: a malformed runtime is used as best it can be, and logged once (per uid).
            self._malformed_logged.add(new.uid)
            log.warning(
                "%s %s (uid %s, resourceVersion %s) has unusable fields; used with defaults",
                new.kind,
                _short(new.key),
                _short(new.uid),
                _short(new.resource_version),
            )
        if old is not None and (old.kind, old.namespace, old.name) != (new.kind, new.namespace, new.name):
            self._runtime_deleted(old, notify=False)
        self._inventory[(new.kind, new.namespace, new.name)] = new
        ref = new.ref
        if ref != rules.UNKNOWN:
            before = self._effective(ref)
            self._by_ref[ref] = new
            self._admitted.discard(ref)  # known now: no longer counts against the cap
            self._remap(ref, before, ref)
            self._resolve_pending(ref)
        self.flush_pending()
        self._sink.on_runtimes_changed()

    def _runtime_deleted(self, last: RuntimeProjection, *, notify: bool = True) -> None:
        self._inventory.pop((last.kind, last.namespace, last.name), None)
        self._malformed_logged.discard(last.uid)
        ref = last.ref
        if ref != rules.UNKNOWN and self._by_ref.get(ref) is not None:
            del self._by_ref[ref]
            if self._ref_jobs.get(ref):
                # Jobs still use it: keep their label stable rather than flip them to "unknown".
                self._admitted.add(ref)
        if notify:
            self.flush_pending()
            self._sink.on_runtimes_changed()


def _encode_token(key: tuple[str, str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode()


def _decode_token(token: str) -> tuple[str, str, str]:
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (ValueError, UnicodeError) as exc:
        raise ValueError("invalid continue token") from exc
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
        raise ValueError("invalid continue token")
    return (value[0], value[1], value[2])


__all__ = ["TerminalEntry", "TrainerState"]
