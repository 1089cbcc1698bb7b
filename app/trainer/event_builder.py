"""EventBuilder: the countable events TrainerState emits, with the labels they carry (docs/design/product.md
§3): requested nodes and accelerators as the controller computes them, the runtime_ref label, and the caps
that keep the accelerator_class and reason labels bounded. TrainerState decides *when* an edge happens;
this module decides *what* it says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

from app.kube.logthrottle import short
from app.trainer import rules
from app.trainer.events import JobAdmitted, JobCreated, JobFinished, JobStarted
from app.trainer.projection_types import TrainJobProjection
from app.trainer.refs import RuntimeRefs

__all__ = [
    "ACCELERATOR_CLASSES_LIMIT",
    "FAILURE_REASONS_LIMIT",
    "MAX_ACCELERATOR_CLASSES",
    "MAX_FAILURE_REASONS",
    "OTHER_ACCELERATOR_CLASS",
    "REQUESTED_QUANTITY_LIMIT",
    "EventBuilder",
    "LoggedOnce",
    "rv_int",
]

# Warnings about one job come from the state's logger, where operators look for them.
log = logging.getLogger("app.trainer.state")

_FIXED_REASONS: Final = frozenset(rules.REASONS)
_MAX_LOGGED: Final = 10_000  # bound on the "already logged" uid set
ACCELERATOR_CLASSES_LIMIT: Final = "accelerator_classes"  # app.metrics.telemetry.Limit
# Distinct accelerator_class label values (besides "none") before further classes become "other".
MAX_ACCELERATOR_CLASSES: Final = 32
OTHER_ACCELERATOR_CLASS: Final = "other"
FAILURE_REASONS_LIMIT: Final = "failure_reasons"  # app.metrics.telemetry.Limit
# A created TrainJob whose request exceeds rules.requests_within_ceilings: out of the histograms.
REQUESTED_QUANTITY_LIMIT: Final = "requested_quantity"  # app.metrics.telemetry.Limit
# Distinct reason label values beyond rules.REASONS before further reasons become "other".
MAX_FAILURE_REASONS: Final = 32


def rv_int(resource_version: int | str) -> int:
    """The resourceVersion (as TrainJobProjection.rv stores it) as an int for the journal's watermark;
    0 when it is not a number (resourceVersions are opaque by contract, numeric in practice)."""
    if type(resource_version) is int:
        return resource_version
    try:
        return int(resource_version) if resource_version.isdigit() else 0  # type: ignore[union-attr]
    except ValueError:  # pragma: no cover - isdigit() admits a few non-ASCII digits int() rejects
        return 0


class LoggedOnce:
    """Keys (job uid keys, runtime uids) already warned about: a bad object is logged once, not on every
    event. Bounded; at worst a key is logged twice."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: set[bytes | str] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: bytes | str) -> None:
        if len(self._keys) >= _MAX_LOGGED:
            self._keys.clear()
        self._keys.add(key)

    def discard(self, key: bytes | str) -> None:
        self._keys.discard(key)


