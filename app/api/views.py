"""The /debug/* responses, built from the running service's in-memory state (read only, on the loop)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from app.api.models import (
    InformerStatus,
    LeadershipResponse,
    PodSeriesStatus,
    PodWatchStatus,
    RememberedSizes,
    RuntimeEntry,
    SnapshotResponse,
    TerminalEntry,
    TerminalPage,
)
from app.handover.watermarks import parse_watermarks
from app.kube.elector_api import ElectorStatus
from app.kube.informer import Informer
from app.replica.service import Service

__all__ = ["InvalidContinueToken", "leadership", "snapshot", "terminal_page"]


class InvalidContinueToken(ValueError):
    """The `continue` token of a /debug/terminal request cannot be decoded."""


def snapshot(service: Service) -> SnapshotResponse:
    now = time.monotonic()
    state = service.state
    runtimes = []
    for r in sorted(state.runtimes(), key=lambda r: r.ref):
        accelerators = state.runtime_accelerators(r)
        first_class, first_count = accelerators[0] if accelerators else ("none", 0)
        runtimes.append(
            RuntimeEntry(
                runtime_ref=r.ref,
                kind=r.kind,
                namespace=r.namespace,
                name=r.name,
                ml_policy=r.ml_policy,
                pod_group_policy=r.pod_group_policy,
                framework=r.framework,
                num_nodes=r.num_nodes,
                default_nodes=r.default_nodes,
                accelerator_class=first_class,
                accelerators_per_node=first_count,
                accelerators=dict(accelerators),
                resource_version=r.resource_version,
            )
        )
    informers = [_informer_status(i, now) for i in service.informers]
    return SnapshotResponse(
        runtimes=runtimes,
        informers=informers,
        trainjobs=service.trainjob_count(),
        terminal_entries=service.state.terminal_count,
        unknown_runtime_refs=service.state.unknown_runtime_refs,
        remembered=remembered(service),
        pods=pod_series(service, now),
    )


def _informer_status(informer: Informer[Any], now: float) -> InformerStatus:
    return InformerStatus(
        name=informer.name,
        synced=informer.synced,
        stale=informer.stale,
        objects=len(informer),
        resource_version=informer.resource_version,
        last_event_age_seconds=round(now - informer.last_event, 3),
    )


def pod_series(service: Service, now: float) -> PodSeriesStatus:
    pods = service.pods
    watches = [
        PodWatchStatus(
            namespace=w.namespace or "",
            status=w.status,
            reason=w.reason,
            informer=_informer_status(w.informer, now) if w.informer is not None else None,
        )
        for w in pods.pod_watches
    ]
    if not pods.enabled:
        watches = [PodWatchStatus(namespace="", status="off", reason="", informer=None)]
    return PodSeriesStatus(
        enabled=pods.enabled,
        watches=watches,
        pods=pods.series.pod_statuses() if pods.enabled else {},
        max_pods=pods.series.max_pods,
        failed_pods=pods.failures.failed_pods if pods.enabled else 0,
        unjoined_failures=pods.failures.unjoined if pods.enabled else 0,
    )


def remembered(service: Service) -> RememberedSizes:
    journal, history = service.journal, service.state.history
    return RememberedSizes(
        journal_entries=journal.remembered,
        journal_size=journal.journal_size,
        held_edges=journal.uncertain,
        unseen_counts=service.ledger.unseen,
        tombstones=history.tombstones,
        edge_history=len(history.ran) + len(history.admitted),
        inherited_history=history.inherited,
        pending_created=service.state.pending_count,
        metric_series=service.metric_state.series_count,
    )


# The simulated cluster's controllers stamp conditions on a clock that runs a simulated minute per second
# (kubesim's time warp), so that a demo's jobs live minutes to hours; the exporter records on the wall clock.
SIMULATED_CLOCK_NOTE = (
    "simulated cluster: its controllers' clock runs ahead of the wall clock (a simulated minute each "
    "second), so terminal_time, which they write, is often later than recorded_time, when this exporter "
    "saw it"
)


def terminal_page(service: Service, limit: int, continue_token: str | None) -> TerminalPage:
    state = service.state
    try:
        entries, next_token = state.terminal_entries(limit, continue_token)
    except ValueError as exc:
        raise InvalidContinueToken(str(exc)) from None
    items = [
        TerminalEntry(
            namespace=e.namespace,
            name=e.name,
            uid=e.uid,
            result=e.result,
            reason=e.reason,
            terminal_time=_utc(e.terminal_time),
            recorded_time=datetime.fromtimestamp(e.recorded_time, UTC),
        )
        for e in entries
    ]
    note = SIMULATED_CLOCK_NOTE if service.settings.simulate else None
    return TerminalPage(total=state.terminal_count, items=items, continue_=next_token, note=note)


def leadership(service: Service) -> LeadershipResponse:
    s, journal = service.settings, service.journal
    if service.elector is not None:
        status = service.elector.status()
    else:
        # No elector yet (informers still syncing) or ever (election disabled): no Lease observed, and
        # this replica leads exactly when it exports on its own.
        status = ElectorStatus(
            identity=s.identity,
            is_leader=journal.leading,
            holder=s.identity if journal.leading else None,
            lease_name=s.lease_name,
            lease_namespace=s.lease_namespace,
            acquire_time=None,
            renew_time=None,
            lease_transitions=None,
        )
    observed = parse_watermarks(status.annotations)
    return LeadershipResponse(
        identity=status.identity,
        is_leader=status.is_leader,
        election_enabled=s.leader_election,
        holder=status.holder,
        lease_name=status.lease_name,
        lease_namespace=status.lease_namespace,
        acquire_time=status.acquire_time,
        renew_time=status.renew_time,
        lease_transitions=status.lease_transitions,
        watermark=journal.watermark,
        watermarks=journal.watermarks,
        observed_watermark=max(observed.values(), default=None) if observed else None,
        transitions_seen=status.transitions_seen,
        last_change=status.last_change,
    )


def _utc(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None
