"""Adversarial pods (tests/badinput/strategies.py's junk in every field: wrong JSON types, huge strings, deep
nesting, odd quantities and labels): the pod projector never raises on either path, both paths agree but for
the malformed flag, and the pod series built from them only ever carry label values that are Kubernetes
names, of the TrainJob the pod's JobSet label names."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.metrics.pods import PodJobHandler, PodSeries, PodSeriesHandler
from app.trainer import rules
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.pods import MALFORMED, PodProjector
from tests.badinput import strategies as S
from tests.support.trainjob_cache import NullHandler, TrainJobCache

FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
PROJECTOR = PodProjector()
JOBSET = "jobset.sigs.k8s.io/jobset-name"

quantities = st.one_of(
    st.sampled_from(["1", "8", "0", "-1", "500m", "8G", "1e3", "1e300", "2.5"]), S.junk_scalar
)
resource_names = st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "cpu", "Bad Name"]
)
resources = S.obj(
    requests=S.maybe(st.dictionaries(resource_names, S.maybe(quantities), max_size=3)),
    limits=S.maybe(st.dictionaries(resource_names, S.maybe(quantities), max_size=3)),
)
containers = st.lists(
    S.maybe(
        S.obj(
            name=S.maybe(st.just("c")), resources=S.maybe(resources), restartPolicy=S.maybe(st.just("Always"))
        )
    ),
    max_size=3,
)
labels = st.fixed_dictionaries(
    {},
    optional={
        JOBSET: S.maybe(st.sampled_from(["llama", "other", "Bad_Name", ""])),
        "jobset.sigs.k8s.io/replicatedjob-name": S.maybe(st.sampled_from(["node", "x" * 100, "a b"])),
        "jobset.sigs.k8s.io/restart-attempt": S.maybe(st.sampled_from(["0", "3", "-1", "99999999999", "x"])),
    },
)


@st.composite
def pods(draw: st.DrawFn) -> Any:
    meta = S.req(
        name=S.maybe(st.sampled_from(["p-0", "p-1", "P_bad", "x" * 300])),
        uid=S.maybe(st.sampled_from(["u0", "u1"])),
        namespace=S.maybe(st.sampled_from(["team-a", "team-b"])),
        resourceVersion=S.maybe(st.just("7")),
        creationTimestamp=S.maybe(st.sampled_from(["2025-06-01T10:00:05Z", "2024-01-01T00:00:00Z", "junk"])),
        labels=S.maybe(labels),
    )
    spec = S.obj(
        nodeName=S.maybe(st.sampled_from(["n1", "", "Bad Node"])),
        containers=S.maybe(containers),
        initContainers=S.maybe(containers),
    )
    status = S.obj(
        phase=S.maybe(st.sampled_from(["Running", "Pending", "Failed", "Succeeded", "Weird"])),
        reason=S.maybe(st.sampled_from(["Evicted", "DeadlineExceeded"])),
        containerStatuses=S.maybe(st.lists(S.junk, max_size=2)),
    )
    return S.scrub(draw(S.req(metadata=S.maybe(meta), spec=S.maybe(spec), status=S.maybe(status))))


@FUZZ
@given(pods())
@example({"metadata": {"name": "p", "uid": "u", "labels": {JOBSET: 5}}, "spec": {"containers": {"a": 1}}})
@example({"metadata": {"name": "p", "uid": "u"}, "spec": [], "status": "Running"})
def test_pod_projector_never_raises_and_both_paths_agree(obj: Any) -> None:
    wire = S.typed(PROJECTOR, obj)  # anything but ValidationError is a failure
    tolerant = PROJECTOR.salvage(obj)
    if wire is not None and tolerant is not None:
        assert without_malformed(wire) == without_malformed(tolerant)


def without_malformed(pod: Any) -> Any:
    rjob, attempt, flags, phase, devices = pod.traits
    return msgspec.structs.replace(pod, traits=(rjob, attempt, flags & ~MALFORMED, phase, devices))


@FUZZ
@given(st.lists(pods(), max_size=8))
def test_pod_series_from_junk_never_raise_and_carry_only_valid_labels(objs: list[Any]) -> None:
    jobs = TrainJobCache()
    series = PodSeries(jobs.get, max_pods=3, max_accelerator_classes=2)
    jobs.handler = PodJobHandler(NullHandler(), series)
    handler = PodSeriesHandler(series)
    job = TRAINJOB_PROJECTOR.from_json(
        {
            "metadata": {
                "name": "llama",
                "namespace": "team-a",
                "uid": "j",
                "resourceVersion": "1",
                "creationTimestamp": "2025-06-01T10:00:00Z",
            },
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        }
    )
    assert job is not None
    jobs.on_added(job, True)
    cache: dict[str, Any] = {}
    for obj in objs:  # as the informer's cache tells them: add, update of the same key, delete
        p = PROJECTOR.from_json(obj)
        if p is None:
            continue
        old = cache.get(p.key)
        if old is None:
            handler.on_added(p, False)
        else:
            handler.on_updated(old, p)
        cache[p.key] = p
    for key in series.info.values:
        ns, trainjob, pod, node, replicated, _ = key
        assert (ns, trainjob) == ("team-a", "llama")
        assert rules.is_object_name(pod) and rules.is_object_name(node) and rules.is_label_value(replicated)
    assert len(series.info.values) <= 3
    for ns, trainjob, cls in series.allocated.values:
        assert (ns, trainjob) == ("team-a", "llama") and series.allocated.values[(ns, trainjob, cls)] > 0
    for p in cache.values():
        handler.on_deleted(p)
    jobs.on_deleted(job)
    assert not series.info.values and not series.allocated.values and not series.restarts.values
