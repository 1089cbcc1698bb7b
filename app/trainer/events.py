"""What the Trainer state tells the metric layer: countable edges and gauge changes.

Countable events (created, finished, started, admitted; a pod failed) carry the resourceVersion of the
TrainJob (or pod) state that produced them, so that a new leader can skip what the previous leader already
counted (see app/handover/journal.py).

``since`` 0: the edge happened at ``rv`` (seen on a watch). Otherwise a relist found it: the watch had
missed it, so the edge happened after ``since`` (the rv the informer held before the gap) and at or before
``rv`` (the job's state in the list). A new leader whose floor lies between the two cannot tell from its
own data whether the previous leader counted the edge.

Events are ``gc=False`` structs (they hold only strings and numbers, so they can be in no cycle): the
hand-over journal keeps the last 100,000 of them, and objects the cyclic GC tracks would make every full
collection walk them all, a pause of tens of milliseconds on the event loop under a watch firehose
(bench P5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec


class JobCreated(msgspec.Struct, frozen=True, gc=False):
    """A TrainJob first seen after the informer's initial list (``at``: its creationTimestamp).

    It requests one or more accelerator classes: the first is ``accelerator_class`` /
    ``requested_accelerators`` ("none" and 0 when it requests none), any further ones are in
    ``more_accelerators``; ``accelerators`` lists them all, one histogram observation each.

    A request above the ceilings of ``rules.requests_within_ceilings`` is not believed: the job is counted
    as created, but ``nodes_observed`` / ``accelerators_observed`` are False and the metric layer leaves
    it out of the requested-nodes / requested-accelerators histograms.
    """

    rv: int  # resourceVersion of the TrainJob state this edge was seen on
    uid: str
    namespace: str
    runtime_ref: str  # bounded label value (see rules.runtime_ref_label)
    requested_nodes: int
    accelerator_class: str  # accelerator resource name (capped: "other"), or "none"
    requested_accelerators: int  # per-node quantity * nodes; 0 for "none"
    since: int = 0  # see the module docstring
    # Further (class, per-node quantity * nodes) pairs, for a job requesting several classes (rare: a
    # field with a default rather than a list in every event keeps the common event as small as before).
    more_accelerators: tuple[tuple[str, int], ...] = ()
    nodes_observed: bool = True  # requested_nodes goes into the histogram
    accelerators_observed: bool = True  # the accelerator counts go into the histogram
    # The TrainJob behind the event, for exemplars (app/metrics/exemplars.py): its "namespace/name" (the
    # projection's own string, shared, not a copy) and when the event happened (epoch seconds; None when
    # the object does not say). 16 bytes per event: the journal keeps 100,000 of them.
    key: str = ""
    at: float | None = None

    @property
    def accelerators(self) -> tuple[tuple[str, int], ...]:
        """Every (accelerator_class, requested_accelerators) pair, classes distinct, in name order."""
        return ((self.accelerator_class, self.requested_accelerators), *self.more_accelerators)


class JobFinished(msgspec.Struct, frozen=True, gc=False):
    """A TrainJob's first observed not-terminal → terminal edge."""

    rv: int
    uid: str
    result: str  # "succeeded" | "failed"
    reason: str  # "none" on success, else the failure reason's label (rules.reason_bucket, capped)
    runtime_ref: str
    lifetime_seconds: float | None  # None when a timestamp is missing or unparsable
    namespace: str = ""  # not a label: it names the watch stream the edge came from (hand-over)
    since: int = 0  # see the module docstring
    key: str = ""  # as JobCreated's; ``at``: the terminal condition's lastTransitionTime
    at: float | None = None


class JobStarted(msgspec.Struct, frozen=True, gc=False):
    """A TrainJob's first observed running state (a training-step child Job ready; rules.job_state), once per
    uid.

    ``startup_seconds`` is the time to running: this replica's wall clock when it saw the job running, minus
    creationTimestamp (no Kubernetes object records when pods became ready, so it is an upper bound: the
    watch latency is in it, and for a start a relist found, the watch gap). Taken when the edge is seen,
    so a replica that replays it on takeover observes the value the replica that saw it measured.
    """

    rv: int
    uid: str
    runtime_ref: str
    startup_seconds: float
    namespace: str = ""  # not a label: the watch stream the edge came from (hand-over)
    since: int = 0  # see the module docstring
    key: str = ""  # as JobCreated's; ``at``: when it was seen running (creationTimestamp + startup_seconds)
    at: float | None = None


class JobAdmitted(msgspec.Struct, frozen=True, gc=False):
    """A TrainJob created suspended first seen leaving ``suspended``, before it was ever seen running: a queue
    (Kueue) admitted it. ``wait_seconds``: the Suspended=False/Resumed condition's lastTransitionTime minus
    creationTimestamp (both written by the cluster, so exact to the second) when the controller wrote one,
    else this exporter's wall clock when it saw the job leave ``suspended`` minus creationTimestamp (an upper
    bound: app/trainer/state.py); once per uid."""

    rv: int
    uid: str
    runtime_ref: str
    wait_seconds: float
    namespace: str = ""  # not a label: the watch stream the edge came from (hand-over)
    since: int = 0  # see the module docstring
    key: str = ""  # as JobCreated's; ``at``: when it was admitted (creationTimestamp + wait_seconds)
    at: float | None = None


class PodFailed(msgspec.Struct, frozen=True, gc=False):
    """A pod of a cached TrainJob first observed in phase Failed (app/trainer/pod_failures.py), once per pod
    uid. Its own stream of resourceVersions: the pods watch's (app/handover/streams.py).

    ``uid`` and ``key`` are the TrainJob's (its exemplar, as every event's); the pod is ``pod_uid``, which
    the hand-over settles an uncertain failure by (app/metrics/counted.py, the row's ``subject``)."""

    rv: int  # resourceVersion of the pod state the failure was seen on
    uid: str  # the TrainJob's
    pod_uid: bytes | str  # as the pod's projection stores it (``compact_uid``: the same object, no copy)
    namespace: str
    runtime_ref: str  # the TrainJob's runtime_ref label
    reason: str  # rules.pod_failure_reason, capped
    since: int = 0  # see the module docstring (the pods informer's rv before its gap)
    key: str = ""  # the TrainJob's "namespace/name"; ``at``: when the pod was seen failed (wall clock)
    at: float | None = None
    # Already Failed in the pods watch's first list: it failed at some rv at or below ``rv``, maybe before
    # any leader watched. Never counted as it comes; a take-over from a pods watermark below ``rv`` holds it
    # as uncertain and settles it from the pods at the floor (app/handover/journal.py ``_verdict``).
    listed: bool = False


CountableEvent = JobCreated | JobFinished | JobStarted | JobAdmitted | PodFailed

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
