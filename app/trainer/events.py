"""What the Trainer state tells the metric layer: countable edges and gauge changes.

Countable events carry the resourceVersion of the TrainJob state that produced them, so that a
new leader can skip what the previous leader already counted (see app/metrics/journal.py).

``since`` 0: the edge happened at ``rv`` (seen on a watch). Otherwise a relist found it: the watch had
missed it, so the edge happened after ``since`` (the rv the informer held before the gap) and at or before
``rv`` (the job's state in the list). A new leader whose floor lies between the two cannot tell from its
own data whether the previous leader counted the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class JobCreated:
    """A TrainJob first seen after the informer's initial list."""

    rv: int  # resourceVersion of the TrainJob state this edge was seen on
    uid: str
    namespace: str
    runtime_ref: str  # bounded label value (see rules.runtime_ref_label)
    requested_nodes: int
    accelerator_class: str  # resource name containing "gpu", or "none"
    requested_accelerators: int  # per-node quantity * nodes; 0 for "none"
    since: int = 0  # see the module docstring


@dataclass(frozen=True, slots=True)
class JobFinished:
    """A TrainJob's first observed not-terminal → terminal edge."""

    rv: int
    uid: str
    result: str  # "succeeded" | "failed"
    reason: str  # "none" on success, else one of rules.FAILURE_REASONS or "other"
    runtime_ref: str
    lifetime_seconds: float | None  # None when a timestamp is missing or unparsable
    namespace: str = ""  # not a label: it names the watch stream the edge came from (hand-over)
    since: int = 0  # see the module docstring


CountableEvent = JobCreated | JobFinished

# (namespace, runtime_ref, state) with state in rules.JOB_STATES
GaugeKey = tuple[str, str, str]


class TrainerSink(Protocol):
    """Receives what TrainerState derives from informer notifications. Called on the event loop."""

    def on_countable(self, event: CountableEvent) -> None: ...

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None:
        """The number of current TrainJobs for ``key`` is now ``value`` (0 means drop the series)."""
        ...

    def on_runtimes_changed(self) -> None:
        """The runtime snapshot changed; runtime_info must be re-read from it."""
        ...


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """Labels of one kubeflow_trainer_runtime_info series."""

    namespace: str  # "" for ClusterTrainingRuntime
    name: str
    api_group: str
    kind: str
    ml_policy: str
    pod_group_policy: str
    framework: str
