"""PodFailures: the edge of a pod of a cached TrainJob reaching phase Failed, once per pod uid
(``kubeflow_trainer_trainjob_pod_failures_total``, app/metrics/counted.py).

Fed by the pods watch (``on_added`` / ``on_updated`` / ``on_deleted`` / ``on_relist``: an
``InformerHandler[PodProjection]``), it reads a failed pod's TrainJob in the TrainJob informers' caches
(``jobs``, app/trainer/pods.py ``TrainJobLookup``: nothing kept per TrainJob here) and sends one ``PodFailed``
per failed pod to its sink, the hand-over journal (app/handover/journal.py), which counts it while leading.

The edge, as TrainerState's for the TrainJobs (app/trainer/state.py):

* a pod seen going from any other phase to Failed (``status.phase`` is terminal: the kubelet never moves
  a Failed pod back), or added already Failed after the first list (created failed, or created and failed
  while the watch was down: a relist found it, ``since`` set);
* a pod already Failed in the pods watch's first list is sent once marked ``listed``: it failed at some
  rv at or below the one listed, maybe before any leader watched (docs/design/product.md §6, invariant 1,
  as for creations). The journal never counts it as it comes; only a take-over from a published pods
  watermark below it holds it as uncertain and settles it from the pods listed at the floor (counted if
  it was not Failed there), so that a successor whose first list came after the old leader's last
  published watermark loses no failure the old leader counted and no scrape showed;
* once per pod uid: a failed pod's uid is remembered while the pod is cached and, once deleted, among the
  last 4,096 deleted (a spurious delete and re-add, a relist, counts nothing again);
* of a cached TrainJob only: the pod's ``jobset-name`` label names a TrainJob cached in its namespace
  (rules/pods.py) and the pod is not older than it (else it is a previous job's of the same name). A pod
  that fails while no such TrainJob is cached is not counted (``unjoined``): its JobSet is not a TrainJob's
  (JobSet is used on its own too), or the TrainJob watch lags the pods watch by the pod's whole life
  (the Trainer creates the TrainJob's JobSet after the TrainJob, and the pods follow the JobSet's Jobs, so
  it is seconds behind at least). Not waiting for such a TrainJob keeps the watermark of the pods stream
  moving: a failure counted later than failures after it would be skipped by the next leader.

The reason: rules.pod_failure_reason (the pod's status reason, else its failed container's), with at most
``max_reasons`` distinct names beyond rules.POD_FAILURE_REASONS (then ``other``, one ``failure_reasons``
limit hit each), as ``finished_total``'s reasons. The runtime_ref: the TrainJob's label as
``finished_total`` gives it (``runtime_label``). The exemplar: the TrainJob (its uid and key).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

from app.trainer import rules
from app.trainer.event_builder import FAILURE_REASONS_LIMIT, MAX_FAILURE_REASONS, rv_int
from app.trainer.events import PodFailed, TrainerSink
from app.trainer.pods import PodProjection, TrainJobLookup, pod_trainjob
from app.trainer.projection_types import TrainJobProjection

__all__ = ["MAX_TOMBS", "PodFailures"]

MAX_TOMBS: Final = 4096  # deleted failed pods whose uid is still remembered
_FIXED: Final = frozenset(rules.POD_FAILURE_REASONS)


class PodFailures:
    """The pod-failure edges of one replica (the module docstring)."""

    def __init__(
        self,
        jobs: TrainJobLookup,
        *,
        max_reasons: int = MAX_FAILURE_REASONS,
        on_limit: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._sink: TrainerSink | None = None
        self._runtime_label: Callable[[str], str] = _raw
        self._max_reasons = max(0, max_reasons)
        self._reasons: set[str] = set()
        self._on_limit = on_limit
        self._wall_clock = wall_clock
        self._jobs = jobs
        # uids of the cached pods seen Failed (counted or not), as their projections store them (``uid_key``:
        # the object the projection holds, no second string a failed pod)
        self._failed: set[bytes | str] = set()
        self._tombs: deque[bytes | str] = deque()
        self._tomb_set: set[bytes | str] = set()
        self._since = 0  # during a relist diff: the rv the pods informer held before its gap
        self.counted = 0  # failures sent to the sink
        self.unjoined = 0  # failures of pods of no cached TrainJob (not counted)

    def connect(self, sink: TrainerSink, runtime_label: Callable[[str], str]) -> None:
        """Where the edges go (the journal) and the runtime_ref label of a raw ref (TrainerState's)."""
        self._sink = sink
        self._runtime_label = runtime_label

    # --- pods (InformerHandler[PodProjection]) -----------------------------------------------------------

    def on_added(self, obj: PodProjection, initial: bool) -> None:
        if obj.phase != rules.FAILED_PHASE:
            return
        if initial:
            # Failed before this replica watched: an edge only to a take-over whose pods floor lies below
            # it, which settles it from the pods listed at the floor (PodFailed.listed).
            uid = obj.uid_key
            if uid is not None and uid not in self._tomb_set:
                self._failed.add(uid)
                self._emit(obj, listed=True)
            return
        self._failure(obj)

    def on_updated(self, old: PodProjection, new: PodProjection) -> None:
        if new.phase == rules.FAILED_PHASE and not (
            old.phase == rules.FAILED_PHASE and old.uid_key == new.uid_key
        ):
            self._failure(new)

    def on_deleted(self, last: PodProjection) -> None:
        uid = last.uid_key
        if uid is not None and uid in self._failed:
            self._failed.discard(uid)
            if uid not in self._tomb_set:
                if len(self._tombs) >= MAX_TOMBS:
                    self._tomb_set.discard(self._tombs.popleft())
                self._tombs.append(uid)
                self._tomb_set.add(uid)

    def on_relist(self, since: int | None) -> None:
        """A pods informer starts (``since``: the rv it held before its gap) or ends (None) a relist diff."""
        self._since = since or 0

    # --- the edge ----------------------------------------------------------------------------------------

    @property
    def failed_pods(self) -> int:
        """Cached pods seen Failed (their uids are remembered)."""
        return len(self._failed)

    def _failure(self, pod: PodProjection) -> None:
        uid = pod.uid_key
        if uid is None or uid in self._failed or uid in self._tomb_set:
            return
        self._failed.add(uid)
        self._emit(pod, listed=False)

    def trainjob_of(self, pod: PodProjection) -> TrainJobProjection | None:
        """The cached TrainJob ``pod`` belongs to (its JobSet's name, and not older than the pod), or None:
        a failure of the pod is not counted now."""
        job = pod_trainjob(self._jobs, pod.namespace, pod.jobset)
        if job is None or (pod.created is not None and job.created is not None and pod.created < job.created):
            return None
        return job

    def _emit(self, pod: PodProjection, *, listed: bool) -> None:
        job = self.trainjob_of(pod)
        if job is None:
            if not listed:
                self.unjoined += 1
            return
        if self._sink is None:
            return
        if not listed:
            self.counted += 1
        self._sink.on_countable(
            PodFailed(
                rv=rv_int(pod.resource_version),
                uid=job.uid,
                pod_uid=pod.uid_key or "",
                namespace=job.namespace,  # the pod's (stored, not cut from its key again)
                runtime_ref=self._runtime_label(job.runtime_ref),
                reason=self._reason(pod),
                since=self._since,
                key=job.key,
                at=self._wall_clock(),
                listed=listed,
            )
        )

    def _reason(self, pod: PodProjection) -> str:
        """rules.pod_failure_reason, with at most ``max_reasons`` distinct names beyond the fixed ones."""
        label = rules.pod_failure_reason(pod.status_reason, pod.container_reason)
        if label in _FIXED or label in self._reasons:
            return label
        if len(self._reasons) < self._max_reasons:
            self._reasons.add(label)
            return label
        if self._on_limit is not None:
            self._on_limit(FAILURE_REASONS_LIMIT)
        return rules.OTHER_REASON


def _raw(ref: str) -> str:
    return ref
