"""What the truth has counted, as values: one record per TrainJob event the metrics observe, and the
immutable ``TruthSnapshot`` whose differences are a window's expected deltas.

Split from ``sim/kubesim/trainer/truth.py`` so that the tests' vocabulary (records, snapshots, windows) does
not depend on how the tally is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

CreatedKey = tuple[str, str]  # (namespace, runtime_ref)
FinishedKey = tuple[str, str, str]  # (result, reason bucket, runtime_ref)
JobsKey = tuple[str, str, str]  # (namespace, runtime_ref, state)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What ``kubeflow_trainer_trainjob_requested_*`` should observe for one created TrainJob."""

    namespace: str
    name: str
    runtime_ref: str
    nodes: int
    # (accelerator_class, per-node count * nodes) for each class requested, or (("none", 0),): one
    # observation of kubeflow_trainer_trainjob_requested_accelerators each.
    accelerators: tuple[tuple[str, int], ...]
    # The generator wrote an odd-but-valid shape (odd quantity, foreign or missing runtime, ...): the
    # numbers above follow this module's reading of the rules, which another reading may round otherwise.
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """One TrainJob's first terminal write: what ``finished_total`` and ``lifetime_seconds`` should see."""

    namespace: str
    name: str
    result: str
    reason: str
    runtime_ref: str
    lifetime_seconds: float | None
    resource_version: int  # of the write that made it terminal


@dataclass(frozen=True, slots=True)
class StartedJob:
    """One TrainJob's first write in the running state (not terminal): what
    ``kubeflow_trainer_trainjob_startup_seconds`` should observe. ``startup_seconds`` is the writer's clock at
    that write minus creationTimestamp: a watcher sees the write a little later, never earlier."""

    namespace: str
    name: str
    runtime_ref: str
    startup_seconds: float
    resource_version: int


@dataclass(frozen=True, slots=True)
class AdmittedJob:
    """One TrainJob created suspended, at its first write out of ``suspended`` while not terminal and before
    it ever ran: what ``kubeflow_trainer_trainjob_admission_wait_seconds`` should observe. ``wait_seconds``:
    the Suspended=False/Resumed condition's lastTransitionTime minus creationTimestamp; ``by_clock``: the job
    had no such condition (Kueue admitted it before the controller wrote any), so the writer's clock at that
    write minus creationTimestamp, which an exporter reads later, by its watch latency."""

    namespace: str
    name: str
    runtime_ref: str
    wait_seconds: float
    resource_version: int
    by_clock: bool = False


@dataclass(frozen=True, slots=True)
class TruthSnapshot:
    """An immutable copy of the truth at one moment; diff two of them to get a window's deltas."""

    resource_version: int  # store revision when the snapshot was taken (0 when unknown)
    created: Mapping[CreatedKey, int]
    finished: Mapping[FinishedKey, int]
    jobs: Mapping[JobsKey, int]  # current TrainJobs by state; zero entries are dropped
    requests: Mapping[str, JobRequest]  # by uid, every TrainJob created so far
    terminal: Mapping[str, FinishedJob]  # by uid, every TrainJob finished so far
    started: Mapping[str, StartedJob] = field(default_factory=lambda: MappingProxyType({}))  # by uid
    admitted: Mapping[str, AdmittedJob] = field(default_factory=lambda: MappingProxyType({}))  # by uid
    # Observations of kubeflow_trainer_trainjob_requested_accelerators by runtime_ref over every TrainJob
    # created so far (one per accelerator class a job requests, or one "none"): a running total, so that
    # a window's count survives a caller dropping the records of deleted jobs from ``requests``.
    accelerator_observations: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # kubeflow_trainer_trainjob_pod_failures_total by (namespace, runtime_ref, reason) (truth_pods.py)
    pod_failures: Mapping[tuple[str, str, str], int] = field(default_factory=lambda: MappingProxyType({}))

    def created_since(self, before: TruthSnapshot) -> dict[CreatedKey, int]:
        return _counter_delta(self.created, before.created)

    def finished_since(self, before: TruthSnapshot) -> dict[FinishedKey, int]:
        return _counter_delta(self.finished, before.finished)

    def accelerator_observations_since(self, before: TruthSnapshot) -> dict[str, int]:
        return _counter_delta(self.accelerator_observations, before.accelerator_observations)

    def pod_failures_since(self, before: TruthSnapshot) -> dict[tuple[str, str, str], int]:
        return _counter_delta(self.pod_failures, before.pod_failures)

    def requests_since(self, before: TruthSnapshot) -> list[JobRequest]:
        return [req for uid, req in self.requests.items() if uid not in before.requests]

    def terminal_since(self, before: TruthSnapshot) -> list[FinishedJob]:
        return [fin for uid, fin in self.terminal.items() if uid not in before.terminal]

    def started_since(self, before: TruthSnapshot) -> list[StartedJob]:
        return [job for uid, job in self.started.items() if uid not in before.started]

    def admitted_since(self, before: TruthSnapshot) -> list[AdmittedJob]:
        return [job for uid, job in self.admitted.items() if uid not in before.admitted]


def _counter_delta(after: Mapping[Any, int], before: Mapping[Any, int]) -> dict[Any, int]:
    delta = {key: value - before.get(key, 0) for key, value in after.items()}
    return {key: value for key, value in delta.items() if value}
