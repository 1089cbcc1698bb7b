"""Property: no object, however malformed, breaks a projector, and every label it yields is bounded.

Both decoding paths are fed (docs/design/product.md §6 invariant 6): the typed fast path (msgspec
into the projector's wire type, then ``from_wire``; msgspec.ValidationError is the documented
fallback trigger) and the tolerant ``from_json`` path. ``salvage`` (``from_json`` without its
safety net) is also called directly: ``from_json`` swallows exceptions and returns None, which would
silently drop an object it could have salvaged.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.trainer import rules
from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
)
from app.trainer.projection_types import MALFORMED, TrainJobProjection
from tests.badinput import strategies as S

FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _usable(obj: Any) -> bool:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return False
    name, uid = meta.get("name"), meta.get("uid")
    return isinstance(name, str) and bool(name) and isinstance(uid, str) and bool(uid)


@FUZZ
@given(S.trainjobs())
@example({"metadata": {"name": "j", "uid": "u", "namespace": "ns"}, "spec": {"trainer": {"numNodes": "1e3"}}})
@example({"metadata": {"name": "j", "uid": "u"}, "spec": {"trainer": {"numNodes": 1e308}}})
@example({"metadata": {"name": "j", "uid": "u"}, "spec": {"trainer": {"numNodes": 2**80}}})
@example({"metadata": {"name": "j", "uid": "u"}, "status": {"conditions": {"type": "Failed"}}})
@example({"metadata": {"name": "j", "uid": "u"}, "spec": [], "status": "Running"})
def test_trainjob_projector_never_raises_and_labels_are_bounded(obj: Any) -> None:
    p = TRAINJOB_PROJECTOR
    wire = S.typed(p, obj)  # raises anything but ValidationError -> test failure
    tolerant = p.salvage(obj)  # must not raise either: from_json would swallow it
    assert p.from_json(obj) == tolerant
    if tolerant is None:
        assert not _usable(obj), "a usable name/uid was dropped by from_json"
    else:
        S.check_job_projection(tolerant)
    if wire is not None and wire.uid and wire.key.rpartition("/")[2]:
        S.check_job_projection(wire)


@FUZZ
@given(S.trainjobs())
def test_typed_and_tolerant_paths_agree_except_for_the_malformed_flag(obj: Any) -> None:
    """The informer uses whichever path works; the metrics must not depend on which one it was."""
    wire = S.typed(TRAINJOB_PROJECTOR, obj)
    tolerant = TRAINJOB_PROJECTOR.from_json(obj)
    if wire is None or tolerant is None:
        return
    assert msgspec.structs.replace(wire, flags=wire.flags & ~MALFORMED) == msgspec.structs.replace(
        tolerant, flags=tolerant.flags & ~MALFORMED
    )


@FUZZ
@given(S.trainjobs(), S.runtimes())
@example(
    {"metadata": {"name": "torch-distributed", "namespace": "team-a", "uid": "", "resourceVersion": "0"}}, {}
)
def test_typed_path_admits_only_objects_the_tolerant_path_admits(job: Any, runtime: Any) -> None:
    """An object without a name or uid cannot be tracked: the typed path must not cache it either."""
    wire = S.typed(TRAINJOB_PROJECTOR, job)
    if wire is not None and wire.key:
        assert TRAINJOB_PROJECTOR.from_json(job) is not None
    for p in (TRAINING_RUNTIME_PROJECTOR, CLUSTER_TRAINING_RUNTIME_PROJECTOR):
        rt = S.typed(p, runtime)
        if rt is not None and rt.key:
            assert p.from_json(runtime) is not None


@FUZZ
@given(S.runtimes(), st.sampled_from([TRAINING_RUNTIME_PROJECTOR, CLUSTER_TRAINING_RUNTIME_PROJECTOR]))
@example(
    {"metadata": {"name": "r", "uid": "u"}, "spec": {"mlPolicy": {"numNodes": "1.5", "torch": None}}},
    TRAINING_RUNTIME_PROJECTOR,
)
@example(
    {"metadata": {"name": "r", "uid": "u", "labels": {rules.FRAMEWORK_LABEL: "x" * 100_000}}},
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
)
def test_runtime_projectors_never_raise_and_labels_are_bounded(obj: Any, p: Any) -> None:
    wire = S.typed(p, obj)
    tolerant = p.salvage(obj)
    assert p.from_json(obj) == tolerant
    if tolerant is None:
        assert not _usable(obj)
    else:
        S.check_runtime_projection(tolerant)
    if wire is not None:
        S.check_runtime_projection(wire)


@pytest.mark.parametrize(
    "value",
    [
        "1.5",
        "1e3",
        "500m",
        "-1",
        "abc",
        "NaN",
        "nan",
        "Infinity",
        "1e308",
        1e308,
        -1,
        -1.0,
        1.5,
        2**80,
        True,
        None,
        [],
        {},
        "٣",
        " 4 ",
        "9" * 13,
    ],
)
def test_odd_num_nodes_never_become_labels_or_negative(value: Any) -> None:
    nodes, _ = rules.coerce_count(value)
    assert nodes is None or 0 <= nodes <= rules.MAX_NUM_NODES
    job = TRAINJOB_PROJECTOR.from_json(
        {"metadata": {"name": "j", "uid": "u", "namespace": "ns"}, "spec": {"trainer": {"numNodes": value}}}
    )
    assert isinstance(job, TrainJobProjection)
    assert job.num_nodes == nodes
