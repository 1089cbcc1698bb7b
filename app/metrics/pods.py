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
caches (``jobs``, app/trainer/pods.py ``TrainJobLookup``), which are updated before their handler is told:
the join keeps per pod, never per TrainJob, so the many TrainJobs without a pod cost it nothing.

Bounded: at most ``max_pods`` info series (further pods wait and take the slot of the next one to go;
each pod going over the cap counts one ``pod_series`` limit hit), accelerator classes capped as for the
requested accelerators (then ``other``), per-pod labels only on the info series. A pod whose name, node or
replicated job is not a Kubernetes name has no info series but still counts in its job's sums; a pod
whose device counts are above the per-node ceiling (rules.MAX_ACCELERATORS_PER_NODE) counts no devices.

Cost: O(classes) per pod event that changes what the pod contributes; O(pods of the job) when a TrainJob
comes or goes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from app.metrics.per_job import ValueGaugeFamily
from app.trainer import rules
from app.trainer.event_builder import MAX_ACCELERATOR_CLASSES, OTHER_ACCELERATOR_CLASS
from app.trainer.pods import PodProjection, TrainJobLookup, pod_trainjob
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

JobKey = tuple[str, str]  # (namespace, TrainJob name)
InfoKey = tuple[str, str, str, str, str, str]


class _Share(NamedTuple):
    """What one joined pod contributes to its job's series."""

    job: JobKey
    info: InfoKey | None  # its info series' labels, while it holds a node (None: none)
    devices: rules.Devices  # while it holds a node
    restart: int | None


_NOTHING: Final = _Share(("", ""), None, (), None)


