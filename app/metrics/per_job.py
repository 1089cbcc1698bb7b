"""The opt-in per-TrainJob series (``per_trainjob_series``): one set of gauges per TrainJob, in the style of
kube-state-metrics (``_info``, ``_status_...``, ``_timestamp_seconds``), for the questions the aggregate
metrics cannot answer ("which job has been pending for two hours", "how far is my run, what is its loss").

Families (labels ``namespace``, ``trainjob`` first):

* ``kubeflow_trainer_trainjob_info{namespace, trainjob, runtime_ref}`` 1;
* ``kubeflow_trainer_trainjob_status_state{namespace, trainjob, state}`` 1, for the current state only (one
  series per job, not kube-state-metrics' one per possible state with 0s: five times fewer series);
* ``kubeflow_trainer_trainjob_created_timestamp_seconds{namespace, trainjob}``;
* from ``status.trainerStatus`` when the job has one (app/trainer/progress.py):
  ``..._status_progress_percent``, ``..._status_estimated_remaining_seconds``,
  ``..._status_trainer_metric{metric}`` (one per numeric trainer metric) and
  ``..._status_trainer_updated_timestamp_seconds``.

Gauges describe the cache as it is, so none is born at zero. They are exported with the other Trainer metrics
(``TrainerMetricState(extra_families=...)``), so by the leader only: every replica keeps them warm (a new
leader exports them at once) but only one serves them, so a ``count()`` or an alert over them never sees a job
once per replica, and the scrape cost of thousands of series is paid once.

Bounded: only namespaces of the allow-list (all watched ones when empty); at most ``max_jobs`` jobs exported,
first come first served; a job beyond it waits and takes the slot of the next exported job deleted. A job
whose namespace or name is not a Kubernetes name is not exported (no such object exists; it could only be
junk in a label). Self-telemetry (every replica): ``trainer_metrics_per_trainjob_jobs{status}``,
``trainer_metrics_per_trainjob_max_jobs`` and
``trainer_metrics_per_trainjob_skipped_trainer_metrics{reason}``; one log line the first time the cap is
reached.

Cost: O(1) per watch event of an exported job, and series re-rendered only when their value changed
(app/metrics/series_cache.py). A series' ``name{labels} `` prefix is not cached, unlike the aggregate
families': there are thousands of these series, most never re-rendered, so the prefix would double their
memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from app.metrics import protobuf as pb
from app.metrics.cached_family import Family
from app.metrics.formatting import LabelValues, floatToGoString
from app.trainer import rules
from app.trainer.progress import TrainerProgress
from app.trainer.projection_types import BAD_NAMESPACE, TrainJobProjection

__all__ = ["PerJobHandler", "PerJobSeries", "PerJobTelemetry", "ValueGaugeFamily"]

log = logging.getLogger(__name__)

_PREFIX: Final = "kubeflow_trainer_trainjob_"
DEFAULT_MAX_JOBS: Final = 10_000
SKIP_REASONS: Final = ("unparsable", "invalid_name", "over_cap")
_JOB: Final = ("namespace", "trainjob")


class ValueGaugeFamily(Family[LabelValues]):
    """A gauge family with float values; a series exists while it has a value (0.0 included).

    ``keep_chunks=False`` for series that change rarely: no text kept per series, a change re-renders its
    block (app/metrics/cached_family.py, "Without chunks"), kept compressed with ``compressed=True``."""

    __slots__ = ("values",)

    def __init__(
        self,
        name: str,
        documentation: str,
        label_names: Sequence[str],
        *,
        keep_chunks: bool = True,
        compressed: bool = False,
    ) -> None:
        super().__init__(
            name, documentation, "gauge", label_names, keep_chunks=keep_chunks, compressed=compressed
        )
        self.values: dict[LabelValues, float] = {}

    def set(self, key: LabelValues, value: float) -> None:
        values = self.values
        old = values.get(key)
        if old is None:
            self._add_series(key)
        elif old == value:
            return  # unchanged: keep the cached text
        values[key] = value
        self.touch(key)

    def drop(self, key: LabelValues) -> None:
        if self.values.pop(key, None) is not None:
            self._drop_series(key)

    def _render_series(self, key: LabelValues) -> bytes:
        return f"{self.name}{self._labelstr(key)} {floatToGoString(self.values[key])}\n".encode()

    def _render_protobuf(self, key: LabelValues) -> bytes:
        gauge = pb.field_bytes(pb.METRIC_GAUGE, pb.field_double(1, self.values[key]))
        return pb.metric_field(self._pb_label_pairs(key) + gauge)  # labels not cached: see the docstring

    def metric(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key, value in self.values.items():
            family.add_metric(key, value)
        return family


class PerJobSeries:
    """The per-TrainJob families and which jobs they show; fed by :class:`PerJobHandler`."""

    def __init__(
        self,
        *,
        namespaces: Iterable[str] = (),
        max_jobs: int = DEFAULT_MAX_JOBS,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """``namespaces``: the allow-list (empty: every namespace watched). ``on_change`` is called after
        a change of the families (``TrainerMetricState.extra_changed``)."""
        allowed = frozenset(namespaces)
        self._allowed: frozenset[str] | None = allowed or None
        self.max_jobs = max(0, max_jobs)
        self._on_change = on_change
        self.info = ValueGaugeFamily(
            _PREFIX + "info", "Information about a TrainJob (always 1).", (*_JOB, "runtime_ref")
        )
        self.state = ValueGaugeFamily(
            _PREFIX + "status_state",
            "The TrainJob's current state (always 1; one series, for the state it is in).",
            (*_JOB, "state"),
        )
        self.created = ValueGaugeFamily(
            _PREFIX + "created_timestamp_seconds",
            "The TrainJob's creationTimestamp, in seconds since the epoch.",
            _JOB,
        )
        self.progress = ValueGaugeFamily(
            _PREFIX + "status_progress_percent",
            "status.trainerStatus.progressPercentage: how complete the training is, 0 to 100.",
            _JOB,
        )
        self.remaining = ValueGaugeFamily(
            _PREFIX + "status_estimated_remaining_seconds",
            "status.trainerStatus.estimatedRemainingSeconds: the training's own estimate of its remaining "
            "time.",
            _JOB,
        )
        self.trainer_metric = ValueGaugeFamily(
            _PREFIX + "status_trainer_metric",
            "A numeric value of status.trainerStatus.metrics, by metric name (e.g. loss, eval_accuracy).",
            (*_JOB, "metric"),
        )
        self.updated = ValueGaugeFamily(
            _PREFIX + "status_trainer_updated_timestamp_seconds",
            "status.trainerStatus.lastUpdatedTime: when the training last reported, in seconds since the "
            "epoch.",
            _JOB,
        )
        self.families: tuple[ValueGaugeFamily, ...] = (
            self.info,
            self.state,
            self.created,
            self.progress,
            self.remaining,
            self.trainer_metric,
            self.updated,
        )
        self._exported: set[str] = set()  # keys of the jobs exported
        self._waiting: dict[str, TrainJobProjection] = {}  # over the cap, oldest first, latest state
        self._invalid: set[str] = set()  # keys whose namespace or name cannot be a label value
        self.skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)  # over the exported jobs' progress
        self._cap_logged = False

    # --- what the self-telemetry reads -------------------------------------------------------------------

    @property
    def exported(self) -> int:
        return len(self._exported)

    @property
    def over_cap(self) -> int:
        return len(self._waiting)

    @property
    def invalid(self) -> int:
        return len(self._invalid)

    @property
    def series_count(self) -> int:
        return sum(len(f) for f in self.families)

    # --- informer notifications (PerJobHandler) ---------------------------------------------------------

    def added(self, job: TrainJobProjection) -> None:
        if self._allowed is not None and job.namespace not in self._allowed:
            return
        key = job.key
        if job.flags & BAD_NAMESPACE or not rules.is_dns_label(job.name):
            self._invalid.add(key)
            return
        if len(self._exported) >= self.max_jobs:
            self._waiting[key] = job
            if not self._cap_logged:
                self._cap_logged = True
                log.warning(
                    "per-TrainJob series: %d TrainJobs exported, the cap (per_trainjob_max_jobs); further "
                    "TrainJobs are not exported until exported ones are deleted "
                    '(trainer_metrics_per_trainjob_jobs{status="over_cap"} counts them)',
                    self.max_jobs,
                )
            return
        self._export(job)

    def updated_job(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        key = new.key
        if key in self._exported:
            self._change(old, new)
        elif key in self._waiting:
            self._waiting[key] = new
        # else: not exported for good (namespace not allowed, or not a label value: neither can change)

    def deleted(self, last: TrainJobProjection) -> None:
        key = last.key
        if key in self._exported:
            self._exported.discard(key)
            self._unexport(last)
            if self._waiting:
                first = next(iter(self._waiting))
                self._export(self._waiting.pop(first))
        elif self._waiting.pop(key, None) is None:
            self._invalid.discard(key)

    # --- the series of one job ---------------------------------------------------------------------------

    def _export(self, job: TrainJobProjection) -> None:
        self._exported.add(job.key)
        ns, name = job.namespace, job.name
        self.info.set((ns, name, job.runtime_ref), 1.0)
        self.state.set((ns, name, job.state), 1.0)
        if job.created is not None:
            self.created.set((ns, name), job.created)
        self._set_progress(ns, name, None, job.progress)
        self._changed()

    def _unexport(self, job: TrainJobProjection) -> None:
        ns, name = job.namespace, job.name
        self.info.drop((ns, name, job.runtime_ref))
        self.state.drop((ns, name, job.state))
        self.created.drop((ns, name))
        self._set_progress(ns, name, job.progress, None)
        self._changed()

    def _change(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        ns, name = new.namespace, new.name
        changed = False
        if old.runtime_ref != new.runtime_ref:  # immutable in the API; a recreated job may differ
            self.info.drop((ns, name, old.runtime_ref))
            self.info.set((ns, name, new.runtime_ref), 1.0)
            changed = True
        old_state, new_state = old.state, new.state
        if old_state != new_state:
            self.state.drop((ns, name, old_state))
            self.state.set((ns, name, new_state), 1.0)
            changed = True
        if old.created != new.created:
            if new.created is None:
                self.created.drop((ns, name))
            else:
                self.created.set((ns, name), new.created)
            changed = True
        old_progress, new_progress = old.progress, new.progress
        if old_progress != new_progress:
            self._set_progress(ns, name, old_progress, new_progress)
            changed = True
        if changed:
            self._changed()

    def _set_progress(
        self, ns: str, name: str, old: TrainerProgress | None, new: TrainerProgress | None
    ) -> None:
        job = (ns, name)
        for family, value in (
            (self.progress, new.percent if new is not None else None),
            (self.remaining, new.remaining_seconds if new is not None else None),
            (self.updated, new.updated if new is not None else None),
        ):
            if value is None:
                family.drop(job)
            else:
                family.set(job, value)
        new_metrics = dict(new.metrics) if new is not None else {}
        if old is not None:
            for metric, _ in old.metrics:
                if metric not in new_metrics:
                    self.trainer_metric.drop((ns, name, metric))
            self._count_skipped(old, -1)
        for metric, value in new_metrics.items():
            self.trainer_metric.set((ns, name, metric), value)
        if new is not None:
            self._count_skipped(new, 1)

    def _count_skipped(self, progress: TrainerProgress, sign: int) -> None:
        skipped = self.skipped
        skipped["unparsable"] += sign * progress.skipped_unparsable
        skipped["invalid_name"] += sign * progress.skipped_invalid_name
        skipped["over_cap"] += sign * progress.skipped_over_cap

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


class PerJobHandler:
    """``InformerHandler[TrainJobProjection]``: the TrainerState's job handler, then the per-job series.

    Only built when the per-TrainJob series are on, so that off they cost no call at all."""

    def __init__(self, inner: Any, series: PerJobSeries) -> None:
        self._inner = inner
        self._series = series
        # The informer calls on_relist only if the handler has it (app/kube/cache.py); forward it as is.
        relist = getattr(inner, "on_relist", None)
        if relist is not None:
            self.on_relist = relist

    def on_added(self, obj: TrainJobProjection, initial: bool) -> None:
        self._inner.on_added(obj, initial)
        self._series.added(obj)

    def on_updated(self, old: TrainJobProjection, new: TrainJobProjection) -> None:
        self._inner.on_updated(old, new)
        self._series.updated_job(old, new)

    def on_deleted(self, last: TrainJobProjection) -> None:
        self._inner.on_deleted(last)
        self._series.deleted(last)


class PerJobTelemetry:
    """A prometheus_client Collector of the per-TrainJob series' self-telemetry (every replica)."""

    def __init__(self, series: PerJobSeries) -> None:
        self._series = series

    def collect(self) -> Iterator[Metric]:
        s = self._series
        jobs = GaugeMetricFamily(
            "trainer_metrics_per_trainjob_jobs",
            "TrainJobs of the allowed namespaces by per-TrainJob series status: exported, over_cap (not "
            "exported: per_trainjob_max_jobs reached), invalid_labels (namespace or name not a Kubernetes "
            "name).",
            labels=("status",),
        )
        jobs.add_metric(("exported",), s.exported)
        jobs.add_metric(("over_cap",), s.over_cap)
        jobs.add_metric(("invalid_labels",), s.invalid)
        yield jobs
        yield GaugeMetricFamily(
            "trainer_metrics_per_trainjob_max_jobs",
            "The cap on TrainJobs with per-TrainJob series (per_trainjob_max_jobs).",
            value=s.max_jobs,
        )
        skipped = GaugeMetricFamily(
            "trainer_metrics_per_trainjob_skipped_trainer_metrics",
            "trainerStatus.metrics entries of the exported TrainJobs left out, by reason: unparsable (the "
            "value is not a number), invalid_name (not a usable label value, or repeated), over_cap "
            "(per_trainjob_max_trainer_metrics reached).",
            labels=("reason",),
        )
        for reason in SKIP_REASONS:
            skipped.add_metric((reason,), s.skipped[reason])
        yield skipped
