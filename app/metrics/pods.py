"""The pod series: what each TrainJob's pods hold now, joined to the TrainJobs the informers cache.

Families (gauges, exported with the Trainer metrics, so by the leader only, as the per-TrainJob series):

* ``kubeflow_trainer_trainjob_pod_info{namespace, trainjob, pod, node, replicated_job, runtime_ref}`` 1 for
  each pod of a cached TrainJob that is bound to a node and not finished (rules.holds_node);
* ``kubeflow_trainer_trainjob_allocated_accelerators{namespace, trainjob, accelerator_class}``: the devices
  those pods hold (rules.pod_devices), summed per job and class; absent when 0;
* ``kubeflow_trainer_trainjob_restarts{namespace, trainjob}``: the largest JobSet ``restart-attempt`` over
  all of the job's pods, any phase; absent while none carries one.

The join: a pod belongs to the TrainJob named by its ``jobset-name`` label in its own namespace
(app/trainer/rules/pods.py), while that TrainJob is cached, and only if the pod is not older than the
TrainJob (a pod of a deleted TrainJob of the same name, still terminating, is never the new job's). Pods
and TrainJobs arrive in any order: a pod whose TrainJob is not cached yet waits, unjoined, and joins when it
comes; a deleted TrainJob takes its pods' series with it. The TrainJobs are read in the TrainJob informers'
caches (``jobs``, app/trainer/pods.py ``TrainJobLookup``), which are updated before their handler is told.
What the join keeps (its rules and record: app/metrics/pod_join.py): per namespace and JobSet name with a
pod, one record (its pods, their device sums and largest restart attempt); per pod, its place there. What a
pod adds to the series is computed again from the pod and its TrainJob whenever either changes, never kept,
and the many TrainJobs without a pod cost nothing.

The three families are kept per TrainJob and rendered from the records (app/metrics/record_family.py):
nothing is kept per series but its line, in its block of 64 TrainJobs, compressed
(app/metrics/deflate_parts.py ``DeflatedPart``). Their series change when pods come, bind, finish or go; a
change re-renders and compresses its block, and a gzip scrape, Prometheus' way, sends the pieces as they
are.

Bounded: at most ``max_pods`` info series (further pods wait and take the slot of the next one to go;
each pod going over the cap counts one ``pod_series`` limit hit), accelerator classes capped as for the
requested accelerators (then ``other``), per-pod labels only on the info series. A pod whose name, node or
replicated job is not a Kubernetes name has no info series but still counts in its job's sums; a pod
whose device counts are above the per-node ceiling (rules.MAX_ACCELERATORS_PER_NODE) counts no devices.

Cost: O(classes) per pod event that changes what the pod contributes, plus finding the pod among its job's
(O(pods of the job) up to pod_join.SMALL_JOB, a lookup beyond); O(pods of the job) when a TrainJob comes,
changes its runtime or goes, when the last pod of a job's largest restart attempt goes, and when a block of
the families holding the job is rendered again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from app.metrics.formatting import LabelValues
from app.metrics.pod_join import (
    NOTHING,
    Contribution,
    InfoKey,
    JobKey,
    JobPods,
    Largest,
    add_sums,
    contribution,
    joined,
    shared_sums,
    with_attempt,
)
from app.metrics.record_family import RecordFamily
from app.trainer import rules
from app.trainer.event_builder import MAX_ACCELERATOR_CLASSES, OTHER_ACCELERATOR_CLASS
from app.trainer.field_builders import object_key, split_key
from app.trainer.pods import PodProjection, TrainJobLookup, nameable_by_pods, pod_trainjob
from app.trainer.projection_types import TrainJobProjection

__all__ = ["POD_STATUSES", "PodJobHandler", "PodSeries", "PodSeriesHandler", "PodSeriesTelemetry"]

log = logging.getLogger(__name__)

_PREFIX: Final = "kubeflow_trainer_trainjob_"
DEFAULT_MAX_PODS: Final = 50_000
# app.metrics.telemetry.Limit values (app/trainer and app/metrics report them through on_limit)
POD_SERIES_LIMIT: Final = "pod_series"
ACCELERATOR_CLASSES_LIMIT: Final = "accelerator_classes"
REQUESTED_QUANTITY_LIMIT: Final = "requested_quantity"
# What the pods the watch holds are to the series (trainer_metrics_pod_series_pods{status}).
POD_STATUSES: Final = (
    "exported",  # an info series
    "over_cap",  # would have one, max_pods reached
    "invalid_labels",  # would have one, but its name, node or replicated job cannot be a label value
    "not_holding",  # of a cached TrainJob, but not bound to a node or finished: no info series
    "no_trainjob",  # no cached TrainJob of its JobSet's name in its namespace
    "older_than_trainjob",  # created before the cached TrainJob of that name: a previous job's
    "no_jobset_label",  # without the jobset-name label (a server that ignored the label selector)
)


class PodSeries:
    """The pod families and the join behind them; fed by :class:`PodSeriesHandler` (pods) and
    :class:`PodJobHandler` (TrainJobs)."""

    def __init__(
        self,
        jobs: TrainJobLookup,
        *,
        max_pods: int = DEFAULT_MAX_PODS,
        max_accelerator_classes: int = MAX_ACCELERATOR_CLASSES,
        on_change: Callable[[], None] | None = None,
        on_limit: Callable[[str], None] | None = None,
    ) -> None:
        """``jobs``: the cached TrainJobs (the informers' caches); ``on_change``: called after the families
        changed (``TrainerMetricState.extra_changed``); ``on_limit``: told each limit hit
        (``SelfTelemetry.limit_hit``)."""
        self.max_pods = max(0, max_pods)
        self._max_classes = max(0, max_accelerator_classes)
        self._on_change = on_change
        self._on_limit = on_limit
        self.info = RecordFamily(
            _PREFIX + "pod_info",
            "A pod of the TrainJob bound to a node and not finished (always 1): joins per-pod series such as "
            "dcgm-exporter's to the TrainJob.",
            ("namespace", "trainjob", "pod", "node", "replicated_job", "runtime_ref"),
            self._info_samples,
        )
        self.allocated = RecordFamily(
            _PREFIX + "allocated_accelerators",
            "Accelerators the TrainJob's pods bound to a node and not finished hold now, by class (each "
            "pod's request as the scheduler counts it; absent when 0).",
            ("namespace", "trainjob", "accelerator_class"),
            self._allocated_samples,
        )
        self.restarts = RecordFamily(
            _PREFIX + "restarts",
            "The largest JobSet restart attempt (label jobset.sigs.k8s.io/restart-attempt) over the "
            "TrainJob's pods: how many times JobSet restarted it.",
            ("namespace", "trainjob"),
            self._restarts_samples,
        )
        self.families: tuple[RecordFamily, ...] = (self.info, self.allocated, self.restarts)
        self._jobs = jobs
        # Every pod heard of, by its TrainJob's key (``trainjob_key``): the pods a TrainJob event rejoins, and
        # their sums.
        # Invariant: each pod's contribution to the families is ``contribution(pod, job)`` for the pod kept
        # here and the TrainJob as last told (pod events read it in the informer's cache, which is updated
        # before the TrainJob's handler is told; TrainJob events pass the old and new states).
        self._by_job: dict[JobKey, JobPods] = {}
        # Pods with an info series: those whose contribution has one and that are not waiting (no set of
        # keys: at 20,000 pods a set costs ~100 B a pod).
        self._exported = 0
        self._waiting: dict[str, InfoKey] = {}  # pods over the cap, oldest first
        self._classes: set[str] = set()
        self._implausible: set[str] = set()  # pods whose device counts were not believed (counted once)
        self._cap_logged = False
        # pod_statuses() as last counted, until a pod or a TrainJob with pods changes: every scrape reads it
        # (trainer_metrics_pod_series_pods), and counting walks every pod (~5 ms at 20,000 pods).
        self._statuses: dict[str, int] | None = None

    # --- what the self-telemetry and /debug read -------------------------------------------------------

    def pod_statuses(self) -> dict[str, int]:
        """How many pods of the watch are in each of ``POD_STATUSES`` (a copy)."""
        if self._statuses is None:
            self._statuses = self._count_statuses()
        return dict(self._statuses)

    def _count_statuses(self) -> dict[str, int]:
        counts = dict.fromkeys(POD_STATUSES, 0)
        counts["exported"] = self._exported
        counts["over_cap"] = len(self._waiting)
        for job_key, record in self._by_job.items():
            namespace, jobset = split_key(job_key)
            job = pod_trainjob(self._jobs, namespace, jobset)
            for pod in record.all():
                if joined(pod, job):
                    if contribution(pod, job).info is None:
                        counts["invalid_labels" if pod.holds_node else "not_holding"] += 1
                elif not jobset:
                    counts["no_jobset_label"] += 1
                else:
                    counts["no_trainjob" if job is None else "older_than_trainjob"] += 1
        return counts

    @property
    def pods(self) -> int:
        return sum(len(record) for record in self._by_job.values())

    # --- the series of a record, as they are now (RecordFamily renders them) ---------------------------

    def _info_samples(self, job_key: JobKey) -> Iterator[tuple[InfoKey, float]]:
        """The info series of the pods of ``job_key`` shown: what each pod's contribution names, but for the
        pods waiting over the cap."""
        record = self._by_job.get(job_key)
        if record is None:
            return
        job = pod_trainjob(self._jobs, *split_key(job_key))
        waiting = self._waiting
        for pod in record.all():
            info = contribution(pod, job).info
            if info is not None and pod.key not in waiting:
                yield info, 1.0

    def _allocated_samples(self, job_key: JobKey) -> Iterator[tuple[LabelValues, float]]:
        record = self._by_job.get(job_key)
        if record is not None:
            namespace, name = split_key(job_key)
            for label, total in record.devices:
                yield (namespace, name, label), float(total)

    def _restarts_samples(self, job_key: JobKey) -> Iterator[tuple[LabelValues, float]]:
        record = self._by_job.get(job_key)
        if record is not None and record.attempt is not None:
            yield split_key(job_key), float(record.attempt)

    # --- TrainJobs (PodJobHandler) ---------------------------------------------------------------------

    # Told after the informer's cache changed: the pods of that namespace and name join what it holds now.

    def job_added(self, job: TrainJobProjection) -> None:
        self._rejoin(job, None, self._known(job))

    def job_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        if old.runtime_ref != new.runtime_ref or old.created != new.created or old.uid_key != new.uid_key:
            self._rejoin(new, self._known(old), self._known(new))

    def job_deleted(self, last: TrainJobProjection) -> None:
        self._rejoin(last, self._known(last), None)

    @staticmethod
    def _known(job: TrainJobProjection) -> TrainJobProjection | None:
        """``job`` if a pod can name it (``pod_trainjob``), else None."""
        return job if nameable_by_pods(job) else None

    def _rejoin(
        self, job: TrainJobProjection, before: TrainJobProjection | None, after: TrainJobProjection | None
    ) -> None:
        """The job's pods move from what they added to ``before`` to what they add to ``after``."""
        record = self._by_job.get(job.key)
        if record is None:
            return  # nearly every TrainJob: no pod of it cached
        job_key = record.key
        self._statuses = None
        changed = False
        devices: dict[str, int] = {}
        largest: Largest = (None, 0)
        for pod in record.all():
            key = pod.key
            old, new = contribution(pod, before), contribution(pod, after)
            if old.info != new.info:
                changed |= self._set_info(key, old.info, new.info)
            self._note_implausible(key, pod, after)
            for cls, count in new.devices:
                label = self._class_label(cls, counting=new.devices != old.devices)
                devices[label] = devices.get(label, 0) + count
            largest = with_attempt(largest, new.restart)
        held = record.devices
        if dict(held) != devices:
            record.devices = shared_sums(tuple(devices.items()))
            self.allocated.resize(job_key, len(held), len(devices))
            changed = True
        changed |= self._set_attempt(record, largest)
        if changed:
            self._changed()

    # --- pods (PodSeriesHandler) -------------------------------------------------------------------------

    def pod_added(self, pod: PodProjection) -> None:
        self._place(pod)

    def pod_updated(self, old: PodProjection, new: PodProjection) -> None:
        if old.trainjob_key != new.trainjob_key:  # labels are mutable: it moves
            self._remove(old.key, old.trainjob_key)
        self._place(new)

    def pod_deleted(self, last: PodProjection) -> None:
        self._implausible.discard(last.key)
        self._remove(last.key, last.trainjob_key)

    def _place(self, pod: PodProjection) -> None:
        """``pod`` is the one of its key in its job's pods, adding what it adds instead of what the one it
        replaces added."""
        self._statuses = None
        job_key = pod.trainjob_key
        record = self._by_job.get(job_key)
        if record is None:
            record = self._by_job[job_key] = JobPods(job_key)
        key = pod.key
        previous = record.put(pod)
        job = pod_trainjob(self._jobs, *split_key(job_key))
        self._note_implausible(key, pod, job)
        old = NOTHING if previous is None else contribution(previous, job)
        if self._apply(key, old, contribution(pod, job), record=record, job=job):
            self._changed()

    def _remove(self, key: str, job_key: JobKey) -> None:
        self._statuses = None
        record = self._by_job.get(job_key)
        previous = None if record is None else record.pop(key)
        if record is None or previous is None:
            return
        job = pod_trainjob(self._jobs, *split_key(job_key))
        changed = self._apply(key, contribution(previous, job), NOTHING, record=record, job=job)
        if not len(record):
            del self._by_job[job_key]
        if changed:
            self._changed()

    # --- the join ----------------------------------------------------------------------------------------

    def _apply(
        self,
        key: str,
        old: Contribution,
        new: Contribution,
        *,
        record: JobPods,
        job: TrainJobProjection | None,
    ) -> bool:
        """Pod ``key`` adds ``new`` instead of ``old`` (its job's pods already hold it as it is now). True
        when a family changed."""
        if old == new:
            return False
        changed = False
        if old.info != new.info:
            changed |= self._set_info(key, old.info, new.info)
        # Added before the old part is taken away: a sum that stays is never dropped in between.
        if old.devices != new.devices:
            if new.devices:
                self._add_devices(record, new.devices, 1)
            if old.devices:
                self._add_devices(record, old.devices, -1)
            changed = True
        if old.restart != new.restart:
            attempt, at_attempt = with_attempt((record.attempt, record.at_attempt), new.restart)
            if old.restart is not None and old.restart == attempt:
                at_attempt -= 1
            largest: Largest = (attempt, at_attempt)
            if not at_attempt:  # the last pod of the largest attempt went: find the next largest
                largest = (None, 0)
                for pod in record.all():
                    largest = with_attempt(largest, contribution(pod, job).restart)
            changed |= self._set_attempt(record, largest)
        return changed

    def _note_implausible(self, key: str, pod: PodProjection, job: TrainJobProjection | None) -> None:
        """One limit hit per pod (not per event of it) whose device counts are not believed while it
        would hold them."""
        if pod.implausible and key not in self._implausible and pod.holds_node and joined(pod, job):
            self._implausible.add(key)
            if self._on_limit is not None:
                self._on_limit(REQUESTED_QUANTITY_LIMIT)

    def _set_attempt(self, record: JobPods, largest: Largest) -> bool:
        job_key = record.key
        previous, attempt = record.attempt, largest[0]
        record.attempt, record.at_attempt = largest
        if attempt == previous:
            return False
        self.restarts.resize(job_key, int(previous is not None), int(attempt is not None))
        return True

    def _set_info(self, key: str, old: InfoKey | None, new: InfoKey | None) -> bool:
        changed = False
        if old is not None:
            if key not in self._waiting:
                self._exported -= 1
                self._shown(old, -1)
                changed = True
            else:
                self._waiting.pop(key, None)
        if new is not None:
            if self._exported < self.max_pods:
                self._exported += 1
                self._shown(new, 1)
                changed = True
            else:
                self._over_cap(key, new)
        elif old is not None and key not in self._waiting:
            changed |= self._promote()
        return changed

    def _shown(self, info: InfoKey, delta: int) -> None:
        """The pod ``info`` names is shown (``delta`` 1) or no longer (-1)."""
        record = self._by_job[object_key(info[0], info[1])]
        before = record.shown
        record.shown = before + delta
        self.info.resize(record.key, before, record.shown)

    def _over_cap(self, key: str, info: InfoKey) -> None:
        self._waiting[key] = info
        if self._on_limit is not None:
            self._on_limit(POD_SERIES_LIMIT)
        if not self._cap_logged:
            self._cap_logged = True
            log.warning(
                "pod series: %d pods exported, the cap (pod_series_max_pods); further pods get no "
                "kubeflow_trainer_trainjob_pod_info series until exported ones go "
                '(trainer_metrics_pod_series_pods{status="over_cap"} counts them)',
                self.max_pods,
            )

    def _promote(self) -> bool:
        """A slot came free: the oldest waiting pod takes it."""
        if not self._waiting or self._exported >= self.max_pods:
            return False
        key = next(iter(self._waiting))
        info = self._waiting.pop(key)
        self._exported += 1
        self._shown(info, 1)
        return True

    def _add_devices(self, record: JobPods, devices: rules.Devices, sign: int) -> None:
        sums = before = record.devices
        for cls, count in devices:
            sums = add_sums(sums, self._class_label(cls, counting=sign > 0), sign * count)
        record.devices = shared_sums(sums)
        self.allocated.resize(record.key, len(before), len(sums))

    def _class_label(self, cls: str, *, counting: bool) -> str:
        """The accelerator_class label of ``cls``: itself while fewer than the cap are in use, else
        ``other`` (one limit hit per contribution, as for the requested accelerators)."""
        if cls in self._classes:
            return cls
        if len(self._classes) < self._max_classes:
            self._classes.add(cls)
            return cls
        if counting and self._on_limit is not None:
            self._on_limit(ACCELERATOR_CLASSES_LIMIT)
        return OTHER_ACCELERATOR_CLASS

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


class PodSeriesHandler:
    """``InformerHandler[PodProjection]`` of the pods watch."""

    def __init__(self, series: PodSeries) -> None:
        self._series = series

    def on_added(self, obj: PodProjection, initial: bool) -> None:
        self._series.pod_added(obj)

    def on_updated(self, old: PodProjection, new: PodProjection) -> None:
        self._series.pod_updated(old, new)

    def on_deleted(self, last: PodProjection) -> None:
        self._series.pod_deleted(last)


class JobListener(Protocol):
    """What is told of each TrainJob after the inner handler: the pod series' join (``PodSeries``)."""

    def job_added(self, job: TrainJobProjection) -> None: ...

    def job_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None: ...

    def job_deleted(self, last: TrainJobProjection) -> None: ...


class PodJobHandler:
    """``InformerHandler[TrainJobProjection]``: the inner job handler, then the pod series' join (or another
    ``JobListener``)."""

    def __init__(self, inner: Any, series: JobListener) -> None:
        self._inner = inner
        self._series = series
        # The informer calls on_relist only if the handler has it (app/kube/cache.py); forward it as is.
        relist = getattr(inner, "on_relist", None)
        if relist is not None:
            self.on_relist = relist

    def on_added(self, obj: TrainJobProjection, initial: bool) -> None:
        try:
            self._inner.on_added(obj, initial)
        finally:  # the join follows the cache even if the inner handler failed
            self._series.job_added(obj)

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        try:
            self._inner.on_updated(old, new)
        finally:  # the join follows the cache even if the inner handler failed
            self._series.job_updated(old, new)

    def on_deleted(self, last: TrainJobProjection) -> None:
        try:
            self._inner.on_deleted(last)
        finally:  # the join follows the cache even if the inner handler failed
            self._series.job_deleted(last)


class PodSeriesTelemetry:
    """A prometheus_client Collector of the pod series' self-telemetry (every replica)."""

    def __init__(self, series: PodSeries, watch_statuses: Callable[[], dict[str, str]]) -> None:
        """``watch_statuses``: the pods watch's status per scope (namespace, "" for all)."""
        self._series = series
        self._watch_statuses = watch_statuses

    def collect(self) -> Iterator[Metric]:
        pods = GaugeMetricFamily(
            "trainer_metrics_pod_series_pods",
            "Pods of the pods watch by what they are to the pod series: " + ", ".join(POD_STATUSES) + ".",
            labels=("status",),
        )
        for status, count in self._series.pod_statuses().items():
            pods.add_metric((status,), count)
        yield pods
        yield GaugeMetricFamily(
            "trainer_metrics_pod_series_max_pods",
            "The cap on pods with a per-pod info series of the pod series (pod_series_max_pods).",
            value=self._series.max_pods,
        )
        yield watch_status_family(self._watch_statuses())


WATCH_STATUSES: Final = ("checking", "watching", "forbidden", "absent", "off")


def watch_status_family(statuses: dict[str, str]) -> GaugeMetricFamily:
    """``trainer_metrics_pod_watch_status{namespace, status}`` 1 for each scope's current status."""
    family = GaugeMetricFamily(
        "trainer_metrics_pod_watch_status",
        "The pods watch per scope (namespace; empty: all namespaces), 1 for its status: checking (access "
        "not known yet), watching, forbidden (RBAC denies listing pods), absent (the API serves no pods), "
        "off (pod_series false). Forbidden or absent: no pod series, everything else works.",
        labels=("namespace", "status"),
    )
    for scope, status in statuses.items():
        family.add_metric((scope, status), 1)
    return family
