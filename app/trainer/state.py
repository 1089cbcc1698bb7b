"""TrainerState: informer notifications in, app/trainer/events.py events out.

It holds the runtime snapshot, the TrainJob gauge (app/trainer/refs.py) and the terminal-dedup set
(app/trainer/terminal.py), and decides what is countable (docs/design/product.md §3 and §6):

- created: a TrainJob added after the initial list (``on_added(initial=False)``), once per uid;
- finished: the first not-terminal → terminal edge per uid. A job terminal in the initial list is
  recorded (not counted); one added later already terminal (created and finished while the watch
  was down) counts created AND finished; duplicate terminal updates, relists and re-adds of a uid
  never recount. The dedup entry is dropped on delete; a small bounded tombstone set of recently
  deleted uids keeps a spurious delete + re-add of the same uid from recounting.
- started (time to running): the first observed running state per uid, mirroring finished. A job
  running in the initial list started before we looked: not observed, and never later either (it ran);
  one not running in the initial list is observed when it first runs; one added later already running
  (created and started while the watch was down) is observed; a job that leaves running and runs again
  (preempted, pods lost) is not observed again. A job that reaches a terminal state without ever being
  seen running (failed before its pods were ready, or created, run and finished within one watch gap)
  is not observed: when it started is unknown.
- admitted (admission wait): the first observed Suspended=False/Resumed condition per uid, on a job not
  terminal and never seen running (a re-admission after a preemption is not an admission wait). The
  initial-list rule is the same: a job already resumed in it is not observed.

  No table is kept for these two: a job's projection says whether it runs / is resumed now. Only the
  jobs that ran (or were resumed) and are not running (resumed) now sit in a set, so that coming back
  is not a new edge; these sets hold a few preempted jobs, not the population.

It is a plain synchronous object (handlers run on the event loop and must be cheap): every
notification does O(1) dict work. No per-job table is kept beside the informer's cache: a job's
gauge key is recomputed from the old projection the informer hands back. That is only sound if the
mapping from a job to its label cannot change behind our back, which the one moving part (the cap on
unknown runtime refs, ``max_unknown_runtime_refs``) guarantees by counting per *raw* ref
(app/trainer/refs.py).

A JobCreated whose runtime is not yet known waits (app/trainer/pending.py) until the runtime
arrives or ``flush_pending(now)`` (called on every runtime event, opportunistically on job events,
and periodically by the service) finds its wait over. Events keep the resourceVersion of the state
that produced the edge, so a delayed JobCreated can reach the sink after events with higher rvs.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from app.trainer import rules
from app.trainer.events import (
    CountableEvent,
    GaugeKey,
    JobAdmitted,
    JobCreated,
    JobFinished,
    JobStarted,
    RuntimeInfo,
    TrainerSink,
)
from app.trainer.kinds import TRAINER_GROUP
from app.trainer.pending import PendingCreated, Waiting
from app.trainer.projections import (
    BAD_NAMESPACE,
    MALFORMED,
    RESUMED,
    STATE_BY_FLAGS,
    RuntimeProjection,
    TrainJobProjection,
)
from app.trainer.refs import RuntimeRefs
from app.trainer.terminal import TerminalEntry, TerminalSet

log = logging.getLogger(__name__)

_FIXED_REASONS: Final = frozenset(rules.REASONS)

_MAX_LOGGED_MALFORMED: Final = 10_000  # bound on the "already logged" uid set
_MAX_LOGGED_KEY: Final = 300  # characters of a key / name / uid in a warning line
ACCELERATOR_CLASSES_LIMIT: Final = "accelerator_classes"  # app.metrics.telemetry.Limit
# Distinct accelerator_class label values (besides "none") before further classes become "other".
MAX_ACCELERATOR_CLASSES: Final = 32
OTHER_ACCELERATOR_CLASS: Final = "other"
FAILURE_REASONS_LIMIT: Final = "failure_reasons"  # app.metrics.telemetry.Limit
# A created TrainJob whose request exceeds rules.requests_within_ceilings: out of the histograms.
REQUESTED_QUANTITY_LIMIT: Final = "requested_quantity"  # app.metrics.telemetry.Limit
# Distinct reason label values beyond rules.REASONS before further reasons become "other".
MAX_FAILURE_REASONS: Final = 32
# What a tombstone remembers of a deleted uid (bits), so that a spurious re-add counts none of it again.
_TOMB_TERMINAL: Final = 1  # its terminal edge was recorded
_TOMB_RAN: Final = 2  # it was seen running (time to running observed or not observable)
_TOMB_ADMITTED: Final = 4  # it was seen resumed (admission wait observed or not observable)
_RUNNING: Final = rules.RUNNING


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
        accelerator_patterns: Iterable[str] = rules.DEFAULT_ACCELERATOR_PATTERNS,
        max_failure_reasons: int = MAX_FAILURE_REASONS,
    ) -> None:
        """``on_limit(limit)`` is called with "unknown_runtime_refs" each time a runtime ref is refused
        its own label because ``max_unknown_runtime_refs`` distinct unknown refs are in use (its jobs
        count under "unknown"); with "accelerator_classes" for each JobCreated with a class counted as
        "other" because ``max_accelerator_classes`` distinct classes are in use already; and with
        "failure_reasons" for each JobFinished whose well-formed but not upstream-known reason is counted
        as "other" because ``max_failure_reasons`` such reasons are in use already. A class or reason,
        once used, keeps its label (the series it created stay). Wire it to SelfTelemetry.limit_hit.
        ``accelerator_patterns``: the resource names that are accelerators (rules.AcceleratorMatcher)."""
        self._sink = sink
        self._on_limit = on_limit
        self._accelerators = rules.AcceleratorMatcher(accelerator_patterns)
        self._max_accelerator_classes = max(0, max_accelerator_classes)
        self._accelerator_classes: set[str] = set()
        self._max_failure_reasons = max(0, max_failure_reasons)
        self._failure_reasons: set[str] = set()
        self._wait = max(0.0, runtime_wait_seconds)
        self._clock = clock
        self._wall_clock = wall_clock
        self._max_tombstones = max(0, max_tombstones)

        self.job_handler = _JobHandler(self)
        self.runtime_handler = _RuntimeHandler(self)

        self._inventory: dict[tuple[str, str, str], RuntimeProjection] = {}  # (kind, namespace, name)
        # runtimes by ref, and the gauge counted per raw ref (the sink sees effective keys)
        self._refs = RuntimeRefs(sink, max_unknown=max_unknown_runtime_refs, on_limit=on_limit)

        self._terminal = TerminalSet()
        # recently deleted uid keys -> _TOMB_* bits
        self._tombstones: OrderedDict[bytes | str, int] = OrderedDict()
        # uid keys of live, not terminal jobs seen running (resumed) before but not now: their next running
        # state (Resumed condition) is not a first one. A job's projection covers the running (resumed) ones.
        self._ran: set[bytes | str] = set()
        self._admitted: set[bytes | str] = set()

        self._pending = PendingCreated()

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
        return self._refs.by_ref.get(ref)

    def runtime_accelerators(self, runtime: RuntimeProjection) -> tuple[tuple[str, int], ...]:
        """(class, per-node count) of each accelerator the runtime's trainer container requests by itself
        (for /debug/snapshot); empty when none."""
        return self._accelerators.per_node(runtime.node_resources)

    @property
    def unknown_runtime_refs(self) -> int:
        """Distinct refs of live jobs whose runtime is not in the snapshot but keep their label."""
        return self._refs.unknown_in_use

    @property
    def terminal_count(self) -> int:
        return len(self._terminal)

    @property
    def pending_count(self) -> int:
        """JobCreated events waiting for their runtime."""
        return len(self._pending)

    def jobs_gauge(self) -> dict[GaugeKey, int]:
        """A copy of the current TrainJob counts by effective (namespace, runtime_ref, state)."""
        return self._refs.counts()

    def terminal_entries(
        self, limit: int, continue_token: str | None = None
    ) -> tuple[list[TerminalEntry], str | None]:
        """A page of the terminal-dedup set (``TerminalSet.page``)."""
        return self._terminal.page(limit, continue_token)

    # --- pending JobCreated ----------------------------------------------------------------------

    def flush_pending(self, now: float | None = None) -> int:
        """Emit the JobCreated events whose wait for a runtime has expired (with what is known now).

        ``now`` is a ``clock`` reading (defaults to the clock). Returns how many were emitted.
        """
        if not self._pending.queue:
            return 0
        expired = self._pending.take_expired(self._clock() if now is None else now)
        for entry in expired:
            self._emit_pending(entry)
        return len(expired)

    def _maybe_flush(self) -> None:
        queue = self._pending.queue
        if queue and queue[0][0] <= self._clock():
            self.flush_pending()

    def _emit_pending(self, entry: Waiting) -> None:
        self._sink.on_countable(self._created_event(entry.job, entry.since))
        for event in entry.deferred:
            self._sink.on_countable(event)
        if entry.finished is not None:
            self._sink.on_countable(self._finished_event(entry.finished, entry.finished_since))

    # --- events ----------------------------------------------------------------------------------

    def _created_event(self, job: TrainJobProjection, since: int) -> JobCreated:
        raw = job.runtime_ref
        runtime = self._refs.by_ref.get(raw)
        nodes = rules.requested_nodes(job.num_nodes, runtime.default_nodes if runtime is not None else None)
        # The trainer container's resources as the controller builds them (newRuntimeInfo): the runtime's
        # node container, computed once per runtime version, with the job's resourcesPerNode merged in
        # when the controller merges it (memoised per pair). A runtime that never arrived leaves the job's
        # own resourcesPerNode: the best we know.
        if runtime is None:
            resources = job.resources or rules.NO_RESOURCES
        elif job.resources is not None and runtime.merges_job_resources:
            resources = rules.merge_resources(runtime.node_resources, job.resources)
        else:
            resources = runtime.node_resources
        per_node = self._accelerators.per_node(resources)
        nodes_ok, accelerators_ok = rules.requests_within_ceilings(per_node, nodes)
        if not accelerators_ok:
            self._request_out_of_range(job, nodes, per_node)
        accelerators = rules.requested_accelerators(per_node, nodes)
        if accelerators is not rules.NO_ACCELERATORS:
            accelerators = self._cap_accelerator_classes(accelerators)
        first_class, first_count = accelerators[0]
        return JobCreated(
            rv=_rv(job.rv),
            uid=job.uid,
            namespace=job.namespace_label,
            runtime_ref=self._refs.label(raw),
            requested_nodes=nodes,
            accelerator_class=first_class,
            requested_accelerators=first_count,
            since=since,
            more_accelerators=accelerators[1:],
            nodes_observed=nodes_ok,
            accelerators_observed=accelerators_ok,
        )

    def _request_out_of_range(
        self, job: TrainJobProjection, nodes: int, per_node: tuple[tuple[str, int], ...]
    ) -> None:
        """A request nobody makes (numNodes or an accelerator count above the ceilings): counted as a
        limit hit, logged once per job, and kept out of the histograms by the caller."""
        if self._on_limit is not None:
            self._on_limit(REQUESTED_QUANTITY_LIMIT)
        uid = job.uid_key
        if uid in self._malformed_logged:
            return
        if len(self._malformed_logged) >= _MAX_LOGGED_MALFORMED:
            self._malformed_logged.clear()
        self._malformed_logged.add(uid)
        log.warning(
            "TrainJob %s (uid %s) requests %d nodes and %s per node, above the ceilings (%d nodes, %d "
            "accelerators per node, %d per job); counted, but left out of the requested-nodes and "
            "requested-accelerators histograms",
            _short(job.key),
            _short(job.uid),
            nodes,
            _short(", ".join(f"{count} {cls}" for cls, count in per_node) or "no accelerators"),
            rules.MAX_REQUESTED_NODES,
            rules.MAX_ACCELERATORS_PER_NODE,
            rules.MAX_ACCELERATORS_PER_JOB,
        )

    def _cap_accelerator_classes(self, accelerators: rules.Accelerators) -> rules.Accelerators:
        """Classes beyond ``max_accelerator_classes`` distinct ones become "other" (one observation per
        job: the counts of a job's classes that all became "other" are summed)."""
        known = self._accelerator_classes
        other = -1  # summed count of this job's classes that became "other"; -1: none did
        kept: list[tuple[str, int]] = []
        for cls, count in accelerators:
            if cls not in known:
                if len(known) < self._max_accelerator_classes:
                    known.add(cls)
                else:
                    other = max(other, 0) + count
                    if self._on_limit is not None:
                        self._on_limit(ACCELERATOR_CLASSES_LIMIT)
                    continue
            kept.append((cls, count))
        if other < 0:
            return accelerators
        kept.append((OTHER_ACCELERATOR_CLASS, other))
        return tuple(sorted(kept))

    def _finished_event(self, job: TrainJobProjection, since: int) -> JobFinished:
        return JobFinished(
            rv=_rv(job.rv),
            uid=job.uid,
            result=job.result,
            reason=self._reason_label(job.result, job.reason),
            runtime_ref=self._refs.label(job.runtime_ref),
            lifetime_seconds=rules.lifetime_seconds(job.created, job.terminal_time),
            namespace=job.namespace_label,
            since=since,
        )

    def _reason_label(self, result: str, reason: str) -> str:
        """rules.reason_bucket, with at most ``max_failure_reasons`` distinct names beyond rules.REASONS
        (a hand-edited or buggy controller could write a new reason per job)."""
        label = rules.reason_bucket(result, reason)
        if label in _FIXED_REASONS or label in self._failure_reasons:
            return label
        if len(self._failure_reasons) < self._max_failure_reasons:
            self._failure_reasons.add(label)
            return label
        if self._on_limit is not None:
            self._on_limit(FAILURE_REASONS_LIMIT)
        return rules.OTHER_REASON

    def _count_created(self, job: TrainJobProjection) -> None:
        raw = job.runtime_ref
        # Every job waits for an unknown runtime, even one that sets numNodes and resourcesPerNode: its
        # resourcesPerNode merges into the runtime's container, so the runtime's GPUs count too.
        if self._wait > 0 and raw != rules.UNKNOWN and raw not in self._refs.by_ref:
            self._pending.add(job, raw, self._clock() + self._wait, self._relist_since)
            return
        self._sink.on_countable(self._created_event(job, self._relist_since))

    def _count_started(self, job: TrainJobProjection) -> None:
        startup = rules.seconds_since_creation(job.created, self._wall_clock())
        if startup is None:
            return  # no creationTimestamp (malformed, logged): nothing to observe
        self._count_later(
            job,
            JobStarted(
                rv=_rv(job.rv),
                uid=job.uid,
                runtime_ref=self._refs.label(job.runtime_ref),
                startup_seconds=startup,
                namespace=job.namespace_label,
                since=self._relist_since,
            ),
        )

    def _count_admitted(self, job: TrainJobProjection) -> None:
        wait = rules.seconds_since_creation(job.created, job.resumed_time)
        if wait is None:
            return  # a timestamp is missing or unparsable (malformed, logged)
        self._count_later(
            job,
            JobAdmitted(
                rv=_rv(job.rv),
                uid=job.uid,
                runtime_ref=self._refs.label(job.runtime_ref),
                wait_seconds=wait,
                namespace=job.namespace_label,
                since=self._relist_since,
            ),
        )

    def _count_later(self, job: TrainJobProjection, event: CountableEvent) -> None:
        """An edge after created: it waits behind a created edge still waiting for its runtime."""
        entry = self._pending.get(job.uid_key)
        if entry is not None:
            entry.deferred += (event,)
            return
        self._sink.on_countable(event)

    def _first_edges(self, job: TrainJobProjection, tomb: int) -> None:
        """Admitted and started edges of a not-terminal job first seen after the initial list (``tomb``: its
        tombstone bits when it is a deleted uid seen again, else 0)."""
        uid = job.uid_key
        flags = job.flags
        ran = bool(tomb & _TOMB_RAN) or uid in self._ran
        if flags & RESUMED:
            if not ran and not tomb & _TOMB_ADMITTED and uid not in self._admitted:
                self._count_admitted(job)
        elif tomb & _TOMB_ADMITTED:
            self._admitted.add(uid)
        if STATE_BY_FLAGS[flags & 7] == _RUNNING:
            if not ran:
                self._count_started(job)
        elif ran:
            self._ran.add(uid)

    def _later_edges(self, old_state: str, new: TrainJobProjection, resumed_changed: bool) -> None:
        """Admitted and started edges of an update of a not-terminal job (state or Resumed changed)."""
        uid = new.uid_key
        if uid in self._terminal:
            return  # it was terminal: every edge before that is behind us
        new_state = new.state
        if resumed_changed:
            if not new.flags & RESUMED:
                self._admitted.add(uid)  # suspended again (preempted): its next Resumed is no admission
            elif uid in self._admitted:
                self._admitted.discard(uid)
            elif old_state != _RUNNING and uid not in self._ran:
                self._count_admitted(new)
        if old_state != new_state:
            if new_state == _RUNNING:
                if uid in self._ran:
                    self._ran.discard(uid)  # ran before; its projection says so while it runs
                else:
                    self._count_started(new)
            elif old_state == _RUNNING:
                self._ran.add(uid)

    def _count_finished(self, job: TrainJobProjection) -> None:
        entry = self._pending.get(job.uid_key)
        if entry is not None:  # keep per-uid order: finished after its created
            entry.finished = job
            entry.finished_since = self._relist_since
            return
        self._sink.on_countable(self._finished_event(job, self._relist_since))

    # --- TrainJob notifications ------------------------------------------------------------------

    def _job_added(self, job: TrainJobProjection, initial: bool) -> None:
        self._maybe_flush()
        self._check_malformed(job)
        self._refs.add(_gauge_key(job))
        uid = job.uid_key
        if initial:
            # Existed before we started: never created; if terminal, finished before we looked. If running
            # (resumed), it started (was admitted) before we looked: its projection keeps that known.
            if job.result and uid not in self._terminal:
                self._terminal.record(job, self._wall_clock())
            return
        tomb = self._tombstones.pop(uid, None)
        seen = tomb is not None or uid in self._terminal or uid in self._pending
        if not seen:
            self._count_created(job)
        if job.result:
            if uid not in self._terminal:
                self._terminal.record(job, self._wall_clock())
                if tomb is None or not tomb & _TOMB_TERMINAL:
                    self._count_finished(job)
        elif uid not in self._terminal:
            self._first_edges(job, tomb or 0)

    def _job_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        # The hot path (nearly every watch event): O(1), the state of each side computed once, and no
        # gauge work when the job's (namespace, runtime_ref, state) did not change.
        uid = new.uid_key
        if old.uid_key != uid:
            # Same name, different object: deleted and recreated between two observations.
            self._job_deleted(old)
            self._job_added(new, initial=False)
            return
        if self._pending.queue:
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
                self._refs.move(old_key, new_key)
            else:
                self._refs.remove(old_key)
                self._refs.add(new_key)
        if new.result:
            if uid not in self._terminal:
                self._terminal.record(new, self._wall_clock())
                self._ran.discard(uid)  # the terminal set guards it from now on
                self._admitted.discard(uid)
                if not old.result:  # the edge; an unrecorded old terminal state was never an edge we saw
                    self._count_finished(new)
        elif old_state != new_state or (old_flags ^ new_flags) & RESUMED:
            self._later_edges(old_state, new, bool((old_flags ^ new_flags) & RESUMED))

    def _job_deleted(self, last: TrainJobProjection) -> None:
        self._maybe_flush()
        uid = last.uid_key
        if uid in self._pending:
            self._emit_pending(self._pending.take(uid))  # it was created; count it with what we know now
        self._refs.remove(_gauge_key(last))
        tomb = _TOMB_TERMINAL if self._terminal.pop(uid, None) is not None else 0
        if last.state == _RUNNING or uid in self._ran:
            tomb |= _TOMB_RAN
            self._ran.discard(uid)
        if last.flags & RESUMED or uid in self._admitted:
            tomb |= _TOMB_ADMITTED
            self._admitted.discard(uid)
        self._malformed_logged.discard(uid)
        if self._max_tombstones:
            self._tombstones[uid] = tomb
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

    # --- runtime notifications -------------------------------------------------------------------

    def _runtime_put(self, old: RuntimeProjection | None, new: RuntimeProjection) -> None:
        if new.malformed and new.uid not in self._malformed_logged:
            # docs/design/product.md §6 invariant 6: a malformed runtime is used as best it can be, and
            # logged once (per uid).
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
            self._refs.runtime_known(new)
            for entry in self._pending.take_for(ref):
                self._emit_pending(entry)
        self.flush_pending()
        self._sink.on_runtimes_changed()

    def _runtime_deleted(self, last: RuntimeProjection, *, notify: bool = True) -> None:
        self._inventory.pop((last.kind, last.namespace, last.name), None)
        self._malformed_logged.discard(last.uid)
        self._refs.runtime_gone(last.ref)
        if notify:
            self.flush_pending()
            self._sink.on_runtimes_changed()
