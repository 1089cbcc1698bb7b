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
  (rules/pods.py) and the pod is not older than it (else it is a previous job's of the same name, and never
  counted). A pod that fails while no TrainJob of that name is cached *waits* for it, up to
  ``WAIT_SECONDS`` (``MAX_WAITING`` at most, the oldest going first): the TrainJob watch may lag the pods
  watch (a stalled watch, a relist of many TrainJobs), and a leader that took over while its TrainJob
  watch lagged would otherwise never count a failure its predecessor had counted and no scrape had shown.
  When the TrainJob comes (``job_added``, the TrainJob informers' handler) the failure is sent as it was
  seen (its rv, its ``since``, ``listed``); while it waits, the pods stream's hand-over watermark stays
  below its rv (``waiting_rvs``, as TrainerState's for a creation waiting for its runtime), so a
  successor counts its own copy. One that waits in vain is not counted (``unjoined``): its JobSet is not a
  TrainJob's (JobSet is used on its own too), or its TrainJob went before this replica cached it.

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

__all__ = ["MAX_TOMBS", "MAX_WAITING", "WAIT_SECONDS", "PodFailures"]

MAX_TOMBS: Final = 4096  # deleted failed pods whose uid is still remembered
# A failure waits this long for its TrainJob: longer than a stalled TrainJob watch takes to be noticed and
# a relist of a large cluster to be applied (docs/design/k8s-protocol.md §6), far shorter than a job's life.
WAIT_SECONDS: Final = 60.0
MAX_WAITING: Final = 4096
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink: TrainerSink | None = None
        self._runtime_label: Callable[[str], str] = _raw
        self._max_reasons = max(0, max_reasons)
        self._reasons: set[str] = set()
        self._on_limit = on_limit
        self._wall_clock = wall_clock
        self._jobs = jobs
        self._failed: set[str] = set()  # uids of the cached pods seen Failed (counted or not)
        self._tombs: deque[str] = deque()
        self._tomb_set: set[str] = set()
        self._since = 0  # during a relist diff: the rv the pods informer held before its gap
        self._clock = clock
        # Failures waiting for their TrainJob, oldest first: pod uid -> (the pod, since, listed, when seen),
        # and their uids by (namespace, JobSet name).
        self._waiting: dict[str, tuple[PodProjection, int, bool, float]] = {}
        self._waiting_for: dict[tuple[str, str], list[str]] = {}
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
            if obj.uid not in self._tomb_set:
                self._failed.add(obj.uid)
                self._emit(obj, listed=True)
            return
        self._failure(obj)

    def on_updated(self, old: PodProjection, new: PodProjection) -> None:
        if new.phase == rules.FAILED_PHASE and not (old.phase == rules.FAILED_PHASE and old.uid == new.uid):
            self._failure(new)

    def on_deleted(self, last: PodProjection) -> None:
        uid = last.uid
        if uid in self._failed:
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

    @property
    def waiting(self) -> int:
        """Failures waiting for their TrainJob."""
        return len(self._waiting)

    def _failure(self, pod: PodProjection) -> None:
        uid = pod.uid
        if uid in self._failed or uid in self._tomb_set:
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
        if job is not None:
            self._send(pod, job, since=self._since, listed=listed)
        elif pod.jobset and pod_trainjob(self._jobs, pod.namespace, pod.jobset) is None:
            self._wait(pod, listed)
        else:  # no JobSet label, or a newer TrainJob of that name is cached: never joins
            self._unjoined(pod, listed=listed)

    # --- failures waiting for their TrainJob -------------------------------------------------------------

    def _wait(self, pod: PodProjection, listed: bool) -> None:
        self.expire()
        if len(self._waiting) >= MAX_WAITING:
            self._give_up(next(iter(self._waiting)))
        self._waiting[pod.uid] = (pod, self._since, listed, self._clock())
        self._waiting_for.setdefault((pod.namespace, pod.jobset), []).append(pod.uid)

    def job_added(self, job: TrainJobProjection) -> None:
        """A TrainJob is cached now (the TrainJob informers' handler, after their cache): the failures of
        its pods that waited for it are sent, in the order they came."""
        if not self._waiting_for:
            return
        uids = self._waiting_for.pop((job.namespace, job.name), None)
        for uid in uids or ():
            pod, since, listed, _ = self._waiting.pop(uid)
            joined = self.trainjob_of(pod)
            if joined is not None:
                self._send(pod, joined, since=since, listed=listed)
            else:  # older than this TrainJob: a previous job's of the same name
                self._unjoined(pod, listed=listed)

    def job_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        """A TrainJob changed: nothing waits for a TrainJob that was cached already."""

    def job_deleted(self, last: TrainJobProjection) -> None:
        """A TrainJob went: nothing waits for a TrainJob that was cached."""

    def expire(self, now: float | None = None) -> int:
        """Give up the failures that waited ``WAIT_SECONDS`` (not counted); returns how many. Called as
        failures come and by the service's housekeeping."""
        if not self._waiting:
            return 0
        limit = (self._clock() if now is None else now) - WAIT_SECONDS
        expired = 0
        while self._waiting:
            uid, (_, _, _, seen) = next(iter(self._waiting.items()))  # the oldest (they wait in order)
            if seen > limit:
                break
            self._give_up(uid)
            expired += 1
        return expired

    def _give_up(self, uid: str) -> None:
        pod, _, listed, _ = self._waiting.pop(uid)
        key = (pod.namespace, pod.jobset)
        uids = self._waiting_for.get(key)
        if uids is not None:
            uids.remove(uid)
            if not uids:
                del self._waiting_for[key]
        self._unjoined(pod, listed=listed)

    def waiting_rvs(self, stream_of: Callable[[str], str]) -> dict[str, int]:
        """Per pods stream (``stream_of(namespace)``), the lowest rv of a failure waiting for its TrainJob:
        it reaches the sink later than failures with higher rvs, so a hand-over watermark stays below it
        (app/handover/journal.py, ``waiting``)."""
        out: dict[str, int] = {}
        for pod, _, _, _ in self._waiting.values():
            stream = stream_of(pod.namespace)
            rv = rv_int(pod.resource_version)
            if rv < out.get(stream, rv + 1):
                out[stream] = rv
        return out

    # --- the edge ----------------------------------------------------------------------------------------

    def _unjoined(self, pod: PodProjection, *, listed: bool) -> None:
        """``pod``'s failure is not counted: no TrainJob of it is cached (a listed one was never an edge
        this replica counts as it comes)."""
        if not listed:
            self.unjoined += 1

    def _send(self, pod: PodProjection, job: TrainJobProjection, *, since: int, listed: bool) -> None:
        if self._sink is None:
            return
        if not listed:
            self.counted += 1
        self._sink.on_countable(
            PodFailed(
                rv=rv_int(pod.resource_version),
                uid=job.uid,
                pod_uid=pod.uid,
                namespace=pod.namespace,
                runtime_ref=self._runtime_label(job.runtime_ref),
                reason=self._reason(pod),
                since=since,
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
