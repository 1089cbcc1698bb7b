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
- admitted (admission wait): the first observed move of a job out of ``suspended`` into pending or running,
  per uid, on a job never seen running and never seen leaving ``suspended`` before (a re-admission after a
  preemption is not an admission wait), at most once. Every order of writes that admits a queued job ends
  that way (docs/metrics.md, "Admission"): Kueue unsuspends the job (kubernetes-sigs/kueue v0.19.2
  ``pkg/controller/jobs/trainjob`` RunWithPodSetsInfo, then Unsuspend), and the job stays ``suspended``
  while the controller's Suspended condition is True, until the controller answers with
  Suspended=False/Resumed (kubeflow/trainer v2.3.0 setSuspendedCondition): the wait is that condition's
  lastTransitionTime minus creationTimestamp. When Kueue unsuspended the job before the controller ever
  wrote a Suspended condition (a burst the controller's queue had not reached, a controller restart), the
  controller writes none at all (setSuspendedCondition changes nothing when spec.suspend is false and no
  condition is True), and no object records the admission: the wait is this exporter's wall clock when it
  saw the job leave ``suspended``, minus creationTimestamp, an upper bound late by the watch latency. A job
  created not suspended never waited for admission. The initial-list rule is the same: a job not suspended
  in it is not observed; one suspended in it is, when it is admitted.

  No table is kept for these two: a job's projection says whether it runs / is resumed now. Only the
  jobs that ran (or were resumed) and are not running (resumed) now are remembered (app/trainer/history.py),
  so that coming back is not a new edge: a few preempted jobs, not the population. The leader publishes
  them in the Lease and every replica merges them (``published_history``, ``inherit_history``): a replica
  that started while a job was preempted does not take its next run for its first.

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
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from app.kube.logthrottle import short
from app.trainer import rules
from app.trainer.event_builder import (
    MAX_ACCELERATOR_CLASSES,
    MAX_FAILURE_REASONS,
    EventBuilder,
    LoggedOnce,
)
from app.trainer.events import (
    CountableEvent,
    GaugeKey,
    RuntimeInfo,
    TrainerSink,
)
from app.trainer.history import TOMB_ADMITTED, TOMB_RAN, TOMB_TERMINAL, EdgeHistory
from app.trainer.inventory import RuntimeInventory
from app.trainer.pending import PendingCreated, Waiting
from app.trainer.projection_types import (
    BAD_NAMESPACE,
    MALFORMED,
    RESUMED,
    STATE_BY_FLAGS,
    STEP_SHIFT,
    RuntimeProjection,
    TrainJobProjection,
    compact_uid,
    uid_text,
)
from app.trainer.refs import RuntimeRefs
from app.trainer.snapshots import StepSnapshots
from app.trainer.terminal import TerminalEntry, TerminalSet

log = logging.getLogger(__name__)

_RUNNING: Final = rules.RUNNING
_SUSPENDED: Final = rules.SUSPENDED
_RESOLVED: Final = 1 << STEP_SHIFT  # flags at or above: a training step resolved (projections.STEP_SHIFT)


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
        gauge_sink: TrainerSink | None = None,
        cluster_runtimes_watched: bool = True,
    ) -> None:
        """``on_limit(limit)`` is called with "unknown_runtime_refs" each time a runtime ref is refused
        its own label because ``max_unknown_runtime_refs`` distinct unknown refs are in use (its jobs
        count under "unknown"); with "accelerator_classes" for each JobCreated with a class counted as
        "other" because ``max_accelerator_classes`` distinct classes are in use already; and with
        "failure_reasons" for each JobFinished whose well-formed but not upstream-known reason is counted
        as "other" because ``max_failure_reasons`` such reasons are in use already. A class or reason,
        once used, keeps its label (the series it created stay). Wire it to SelfTelemetry.limit_hit.
        ``accelerator_patterns``: the resource names that are accelerators (rules.AcceleratorMatcher).
        ``gauge_sink``: where gauge and runtime changes go, if not to ``sink``. The service sends countable
        edges through the hand-over journal and gauges straight to the metric state (the journal and the
        served ledger only pass gauges on: two calls per gauge change saved, on every watch event).
        ``cluster_runtimes_watched``: False when no ClusterTrainingRuntime informer feeds this state (a
        namespaced install): a job of one is counted at once, since its runtime will never arrive."""
        self._sink = sink
        self._gauge_sink = gauge_sink or sink
        self._wait = max(0.0, runtime_wait_seconds)
        # Refs whose runtime is never watched (str.startswith of an empty tuple is False).
        self._unwatched_refs: tuple[str, ...] = (
            () if cluster_runtimes_watched else (rules.CLUSTER_RUNTIME_REF_PREFIX,)
        )
        self._clock = clock
        self._wall_clock = wall_clock

        self.job_handler = _JobHandler(self)
        self.runtime_handler = _RuntimeHandler(self)

        # runtimes by ref, and the gauge counted per raw ref (the sink sees effective keys)
        self._refs = RuntimeRefs(self._gauge_sink, max_unknown=max_unknown_runtime_refs, on_limit=on_limit)

        self._terminal = TerminalSet()
        # jobs that ran (were resumed) before but not now, and recently deleted uids
        self._history = EdgeHistory(max_tombstones=max_tombstones)

        self._pending = PendingCreated()
        # initial-list jobs read before their runtime was known: their first resolved reading is no edge
        self._guessed: set[bytes | str] = set()
        # training steps of jobs whose runtime changed since they were resolved, for the Lease
        self._snapshots = StepSnapshots(self._refs.by_ref)

        self._malformed_logged = LoggedOnce()  # uid keys (jobs) and uids (runtimes)
        self._inventory = RuntimeInventory(self._malformed_logged)
        self._events = EventBuilder(
            self._refs,
            self._malformed_logged,
            on_limit=on_limit,
            accelerator_patterns=accelerator_patterns,
            max_accelerator_classes=max_accelerator_classes,
            max_failure_reasons=max_failure_reasons,
        )
        # The rv an informer held before the gap while it applies a relist diff, else 0 (see events.py).
        self._relist_since = 0

    # --- read side (debug endpoints, metric layer) ---------------------------------------------

    def runtime_info(self) -> list[RuntimeInfo]:
        return self._inventory.runtime_info()

    def runtimes(self) -> list[RuntimeProjection]:
        return self._inventory.runtimes()

    def runtime_ref_label(self, raw_ref: str) -> str:
        """The runtime_ref label a raw ref gets now (as the TrainJob edges carry it)."""
        return self._refs.label(raw_ref)

    def runtime(self, ref: str) -> RuntimeProjection | None:
        return self._refs.by_ref.get(ref)

    @property
    def runtimes_by_ref(self) -> Mapping[str, RuntimeProjection]:
        """The runtimes in the snapshot by ref label, live: what the TrainJob projector reads (never writes)
        to find a job's training step (``TrainJobProjector(runtimes=...)``). The dict itself, not a proxy:
        the projector looks a job's runtime up on every watch event of a running job."""
        return self._refs.by_ref

    def runtime_accelerators(self, runtime: RuntimeProjection) -> tuple[tuple[str, int], ...]:
        """(class, per-node count) of each accelerator the runtime's trainer container requests by itself
        (for /debug/snapshot); empty when none."""
        return self._events.accelerators.per_node(runtime.node_resources)

    @property
    def unknown_runtime_refs(self) -> int:
        """Distinct refs of live jobs whose runtime is not in the snapshot but keep their label."""
        return self._refs.unknown_in_use

    @property
    def history(self) -> EdgeHistory:
        """What is remembered beyond the projections: preempted jobs' edges, tombstones (read-only use)."""
        return self._history

    def published_history(self) -> tuple[list[str], list[str]]:
        """(uids that ran before, uids that were admitted before) for the Lease (app/handover/history.py)."""
        ran, admitted = self._history.published()
        return [uid_text(u) for u in ran], [uid_text(u) for u in admitted]

    def inherit_history(self, ran: Iterable[str], admitted: Iterable[str]) -> int:
        """Merge what another replica published: those jobs' next run (admission) is not a first one.
        Returns how many facts were new to this replica."""
        return self._history.inherit((compact_uid(u) for u in ran), (compact_uid(u) for u in admitted))

    def forget_inherited_except(self, present_uids: Iterable[bytes | str]) -> int:
        """Drop inherited facts of jobs absent from the synced caches (``present_uids``: uid keys)."""
        wanted = self._history.inherited_keys() | self._snapshots.inherited.keys()
        if not wanted:
            return 0
        present = {u for u in present_uids if u in wanted}
        return self._history.forget_inherited_except(present) + self._snapshots.forget_inherited_except(
            present
        )

    @property
    def inherited_steps(self) -> Mapping[bytes | str, int]:
        """Training steps read from the Lease, by uid key (rules.STEP_SETS ids), live: the TrainJob projector
        resolves a job it has not resolved yet from them first (``TrainJobProjector(steps=...)``)."""
        return self._snapshots.inherited

    def watch_jobs(self, jobs: Callable[[], Iterable[TrainJobProjection]]) -> None:
        """The cached TrainJobs (app/trainer/snapshots.py reads them once per runtime change)."""
        self._snapshots.watch_jobs(jobs)

    def published_snapshots(self) -> dict[str, frozenset[str]]:
        """uid -> training step of the jobs whose runtime changed since they were resolved, for the Lease
        (app/handover/history.py)."""
        return {uid_text(u): step for u, step in self._snapshots.published().items()}

    def inherit_snapshots(self, steps: Mapping[str, frozenset[str]]) -> int:
        """Merge training steps another replica published; returns how many were new to this replica."""
        return self._snapshots.inherit(steps, compact_uid)

    @property
    def terminal_count(self) -> int:
        return len(self._terminal)

    @property
    def pending_count(self) -> int:
        """JobCreated events waiting for their runtime."""
        return len(self._pending)

    def waiting_rvs(self, per_namespace: bool) -> dict[str, int]:
        """Per namespace label (all under "" unless ``per_namespace``), the lowest resourceVersion of an
        edge seen and not emitted yet: a creation waiting for its runtime, and its job's edges behind it.
        It reaches the sink later than events with higher rvs; a hand-over watermark must stay below it
        until then (app/handover/journal.py, ``waiting``)."""
        return self._pending.lowest_rvs(per_namespace)

    def jobs_gauge(self) -> dict[GaugeKey, int]:
        """A copy of the current TrainJob counts by effective (namespace, runtime_ref, state)."""
        return self._refs.counts()

    def listed_edges(self, job: TrainJobProjection, since: int) -> list[CountableEvent]:
        """The created and, if it is terminal, finished edges of ``job`` as a LIST showed it, tagged
        ``since`` (they happened after that rv): a take-over rebuilds with these the edges of jobs listed
        before this replica's journal began (app/handover/gap.py). Nothing is emitted or recorded."""
        edges: list[CountableEvent] = [self._events.created(job, since)]
        if job.result:
            edges.append(self._events.finished(job, since))
        return edges

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
        self._sink.on_countable(self._events.created(entry.job, entry.since))
        for event in entry.deferred:
            self._sink.on_countable(event)
        if entry.finished is not None:
            self._sink.on_countable(self._events.finished(entry.finished, entry.finished_since))

    # --- events ----------------------------------------------------------------------------------

    def _count_created(self, job: TrainJobProjection) -> None:
        raw = job.runtime_ref
        # Every job waits for an unknown runtime, even one that sets numNodes and resourcesPerNode: its
        # resourcesPerNode merges into the runtime's container, so the runtime's GPUs count too.
        if (
            self._wait > 0
            and raw != rules.UNKNOWN
            and raw not in self._refs.by_ref
            and not raw.startswith(self._unwatched_refs)
        ):
            self._pending.add(job, raw, self._clock() + self._wait, self._relist_since)
            return
        self._sink.on_countable(self._events.created(job, self._relist_since))

    def _count_started(self, job: TrainJobProjection) -> None:
        startup = rules.seconds_since_creation(job.created, self._wall_clock())
        if startup is None:
            return  # no creationTimestamp (malformed, logged): nothing to observe
        self._count_later(job, self._events.started(job, startup, self._relist_since))

    def _count_admitted(self, job: TrainJobProjection) -> None:
        """The admission of ``job``, seen leaving ``suspended``: timed by the controller's Resumed condition
        when it wrote one, else by this exporter's clock (no object records it: see the module docstring)."""
        at = job.resumed_time if job.flags & RESUMED else self._wall_clock()
        wait = rules.seconds_since_creation(job.created, at)
        if wait is None:
            return  # a timestamp is missing or unparsable (malformed, logged)
        self._count_later(job, self._events.admitted(job, wait, self._relist_since, at))

    def _count_later(self, job: TrainJobProjection, event: CountableEvent) -> None:
        """An edge after created: it waits behind a created edge still waiting for its runtime."""
        entry = self._pending.get(job.uid_key)
        if entry is not None:
            entry.deferred += (event,)
            return
        self._sink.on_countable(event)

    def _first_edges(self, job: TrainJobProjection, tomb: int) -> None:
        """Admitted and started edges of a not-terminal job first seen after the initial list (``tomb``: its
        tombstone bits when it is a deleted uid seen again, else 0). One first seen out of ``suspended`` with
        a Resumed condition was created suspended and admitted before it was seen; one without was either
        never queued or admitted before the controller wrote any condition: not observable."""
        uid = job.uid_key
        flags = job.flags
        history = self._history
        ran = bool(tomb & TOMB_RAN) or history.ran_before(uid)
        state = STATE_BY_FLAGS[flags & 7]
        if state != _SUSPENDED:
            if flags & RESUMED and not ran and not tomb & TOMB_ADMITTED and not history.admitted_before(uid):
                self._count_admitted(job)
            history.resumed_again(uid)
        elif tomb & TOMB_ADMITTED:
            history.suspended_again(uid)
        if state == _RUNNING:
            if not ran:
                self._count_started(job)
            history.running_again(uid)
        elif ran:
            history.left_running(uid)

    def _later_edges(self, old_state: str, new: TrainJobProjection) -> None:
        """Admitted and started edges of an update of a not-terminal job whose state changed."""
        uid = new.uid_key
        if uid in self._terminal:
            return  # it was terminal: every edge before that is behind us
        new_state = new.state
        history = self._history
        if new_state == _SUSPENDED:
            history.suspended_again(uid)  # suspended again (preempted): leaving it is no admission
        elif old_state == _SUSPENDED:
            if not history.admitted_before(uid) and not history.ran_before(uid):
                self._count_admitted(new)
            history.resumed_again(uid)
        if new_state == _RUNNING:
            if not history.ran_before(uid):
                self._count_started(new)
            history.running_again(uid)  # its projection says it ran while it runs
        elif old_state == _RUNNING:
            history.left_running(uid)

    def _count_finished(self, job: TrainJobProjection) -> None:
        entry = self._pending.get(job.uid_key)
        if entry is not None:  # keep per-uid order: finished after its created
            entry.finished = job
            entry.finished_since = self._relist_since
            return
        self._sink.on_countable(self._events.finished(job, self._relist_since))

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
            elif job.flags < _RESOLVED and job.runtime_ref != rules.UNKNOWN:
                self._guessed.add(uid)  # running or not, by the controller's naming until resolved
            return
        tomb = self._history.pop_tombstone(uid)
        seen = tomb is not None or uid in self._terminal or uid in self._pending
        if not seen:
            self._count_created(job)
        if job.result:
            if uid not in self._terminal:
                self._terminal.record(job, self._wall_clock())
                if tomb is None or not tomb & TOMB_TERMINAL:
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
        guessed = False
        if self._guessed and new_flags >= _RESOLVED and uid in self._guessed:
            self._guessed.discard(uid)
            guessed = old_flags < _RESOLVED
        if new.result:
            if uid not in self._terminal:
                self._terminal.record(new, self._wall_clock())
                self._history.terminal(uid)  # the terminal set guards it from now on
                if not old.result:  # the edge; an unrecorded old terminal state was never an edge we saw
                    self._count_finished(new)
        elif old_state != new_state:
            if guessed and _SUSPENDED not in (old_state, new_state):
                # In the initial list before its runtime existed (the service lists the runtimes first,
                # app/replica/service.py, so only a job of a runtime created later), it was read by the
                # controller's naming, a guess: resolved only now, this is its first reading, as if it were
                # the initial list's, not an edge.
                return
            self._later_edges(old_state, new)

    def _job_deleted(self, last: TrainJobProjection) -> None:
        self._maybe_flush()
        uid = last.uid_key
        if uid in self._pending:
            self._emit_pending(self._pending.take(uid))  # it was created; count it with what we know now
        self._refs.remove(_gauge_key(last))
        self._snapshots.job_deleted(uid)
        self._guessed.discard(uid)
        self._history.deleted(
            uid,
            terminal=self._terminal.pop(uid, None) is not None,
            running=last.state == _RUNNING,
            resumed=last.state != _SUSPENDED,
        )
        self._malformed_logged.discard(uid)

    def _check_malformed(self, job: TrainJobProjection) -> None:
        uid = job.uid_key
        if not job.flags & MALFORMED or uid in self._malformed_logged:
            return
        self._malformed_logged.add(uid)
        log.warning(
            "TrainJob %s (uid %s, resourceVersion %s) has unusable fields; counted with defaults",
            short(job.key),
            short(job.uid),
            short(job.resource_version),
        )

    # --- runtime notifications -------------------------------------------------------------------

    def _runtime_put(self, old: RuntimeProjection | None, new: RuntimeProjection) -> None:
        gone = self._inventory.put(old, new)
        if gone is not None:
            self._refs.runtime_gone(gone.ref)
        ref = new.ref
        if ref != rules.UNKNOWN:
            self._refs.runtime_known(new)
            for entry in self._pending.take_for(ref):
                self._emit_pending(entry)
        self._snapshots.runtimes_changed()
        self.flush_pending()
        self._gauge_sink.on_runtimes_changed()

    def _runtime_deleted(self, last: RuntimeProjection) -> None:
        self._inventory.delete(last)
        self._refs.runtime_gone(last.ref)
        self._snapshots.runtimes_changed()
        self.flush_pending()
        self._gauge_sink.on_runtimes_changed()
