"""The documented label bounds (docs/design/product.md §3: "Labels never carry ... an unbounded
user-chosen value"), one test per label, fed by hostile objects. Bounds that the code does not
enforce today are strict xfails whose reason names the cause and the proposed fix: they start
passing (and fail as XPASS) the day the fix lands, so the marker must then be removed."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.trainer import rules
from app.trainer.events import JobCreated
from app.trainer.informer_projectors import (
    CLUSTER_TRAINING_RUNTIME_PROJECTOR,
    TRAINING_RUNTIME_PROJECTOR,
    TRAINJOB_PROJECTOR,
)
from app.trainer.state import TrainerState
from tests.badinput import strategies as S

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

hostile_namespaces = st.one_of(
    st.sampled_from(["a/b", "x" * 100_000, "UPPER", "ns with space", "ns\n", "é"]),
    st.text(min_size=1, max_size=80),
)
hostile_gpu_names = st.one_of(
    st.sampled_from(['gpu"} 1\nevil{x="', "gpu\n", "gpu with spaces", "é-gpu", "gpu" * 200, "/gpu", "gpu/"]),
    st.text(min_size=1, max_size=40).map(lambda s: s + "gpu"),
)


def _created(job_doc: dict[str, Any], runtimes: tuple[Any, ...] = ()) -> JobCreated:
    sink = S.recording_sink()
    # Every name containing "gpu" is an accelerator here (#4190's reading), so the hostile names below
    # reach the accelerator_class label unless the projection drops them.
    state = TrainerState(sink, runtime_wait_seconds=0, accelerator_patterns=["*gpu*"])
    for r in runtimes:
        state.runtime_handler.on_added(r, False)
    job = S.informer_projection(TRAINJOB_PROJECTOR, job_doc)
    state.job_handler.on_added(job, False)
    (event,) = sink.events
    assert isinstance(event, JobCreated)
    return event


def _job(namespace: str = "team-a", *, kind: str = "ClusterTrainingRuntime", gpu: str | None = None) -> Any:
    trainer: dict[str, Any] = {"numNodes": 2}
    if gpu is not None:
        trainer["resourcesPerNode"] = {"requests": {gpu: "1"}}
    return {
        "metadata": {
            "name": "j",
            "uid": "u",
            "namespace": namespace,
            "resourceVersion": "5",
            "creationTimestamp": "2025-06-01T10:00:00Z",
        },
        "spec": {"runtimeRef": {"name": "torch-distributed", "kind": kind}, "trainer": trainer},
    }


# --- bounds that hold ------------------------------------------------------------------------------


@FUZZ
@given(
    name=S.names,
    group=st.one_of(st.none(), st.text(max_size=30)),
    kind=st.one_of(st.none(), st.text(max_size=30)),
)
def test_runtime_ref_name_group_and_kind_are_bounded(name: str, group: str | None, kind: str | None) -> None:
    ref = rules.runtime_ref_label(group, kind, name, "team-a")
    assert S.runtime_ref_ok(ref), ref[:200]


@FUZZ
@given(gpu=hostile_gpu_names)
def test_accelerator_class_length_is_bounded(gpu: str) -> None:
    event = _created(_job(gpu=gpu + "x" * 100_000 if len(gpu) % 2 else gpu))
    assert S.accelerator_class_length_ok(event.accelerator_class)


def test_framework_label_length_is_bounded() -> None:
    r = CLUSTER_TRAINING_RUNTIME_PROJECTOR.from_json(
        {"metadata": {"name": "r", "uid": "u", "labels": {rules.FRAMEWORK_LABEL: "f" * 100_000}}}
    )
    assert r is not None and len(r.framework) == rules.MAX_LABEL_VALUE


# --- former findings (strict xfails until fixed) ------------------------------------------------


@FUZZ
@given(gpu=hostile_gpu_names)
def test_accelerator_class_is_a_kubernetes_resource_name(gpu: str) -> None:
    event = _created(_job(gpu=gpu))
    assert S.accelerator_class_charset_ok(event.accelerator_class), event.accelerator_class


@FUZZ
@given(namespace=hostile_namespaces)
def test_training_runtime_ref_namespace_is_a_dns_label(namespace: str) -> None:
    job = TRAINJOB_PROJECTOR.from_json(_job(namespace, kind="TrainingRuntime"))
    assert job is not None
    assert S.runtime_ref_ok(job.runtime_ref), job.runtime_ref[:200]


@FUZZ
@given(namespace=hostile_namespaces)
def test_namespace_label_is_a_dns_label(namespace: str) -> None:
    event = _created(_job(namespace))
    assert len(event.namespace) <= 63 and S.DNS_SUBDOMAIN_RE.match(event.namespace), event.namespace[:100]


def test_runtime_info_name_and_namespace_are_bounded() -> None:
    state = TrainerState(S.recording_sink())
    for p, ns in ((TRAINING_RUNTIME_PROJECTOR, "x" * 100_000), (CLUSTER_TRAINING_RUNTIME_PROJECTOR, None)):
        r = p.from_json({"metadata": {"name": "N" * 100_000, "uid": "u", "namespace": ns}})
        assert r is not None
        state.runtime_handler.on_added(r, False)
    for info in state.runtime_info():
        assert len(info.name) <= 253 and len(info.namespace) <= 63