class _JobShares:
    """What the pods of one TrainJob share: its (namespace, name) tuple, and the shares of its pods that hold
    no node, one per restart attempt (with the shared tuple, ~80 B a finished pod saved, by tracemalloc)."""

    __slots__ = ("idle", "key")

    def __init__(self, key: JobKey) -> None:
        self.key = key
        self.idle: dict[int | None, _Share] = {}

    def idle_share(self, restart: int | None) -> _Share:
        share = self.idle.get(restart)
        if share is None:
            share = self.idle[restart] = _Share(self.key, None, (), restart)
        return share


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
        self.info = ValueGaugeFamily(
            _PREFIX + "pod_info",
            "A pod of the TrainJob bound to a node and not finished (always 1): joins per-pod series such as "
            "dcgm-exporter's to the TrainJob.",
            ("namespace", "trainjob", "pod", "node", "replicated_job", "runtime_ref"),
        )
        self.allocated = ValueGaugeFamily(
            _PREFIX + "allocated_accelerators",
            "Accelerators the TrainJob's pods bound to a node and not finished hold now, by class (each "
            "pod's request as the scheduler counts it; absent when 0).",
            ("namespace", "trainjob", "accelerator_class"),
        )
        self.restarts = ValueGaugeFamily(
            _PREFIX + "restarts",
            "The largest JobSet restart attempt (label jobset.sigs.k8s.io/restart-attempt) over the "
            "TrainJob's pods: how many times JobSet restarted it.",
            ("namespace", "trainjob"),
        )
        self.families: tuple[ValueGaugeFamily, ...] = (self.info, self.allocated, self.restarts)
        self._jobs = jobs
        # Every pod heard of, by (namespace, jobset-name), then key: the pods a TrainJob event rejoins. A dict
        # rather than a set of keys plus a dict of pods: one entry a pod, and a small dict is a third of a
        # small set's size.
        self._by_job: dict[JobKey, dict[str, PodProjection]] = {}
        self._shares: dict[str, _Share] = {}  # what each joined pod contributes
        # Pods with an info series: those whose share has one and that are not waiting (no set of keys: at
        # 20,000 pods a set costs ~100 B a pod).
        self._exported = 0
        self._waiting: dict[str, InfoKey] = {}  # pods over the cap, oldest first
        # Per job with pods (in ``_by_job``): what its pods' shares share.
        self._job_shares: dict[JobKey, _JobShares] = {}
        self._devices: dict[JobKey, dict[str, int]] = {}  # per job, per class label
        self._attempts: dict[JobKey, dict[int, int]] = {}  # per job, restart attempt -> pods
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
        for key, pod in (item for pods in self._by_job.values() for item in pods.items()):
            share = self._shares.get(key)
            if share is not None:
                if share.info is None:
                    counts["invalid_labels" if pod.holds_node else "not_holding"] += 1
            elif not pod.jobset:
                counts["no_jobset_label"] += 1
            else:
                job = pod_trainjob(self._jobs, pod.namespace, pod.jobset)
                counts["no_trainjob" if job is None else "older_than_trainjob"] += 1
        return counts

    @property
    def pods(self) -> int:
        return sum(len(pods) for pods in self._by_job.values())

    # --- TrainJobs (PodJobHandler) ---------------------------------------------------------------------

    # Told after the informer's cache changed: the pods of that namespace and name join what it holds now.

    def job_added(self, job: TrainJobProjection) -> None:
        self._rejoin(job)

    def job_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        if old.runtime_ref != new.runtime_ref or old.created != new.created or old.uid_key != new.uid_key:
            self._rejoin(new)

    def job_deleted(self, last: TrainJobProjection) -> None:
        self._rejoin(last)

    def _rejoin(self, job: TrainJobProjection) -> None:
        pods = self._by_job.get((job.namespace, job.name))
        if not pods:
            return  # nearly every TrainJob: no pod of it cached
        self._statuses = None
        changed = False
        for pod_key, pod in pods.items():
            changed |= self._update_share(pod_key, pod)
        if changed:
            self._changed()

    # --- pods (PodSeriesHandler) -------------------------------------------------------------------------

    def pod_added(self, pod: PodProjection) -> None:
        self._statuses = None
        key = pod.key
        self._by_job.setdefault((pod.namespace, pod.jobset), {})[key] = pod
        if self._update_share(key, pod):
            self._changed()

    def pod_updated(self, old: PodProjection, new: PodProjection) -> None:
        self._statuses = None
        old_job, new_job = (old.namespace, old.jobset), (new.namespace, new.jobset)
        if old_job != new_job:  # labels are mutable: a pod relabelled to another JobSet moves
            self._unindex(old.key, old_job)
        self._by_job.setdefault(new_job, {})[new.key] = new
        if self._update_share(new.key, new):
            self._changed()

    def pod_deleted(self, last: PodProjection) -> None:
        self._statuses = None
        key = last.key
        self._implausible.discard(key)
        self._unindex(key, (last.namespace, last.jobset))
        if self._update_share(key, None):
            self._changed()

    def _unindex(self, key: str, job: JobKey) -> None:
        pods = self._by_job.get(job)
        if pods is not None:
            pods.pop(key, None)
            if not pods:
                del self._by_job[job]
                self._job_shares.pop(job, None)

    # --- the join ----------------------------------------------------------------------------------------

    def _share_of(self, pod: PodProjection | None) -> _Share | None:
        """What ``pod`` contributes now: None when it is not joined to a cached TrainJob."""
        if pod is None:
            return None
        job = pod_trainjob(self._jobs, pod.namespace, pod.jobset)
        if job is None:
            return None
        if pod.created is not None and job.created is not None and pod.created < job.created:
            return None  # a previous TrainJob's pod (same name), not yet gone
        job_key = (pod.namespace, pod.jobset)
        shared = self._job_shares.get(job_key)
        if shared is None:
            shared = self._job_shares[job_key] = _JobShares(job_key)
        key = shared.key
        if not pod.holds_node:
            return shared.idle_share(pod.restart_attempt)
        info: InfoKey | None = None
        if (
            rules.is_object_name(pod.name)
            and rules.is_object_name(pod.node)
            and rules.is_label_value(pod.replicated_job)
        ):
            info = (pod.namespace, pod.jobset, pod.name, pod.node, pod.replicated_job, job.runtime_ref)
        devices = pod.devices
        if pod.implausible:
            if pod.key not in self._implausible:  # one limit hit per pod, not per event of it
                self._implausible.add(pod.key)
                if self._on_limit is not None:
                    self._on_limit(REQUESTED_QUANTITY_LIMIT)
            devices = ()
        return _Share(key, info, devices, pod.restart_attempt)

    def _update_share(self, key: str, pod: PodProjection | None) -> bool:
        """Apply the difference between what pod ``key`` contributed and what ``pod`` contributes (None: a
        deleted pod). True when a family changed."""
        old = self._shares.get(key)
        new = self._share_of(pod)
        if old == new:
            return False
        if new is None:
            del self._shares[key]
        else:
            self._shares[key] = new
        before, after = old or _NOTHING, new or _NOTHING
        changed = False
        if before.info != after.info:
            changed |= self._set_info(key, before.info, after.info)
        # Added before the old part is taken away: a sum or a max that stays is never dropped in between.
        if before.devices != after.devices or before.job != after.job:
            if after.devices:
                self._add_devices(after.job, after.devices, 1)
            if before.devices:
                self._add_devices(before.job, before.devices, -1)
            changed |= bool(before.devices or after.devices)
        if before.restart != after.restart or before.job != after.job:
            if after.restart is not None:
                self._add_attempt(after.job, after.restart, 1)
            if before.restart is not None:
                self._add_attempt(before.job, before.restart, -1)
            changed |= before.restart is not None or after.restart is not None
        return changed

    def _set_info(self, key: str, old: InfoKey | None, new: InfoKey | None) -> bool:
        changed = False
        if old is not None:
            if key not in self._waiting:
                self._exported -= 1
                self.info.drop(old)
                changed = True
            else:
                self._waiting.pop(key, None)
        if new is not None:
            if self._exported < self.max_pods:
                self._exported += 1
                self.info.set(new, 1.0)
                changed = True
            else:
                self._over_cap(key, new)
        elif old is not None and key not in self._waiting:
            changed |= self._promote()
        return changed

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
        self.info.set(info, 1.0)
        return True

    def _add_devices(self, job: JobKey, devices: rules.Devices, sign: int) -> None:
        per_class = self._devices.setdefault(job, {})
        for cls, count in devices:
            label = self._class_label(cls, counting=sign > 0)
            total = per_class.get(label, 0) + sign * count
            if total > 0:
                per_class[label] = total
                self.allocated.set((*job, label), float(total))
            else:
                per_class.pop(label, None)
                self.allocated.drop((*job, label))
        if not per_class:
            del self._devices[job]

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

    def _add_attempt(self, job: JobKey, attempt: int, sign: int) -> None:
        attempts = self._attempts.setdefault(job, {})
        pods = attempts.get(attempt, 0) + sign
        if pods > 0:
            attempts[attempt] = pods
        else:
            attempts.pop(attempt, None)
        if attempts:
            self.restarts.set(job, float(max(attempts)))
        else:
            del self._attempts[job]
            self.restarts.drop(job)

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
        self._inner.on_added(obj, initial)
        self._series.job_added(obj)

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self._inner.on_updated(old, new)
        self._series.job_updated(old, new)

    def on_deleted(self, last: TrainJobProjection) -> None:
        self._inner.on_deleted(last)
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