class EventBuilder:
    def __init__(
        self,
        refs: RuntimeRefs,
        logged: LoggedOnce,
        *,
        on_limit: Callable[[str], None] | None,
        accelerator_patterns: Iterable[str],
        max_accelerator_classes: int,
        max_failure_reasons: int,
    ) -> None:
        self._refs = refs
        self._logged = logged
        self._on_limit = on_limit
        self.accelerators = rules.AcceleratorMatcher(accelerator_patterns)
        self._max_accelerator_classes = max(0, max_accelerator_classes)
        self._accelerator_classes: set[str] = set()
        self._max_failure_reasons = max(0, max_failure_reasons)
        self._failure_reasons: set[str] = set()

    def started(self, job: TrainJobProjection, startup: float, since: int) -> JobStarted:
        return JobStarted(
            rv=rv_int(job.rv),
            uid=job.uid,
            runtime_ref=self._refs.label(job.runtime_ref),
            startup_seconds=startup,
            namespace=job.namespace_label,
            since=since,
            key=job.key,
            at=job.created + startup if job.created is not None else None,
        )

    def admitted(self, job: TrainJobProjection, wait: float, since: int, at: float | None) -> JobAdmitted:
        return JobAdmitted(
            rv=rv_int(job.rv),
            uid=job.uid,
            runtime_ref=self._refs.label(job.runtime_ref),
            wait_seconds=wait,
            namespace=job.namespace_label,
            since=since,
            key=job.key,
            at=at,
        )

    def created(self, job: TrainJobProjection, since: int) -> JobCreated:
        raw = job.runtime_ref
        runtime = self._refs.by_ref.get(raw)
        nodes = rules.requested_nodes(job.num_nodes, runtime.nodes if runtime is not None else None)
        # The trainer container's resources as the controller builds them (newRuntimeInfo): the runtime's
        # node container, computed once per runtime version, with the job's resourcesPerNode merged in
        # when the controller merges it (memoised per pair). A runtime that never arrived leaves the job's
        # own resourcesPerNode: the best we know.
        if runtime is None:
            resources = job.resources or rules.NO_RESOURCES
        elif job.resources is not None and runtime.merges_job_resources:
            resources = rules.merge_resources(runtime.node_resources, job.resources)
        else:
            resources = runtime.node_resources
        per_node = self.accelerators.per_node(resources)
        nodes_ok, accelerators_ok = rules.requests_within_ceilings(per_node, nodes)
        if not accelerators_ok:
            self._request_out_of_range(job, nodes, per_node)
        accelerators = rules.requested_accelerators(per_node, nodes)
        if accelerators is not rules.NO_ACCELERATORS:
            accelerators = self._cap_accelerator_classes(accelerators)
        first_class, first_count = accelerators[0]
        return JobCreated(
            rv=rv_int(job.rv),
            uid=job.uid,
            namespace=job.namespace_label,
            runtime_ref=self._refs.label(raw),
            requested_nodes=nodes,
            accelerator_class=first_class,
            requested_accelerators=first_count,
            since=since,
            more_accelerators=accelerators[1:],
            nodes_observed=nodes_ok,
            accelerators_observed=accelerators_ok,
            key=job.key,
            at=job.created,
        )

    def _request_out_of_range(
        self, job: TrainJobProjection, nodes: int, per_node: tuple[tuple[str, int], ...]
    ) -> None:
        """A request nobody makes (numNodes or an accelerator count above the ceilings): counted as a
        limit hit, logged once per job, and kept out of the histograms by the caller."""
        if self._on_limit is not None:
            self._on_limit(REQUESTED_QUANTITY_LIMIT)
        uid = job.uid_key
        if uid in self._logged:
            return
        self._logged.add(uid)
        log.warning(
            "TrainJob %s (uid %s) requests %d nodes and %s per node, above the ceilings (%d nodes, %d "
            "accelerators per node, %d per job); counted, but left out of the requested-nodes and "
            "requested-accelerators histograms",
            short(job.key),
            short(job.uid),
            nodes,
            short(", ".join(f"{count} {cls}" for cls, count in per_node) or "no accelerators"),
            rules.MAX_REQUESTED_NODES,
            rules.MAX_ACCELERATORS_PER_NODE,
            rules.MAX_ACCELERATORS_PER_JOB,
        )

    def _cap_accelerator_classes(self, accelerators: rules.Accelerators) -> rules.Accelerators:
        """Classes beyond ``max_accelerator_classes`` distinct ones become "other" (one observation per
        job: the counts of a job's classes that all became "other" are summed)."""
        known = self._accelerator_classes
        other = -1  # summed count of this job's classes that became "other"; -1: none did
        kept: list[tuple[str, int]] = []
        for cls, count in accelerators:
            if cls not in known:
                if len(known) < self._max_accelerator_classes:
                    known.add(cls)
                else:
                    other = max(other, 0) + count
                    if self._on_limit is not None:
                        self._on_limit(ACCELERATOR_CLASSES_LIMIT)
                    continue
            kept.append((cls, count))
        if other < 0:
            return accelerators
        kept.append((OTHER_ACCELERATOR_CLASS, other))
        return tuple(sorted(kept))

    def finished(self, job: TrainJobProjection, since: int) -> JobFinished:
        return JobFinished(
            rv=rv_int(job.rv),
            uid=job.uid,
            result=job.result,
            reason=self._reason_label(job.result, job.reason),
            runtime_ref=self._refs.label(job.runtime_ref),
            lifetime_seconds=rules.lifetime_seconds(job.created, job.terminal_time),
            namespace=job.namespace_label,
            since=since,
            key=job.key,
            at=job.terminal_time,
        )

    def _reason_label(self, result: str, reason: str) -> str:
        """rules.reason_bucket, with at most ``max_failure_reasons`` distinct names beyond rules.REASONS
        (a hand-edited or buggy controller could write a new reason per job)."""
        label = rules.reason_bucket(result, reason)
        if label in _FIXED_REASONS or label in self._failure_reasons:
            return label
        if len(self._failure_reasons) < self._max_failure_reasons:
            self._failure_reasons.add(label)
            return label
        if self._on_limit is not None:
            self._on_limit(FAILURE_REASONS_LIMIT)
        return rules.OTHER_REASON
