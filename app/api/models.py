"""Typed JSON responses of the HTTP API; they define openapi/openapi.json."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class ProbeResponse(BaseModel):
    status: str = Field(description="ok, or not-ready")
    reasons: list[str] = Field(
        default_factory=list, description="Why the probe fails (empty when it passes)."
    )


class InformerStatus(BaseModel):
    name: str = Field(description="resource[/namespace] the informer watches")
    synced: bool = Field(description="The initial list has been received.")
    stale: bool = Field(description="No event or bookmark within the inactivity timeout.")
    objects: int
    resource_version: str = Field(description="Last resourceVersion seen (list, event or bookmark).")
    last_event_age_seconds: float | None = Field(description="Seconds since the last byte from the watch.")


class RuntimeEntry(BaseModel):
    runtime_ref: str = Field(description="<apiGroup>/<kind>/<namespace>/<name>")
    kind: str
    namespace: str
    name: str
    ml_policy: str
    pod_group_policy: str
    framework: str
    num_nodes: int | None = Field(description="spec.mlPolicy.numNodes as given (None: defaults to 1).")
    default_nodes: int = Field(
        description="Training nodes a TrainJob without numNodes gets: mlPolicy.numNodes (default 1), or "
        "without an mlPolicy the trainer job's parallelism (default 1); with MPI runLauncherAsNode, the "
        "launcher too."
    )
    accelerator_class: str = Field(
        description="Trainer container accelerator resource (the first by name when several), or none."
    )
    accelerators_per_node: int
    accelerators: dict[str, int] = Field(
        description="Every accelerator resource the trainer container requests, with its per-node count."
    )
    resource_version: str


class RememberedSizes(BaseModel):
    """What a replica keeps besides its informer caches, each bounded (docs/reliability.md, "Memory")."""

    journal_entries: int = Field(
        description="Countable events remembered for a hand-over (at most the journal size)."
    )
    journal_size: int = Field(description="TRAINER_METRICS_HANDOVER_JOURNAL_SIZE.")
    held_edges: int = Field(
        description="Edges the leader holds until it settles them at its take-over floor."
    )
    unseen_counts: int = Field(
        description="Counts of this leader term not yet seen by every scraper (at most the journal size)."
    )
    tombstones: int = Field(description="Recently deleted TrainJob uids remembered (at most 4096).")
    edge_history: int = Field(
        description="Live TrainJobs that ran or were admitted before and do not now (at most the TrainJobs)."
    )
    inherited_history: int = Field(
        description="Such jobs known only from the Lease (at most 8192 ran and 8192 admitted)."
    )
    pending_created: int = Field(
        description="Creations waiting for their runtime (at most a few seconds each)."
    )
    metric_series: int = Field(
        description="Series of the Trainer metric families (bounded by the label caps)."
    )


class PodWatchStatus(BaseModel):
    namespace: str = Field(description="The namespace watched; empty: all namespaces.")
    status: Literal["checking", "watching", "forbidden", "absent", "off"] = Field(
        description="checking: access not known yet; watching; forbidden: RBAC denies listing pods; absent: "
        "the API server serves no pods; off: pod_series is false. Forbidden or absent: no pod series, "
        "everything else works (readiness is not affected)."
    )
    reason: str = Field(description="The API server's refusal while forbidden or absent, else empty.")
    informer: InformerStatus | None = Field(description="The pods informer, once access is granted.")


class PodSeriesStatus(BaseModel):
    enabled: bool = Field(description="pod_series: the pods watch and the pod series are on.")
    watches: list[PodWatchStatus]
    pods: dict[str, int] = Field(
        description="Pods of the watch by what they are to the pod series (exported, over_cap, "
        "invalid_labels, not_holding, no_trainjob, older_than_trainjob, no_jobset_label)."
    )
    max_pods: int = Field(description="pod_series_max_pods: the cap on pods with a pod_info series.")
    failed_pods: int = Field(description="Failed pods in the pods watch's cache (each counted at most once).")
    unjoined_failures: int = Field(
        description="Pods that failed while no TrainJob of theirs was cached, since start: not counted in "
        "kubeflow_trainer_trainjob_pod_failures_total (their JobSet is no TrainJob's, or the TrainJob watch "
        "lagged the pods watch for the pod's whole life)."
    )


class SnapshotResponse(BaseModel):
    runtimes: list[RuntimeEntry]
    informers: list[InformerStatus]
    trainjobs: int = Field(description="TrainJobs held in the cache.")
    terminal_entries: int = Field(description="Entries in the terminal-dedup set.")
    unknown_runtime_refs: int = Field(description="Distinct references to runtimes not in the snapshot.")
    remembered: RememberedSizes
    pods: PodSeriesStatus = Field(description="The pods watch and the pod series of this replica.")


class TerminalEntry(BaseModel):
    namespace: str
    name: str
    uid: str
    result: str
    reason: str
    terminal_time: datetime | None = Field(description="lastTransitionTime of the terminal condition.")
    recorded_time: datetime = Field(description="When this replica recorded the entry.")


class TerminalPage(BaseModel):
    total: int
    items: list[TerminalEntry]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        serialization_alias="continue",
        description="Pass as `continue` to get the next page; absent on the last page.",
    )
    note: str | None = Field(
        default=None,
        description="How to read these times, when they need it (simulate mode: the simulated cluster's "
        "clock runs ahead of the wall clock); absent otherwise.",
    )

    model_config = {"populate_by_name": True}


class LeadershipResponse(BaseModel):
    identity: str
    is_leader: bool
    election_enabled: bool
    holder: str | None = Field(description="Current holder as last observed in the Lease.")
    lease_name: str
    lease_namespace: str
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int | None
    watermark: int | None = Field(description="Highest TrainJob resourceVersion counted (over all streams).")
    watermarks: dict[str, int] = Field(
        default_factory=dict,
        description='Hand-over watermark per TrainJob watch stream ("" = all namespaces, else a namespace).',
    )
    observed_watermark: int | None = Field(description="Watermark last published in the Lease.")
    transitions_seen: int = Field(description="Leadership changes of this replica since start.")
    last_change: datetime | None


class ErrorResponse(BaseModel):
    detail: str
