"""Property: TrainerState fed adversarial projections never raises, emits only bounded labels and
non-negative finite numbers, stays consistent (the gauge is empty once every job is deleted), and logs
a malformed TrainJob at most once per uid (docs/design/product.md §3, §6 invariant 6)."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.metrics.telemetry import Limit
from app.trainer import rules
from app.trainer.events import CountableEvent, JobAdmitted, JobCreated, JobFinished, JobStarted
from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
)
from app.trainer.projection_types import TrainJobProjection
from app.trainer.state import TrainerState
from tests.badinput import strategies as S

UID_IN_MESSAGE = re.compile(r"\(uid ([^,]+), resourceVersion ")

FUZZ = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def check_event(e: CountableEvent) -> None:
    assert S.runtime_ref_lenient_ok(e.runtime_ref), e.runtime_ref[:200]
    assert isinstance(e.rv, int) and e.rv >= 0
    if isinstance(e, JobCreated):
        assert isinstance(e.requested_nodes, int) and 0 <= e.requested_nodes <= rules.MAX_NUM_NODES
        for cls, count in e.accelerators:
            assert S.accelerator_class_length_ok(cls), cls[:200]
            assert isinstance(count, int) and count >= 0
            assert cls != rules.NONE or count == 0
        assert len({cls for cls, _ in e.accelerators}) == len(e.accelerators)
    elif isinstance(e, JobStarted):
        assert S.finite_nonneg(e.startup_seconds)
    elif isinstance(e, JobAdmitted):
        assert S.finite_nonneg(e.wait_seconds)
    else:
        assert isinstance(e, JobFinished)
        assert e.result in rules.RESULTS
        assert rules.is_reason_label(e.reason)
        assert S.finite_nonneg(e.lifetime_seconds)


def with_key(doc: Any, name: str, namespace: str, uid: str) -> Any:
    return S.valid_metadata(doc, name, uid, namespace)


job_docs = st.lists(
    st.tuples(S.trainjobs(), S.trainjobs(), st.booleans(), st.booleans()), min_size=1, max_size=4
)
runtime_docs = st.lists(
    st.tuples(
        S.runtimes(), st.sampled_from([TRAINING_RUNTIME_PROJECTOR, CLUSTER_TRAINING_RUNTIME_PROJECTOR])
    ),
    max_size=3,
)


@FUZZ
@given(
    jobs=job_docs,
    runtimes=runtime_docs,
    max_unknown=st.integers(0, 2),
    wait=st.sampled_from([0.0, 5.0]),
    runtimes_first=st.booleans(),
)
def test_state_survives_adversarial_jobs_and_runtimes(
    jobs: list[tuple[Any, Any, bool, bool]],
    runtimes: list[tuple[Any, Any]],
    max_unknown: int,
    wait: float,
    runtimes_first: bool,
) -> None:
    sink, clock = S.recording_sink(), Clock()
    hits: list[str] = []
    state = TrainerState(
        sink,
        max_unknown_runtime_refs=max_unknown,
        runtime_wait_seconds=wait,
        clock=clock,
        on_limit=hits.append,
    )
    log = logging.getLogger("app.trainer.state")
    records = Records()
    log.addHandler(records)
    try:
        rts = [p for doc, proj in runtimes if (p := S.informer_projection(proj, doc)) is not None]
        seen_keys: dict[tuple[str, str, str], Any] = {}
        for r in rts:
            S.check_runtime_projection(r)
        # Each job: added (initial or not), updated to another adversarial object with the same key
        # (same uid or a new one), then deleted. Jobs keep their key, as an informer guarantees.
        live: list[TrainJobProjection] = []
        if runtimes_first:
            for r in rts:
                old = seen_keys.get((r.kind, r.namespace, r.name))
                if old is None:
                    state.runtime_handler.on_added(r, False)
                else:
                    state.runtime_handler.on_updated(old, r)
                seen_keys[(r.kind, r.namespace, r.name)] = r
        for i, (a, _b, initial, _same_uid) in enumerate(jobs):
            name, ns, uid = f"job-{i}", "team-a" if i % 2 else "team-b", f"uid-{i}"
            first = S.informer_projection(TRAINJOB_PROJECTOR, with_key(a, name, ns, uid))
            assert first is not None
            S.check_job_projection(first)
            state.job_handler.on_added(first, initial)
            live.append(first)
        for i, (_a, b, _initial, same_uid) in enumerate(jobs):
            old = live[i]
            ns = old.namespace
            second = S.informer_projection(
                TRAINJOB_PROJECTOR, with_key(b, f"job-{i}", ns, old.uid if same_uid else f"uid-{i}-b")
            )
            assert second is not None
            S.check_job_projection(second)
            if second.resource_version == old.resource_version:
                second = TrainJobProjection(
                    **{**_fields(second), "resource_version": old.resource_version + "1"}
                )
            state.job_handler.on_updated(old, second)
            live[i] = second
        if not runtimes_first:
            for r in rts:
                old = seen_keys.get((r.kind, r.namespace, r.name))
                if old is None:
                    state.runtime_handler.on_added(r, False)
                else:
                    state.runtime_handler.on_updated(old, r)
                seen_keys[(r.kind, r.namespace, r.name)] = r
        clock.now += 10
        state.flush_pending()
        for job in live:
            state.job_handler.on_deleted(job)
        for r in seen_keys.values():
            state.runtime_handler.on_deleted(r)
        state.flush_pending(math.inf)
    finally:
        log.removeHandler(records)

    for e in sink.events:
        check_event(e)
    assert all(v >= 0 for v in sink.gauge_values)
    # consistency: every job was deleted, so no series is left and nothing is pending or admitted
    assert sink.gauge == {}
    assert state.jobs_gauge() == {}
    assert state.pending_count == 0
    assert state.unknown_runtime_refs == 0
    assert state.terminal_count == 0
    # each uid created at most once and finished at most once
    created = [e.uid for e in sink.events if isinstance(e, JobCreated)]
    finished = [e.uid for e in sink.events if isinstance(e, JobFinished)]
    assert len(created) == len(set(created))
    assert len(finished) == len(set(finished))
    # ... and seen starting (time to running) and admitted at most once each
    for kind in (JobStarted, JobAdmitted):
        uids = [e.uid for e in sink.events if isinstance(e, kind)]
        assert len(uids) == len(set(uids)), kind
    # logged once: at most one WARNING per uid over add + update (a delete forgets it, by design). By the
    # uid the message names: two runtimes of one key but different uids (deleted and recreated between two
    # observations) are two objects, each logged once (hypothesis found such a pair).
    per_uid: dict[str, int] = {}
    for rec in records.records:
        named = UID_IN_MESSAGE.search(rec.getMessage())
        if named is not None:
            per_uid[named[1]] = per_uid.get(named[1], 0) + 1
    assert all(n <= 1 for n in per_uid.values()), per_uid
    # Only the state's own limits, each a value the telemetry accepts (a request above the ceilings, e.g. a
    # fuzzed numNodes of 10**6, is one: app/trainer/event_builder.py).
    assert set(hits) <= {
        Limit.UNKNOWN_RUNTIME_REFS,
        Limit.REQUESTED_QUANTITY,
        Limit.ACCELERATOR_CLASSES,
        Limit.FAILURE_REASONS,
    }


def _fields(p: TrainJobProjection) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__struct_fields__}


@FUZZ
@given(doc=S.trainjobs())
def test_same_malformed_object_twice_is_logged_at_most_once(doc: Any) -> None:
    """The same malformed object (same uid) seen twice, even at a new resourceVersion: one warning."""
    obj = S.valid_metadata(doc, "j", "u-1", None)
    first = S.informer_projection(TRAINJOB_PROJECTOR, obj)
    assert first is not None
    again = TrainJobProjection(**{**_fields(first), "resource_version": first.resource_version + "9"})
    state = TrainerState(S.recording_sink(), runtime_wait_seconds=0)
    log = logging.getLogger("app.trainer.state")
    records = Records()
    log.addHandler(records)
    try:
        state.job_handler.on_added(first, False)
        state.job_handler.on_updated(first, again)
        state.job_handler.on_updated(again, again)
    finally:
        log.removeHandler(records)
    assert len(records.records) == (1 if first.malformed else 0)
