"""Wire types: the msgspec structs the informer decodes Trainer objects into (the typed fast path).

They name only the JSON paths the metrics read, so msgspec skips everything else (managedFields,
annotations...) at C speed. Field names are the JSON names. A value of the wrong JSON type fails
decoding (``msgspec.ValidationError``), and the informer then takes the tolerant path
(app/trainer/informer_projectors.py ``from_json``), which salvages what it can.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# A quantity in a ResourceList: a string ("500m"), or a number when the object was written as YAML.
Quantity = int | float | str

# name and uid have no default and must not be empty: an object without them fails typed decoding and
# goes through from_json, which drops it (no key / uid to track it by). The typed path admits only what
# from_json admits.
_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class Resources(msgspec.Struct, forbid_unknown_fields=False):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


# --- TrainJob ----------------------------------------------------------------------------------


class JobMeta(msgspec.Struct, forbid_unknown_fields=False):
    name: _NonEmpty
    uid: _NonEmpty
    namespace: str = ""
    resourceVersion: str = ""
    generation: int | None = None
    creationTimestamp: str | None = None


class RuntimeRef(msgspec.Struct, forbid_unknown_fields=False):
    name: str = ""
    apiGroup: str | None = None
    kind: str | None = None


class Trainer(msgspec.Struct, forbid_unknown_fields=False):
    numNodes: int | None = None
    resourcesPerNode: Resources | None = None


class JobSpec(msgspec.Struct, forbid_unknown_fields=False):
    runtimeRef: RuntimeRef | None = None
    trainer: Trainer | None = None
    suspend: bool | None = None


class Condition(msgspec.Struct, forbid_unknown_fields=False, gc=False):
    """A TrainJob status condition (``rules.ConditionLike``). The tolerant path builds these too, from
    whatever JSON it finds, so both paths feed the same rules."""

    type: str = ""
    status: str = ""
    reason: str = ""
    lastTransitionTime: str | None = None


class ChildJobStatus(msgspec.Struct, forbid_unknown_fields=False):
    # The replicated job's name: only the training step's jobs make a TrainJob running (rules.training_ready).
    name: str = ""
    # ready, not active: active counts child Jobs with a pod running *or pending* (rules.job_state).
    ready: int | None = None


class JobStatus(msgspec.Struct, forbid_unknown_fields=False):
    conditions: list[Condition] | None = None
    jobsStatus: list[ChildJobStatus] | None = None


class TrainJobStatusWire(msgspec.Struct, forbid_unknown_fields=False):
    """A TrainJob read without its spec: enough for an update that keeps the cached projection's generation.

    The API server bumps ``metadata.generation`` on every write to a custom resource's spec (and not on a
    status write), so an update with the cached generation, key and uid has the cached spec, and nearly every
    watch event (a status write) needs only this. msgspec skips ``spec`` unread: about a fifth of the typed
    decode's time on a TrainJob watch line (docs/benchmarks.md)."""

    metadata: JobMeta
    status: JobStatus | None = None


class TrainJobWire(TrainJobStatusWire, forbid_unknown_fields=False):
    """The parts of a TrainJob that the metrics read."""

    spec: JobSpec | None = None


# --- TrainJob with status.trainerStatus (only with the per-TrainJob series on) -------------------
# A separate wire type rather than an optional field of JobStatus: msgspec skips an undeclared field without
# building it, so with the per-TrainJob series off (the default) trainerStatus costs no decoding at all.


class TrainerMetricWire(msgspec.Struct, forbid_unknown_fields=False, gc=False):
    name: str = ""
    # A string by the CRD; a number is taken too (app/trainer/progress.py metric_value decides).
    value: str | int | float = ""


class TrainerStatusWire(msgspec.Struct, forbid_unknown_fields=False):
    progressPercentage: int | None = None
    estimatedRemainingSeconds: int | None = None
    lastUpdatedTime: str | None = None
    metrics: list[TrainerMetricWire] | None = None


class JobStatusWithTrainer(JobStatus, forbid_unknown_fields=False):
    trainerStatus: TrainerStatusWire | None = None


class TrainJobWithTrainerWire(TrainJobWire, forbid_unknown_fields=False):
    """``TrainJobWire`` plus ``status.trainerStatus``."""

    status: JobStatusWithTrainer | None = None


class TrainJobStatusWithTrainerWire(TrainJobStatusWire, forbid_unknown_fields=False):
    """``TrainJobStatusWire`` plus ``status.trainerStatus``."""

    status: JobStatusWithTrainer | None = None


# --- TrainingRuntime / ClusterTrainingRuntime --------------------------------------------------


class RuntimeMeta(msgspec.Struct, forbid_unknown_fields=False):
    name: _NonEmpty
    uid: _NonEmpty
    namespace: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None


class Container(msgspec.Struct, forbid_unknown_fields=False):
    name: str = ""
    resources: Resources | None = None


class PodSpec(msgspec.Struct, forbid_unknown_fields=False):
    containers: list[Container] | None = None


class PodTemplate(msgspec.Struct, forbid_unknown_fields=False):
    spec: PodSpec | None = None


class JobTemplateSpec(msgspec.Struct, forbid_unknown_fields=False):
    parallelism: int | None = None  # the trainer job's node count when the runtime has no mlPolicy
    template: PodTemplate | None = None


class TemplateMeta(msgspec.Struct, forbid_unknown_fields=False):
    labels: dict[str, str] | None = None


class JobTemplate(msgspec.Struct, forbid_unknown_fields=False):
    metadata: TemplateMeta | None = None
    spec: JobTemplateSpec | None = None


class ReplicatedJob(msgspec.Struct, forbid_unknown_fields=False):
    name: str = ""
    template: JobTemplate | None = None


class JobSetSpec(msgspec.Struct, forbid_unknown_fields=False):
    replicatedJobs: list[ReplicatedJob] | None = None


class JobSetTemplate(msgspec.Struct, forbid_unknown_fields=False):
    spec: JobSetSpec | None = None


class RuntimeSpec(msgspec.Struct, forbid_unknown_fields=False):
    # The policies are small and their recognition needs the set of keys (an mlPolicy with only an
    # unknown policy is "unknown"), so they stay generic; the rules read both paths the same way.
    mlPolicy: Any = None
    podGroupPolicy: Any = None
    template: JobSetTemplate | None = None


class RuntimeWire(msgspec.Struct, forbid_unknown_fields=False):
    """The parts of a TrainingRuntime / ClusterTrainingRuntime that the metrics read."""

    metadata: RuntimeMeta
    spec: RuntimeSpec | None = None
