"""The pods of TrainJobs: JobSet's labels, the devices a pod holds as the scheduler counts them, and the
projection of a pod on both decoding paths (app/trainer/rules/pods.py, app/trainer/pods.py).

The labels are JobSet's (kubernetes-sigs/jobset v0.12.0): ``pkg/controllers/jobset_controller.go``
labelAndAnnotateObject writes ``jobset.sigs.k8s.io/jobset-name`` = the JobSet's name,
``jobset.sigs.k8s.io/replicatedjob-name`` and ``jobset.sigs.k8s.io/restart-attempt`` =
``strconv.Itoa(int(js.Status.Restarts))`` (``pkg/constants/constants.go`` RestartsKey) on each child Job
and its pod template; the Job controller adds ``batch.kubernetes.io/job-name`` (k8s.io/api batch/v1
JobNameLabel), which the rules need not read. The Trainer names the JobSet after the TrainJob
(kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go``: ``JobSet(trainJob.Name,
trainJob.Namespace)``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from app.kube.cache import same_uid
from app.kube.decode import WatchEvent
from app.trainer import rules
from app.trainer.pods import IMPLAUSIBLE, MALFORMED, PodProjector
from tests.trainer.manifests import trainjob

PROJECTOR = PodProjector()


def pod(
    name: str = "llama-node-0-0-abcde",
    *,
    ns: str = "team-a",
    jobset: str | None = "llama",
    replicated: str = "node",
    attempt: Any = "0",
    node: str = "gpu-node-1",
    phase: str = "Running",
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod as the Job controller creates it from a JobSet's pod template (the labels JobSet writes)."""
    labels: dict[str, Any] = {
        "batch.kubernetes.io/job-name": f"{jobset}-{replicated}-0",
        "jobset.sigs.k8s.io/jobset-uid": "0b6f7c3e-2f0e-4a57-9a43-0f7d7a4d2c11",
        "jobset.sigs.k8s.io/replicatedjob-name": replicated,
        "jobset.sigs.k8s.io/job-index": "0",
    }
    if jobset is not None:
        labels["jobset.sigs.k8s.io/jobset-name"] = jobset
    if attempt is not None:
        labels["jobset.sigs.k8s.io/restart-attempt"] = attempt
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": "42",
            "creationTimestamp": "2025-06-01T10:00:05Z",
            "labels": labels,
            "managedFields": [{"manager": "kube-controller-manager"}],
        },
        "spec": {
            "nodeName": node,
            "containers": containers
            if containers is not None
            else [{"name": "node", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            **({"initContainers": init_containers} if init_containers is not None else {}),
        },
        "status": status if status is not None else {"phase": phase},
    }


def typed_wire(obj: dict[str, Any]) -> Any:
    """The typed path's wire struct: msgspec straight into it, as the informer decodes a watch line."""
    line = msgspec.json.encode({"type": "ADDED", "object": obj})
    return msgspec.json.decode(line, type=WatchEvent[PROJECTOR.wire_type]).object


def typed(obj: dict[str, Any]) -> Any:
    """The typed path's projection."""
    return PROJECTOR.from_wire(typed_wire(obj))


def both(obj: dict[str, Any]) -> Any:
    """The projection on both paths, which must agree on a well-formed pod."""
    a, b = typed(obj), PROJECTOR.from_json(obj)
    assert a == b
    return a


# --- labels and restart attempts -------------------------------------------------------------------------


def test_projection_keeps_the_jobset_labels_node_and_phase() -> None:
    p = both(pod(attempt="3"))
    assert (p.key, p.namespace, p.name, p.uid, p.resource_version) == (
        "team-a/llama-node-0-0-abcde",
        "team-a",
        "llama-node-0-0-abcde",
        "",  # kept for a Failed pod only (the failure edge reads it)
        "",
    )
    assert (p.jobset, p.replicated_job, p.restart_attempt) == ("llama", "node", 3)
    assert (p.node, p.phase, p.holds_node) == ("gpu-node-1", "Running", True)
    assert p.devices == (("nvidia.com/gpu", 8),)
    assert p.created == 1748772005.0
    assert not p.malformed


def test_a_pod_shares_its_cached_trainjobs_key_string_else_its_jobs_other_pods() -> None:
    """``trainjob_key`` is the key of the TrainJob the jobset-name label names: the cached TrainJob's own
    string when there is one (no string a job), else one interned string for all the job's pods; without
    the label, "namespace/" (the pods of no JobSet in a namespace go together)."""
    llama = trainjob("llama", {"runtimeRef": {"name": "torch-distributed"}})
    with_jobs = PodProjector(jobs=lambda ns, name: llama if (ns, name) == ("team-a", "llama") else None)
    for project in (with_jobs.from_json, lambda obj: with_jobs.from_wire(typed_wire(obj))):
        p = project(pod())
        assert p is not None and p.trainjob_key == "team-a/llama" and p.trainjob_key is llama.key
    first, second = (both(pod(name=n, jobset="gpt")) for n in ("gpt-node-0-0-a", "gpt-node-0-1-b"))
    assert first.trainjob_key == "team-a/gpt" and first.trainjob_key is second.trainjob_key
    # ... and one (replicated job, restart attempt, flags, phase, devices) tuple: six slots a pod (64 B).
    assert first.traits == ("node", 0, 0, "Running", (("nvidia.com/gpu", 8),))
    assert first.traits is second.traits
    assert len(msgspec.structs.fields(first)) == 6
    assert (first.jobset, first.namespace) == ("gpt", "team-a")
    no_label = both(pod(jobset=None))
    assert (no_label.trainjob_key, no_label.jobset, no_label.namespace) == ("team-a/", "", "team-a")


def test_only_a_failed_pod_keeps_its_uid_and_resource_version() -> None:
    """The failure edge reads the uid and the rv of the event a pod failed at (app/trainer/pod_failures.py);
    nothing else reads a pod's, and the informer resumes from the stream's rv (``wire_rv``)."""
    for phase in ("Pending", "Running", "Succeeded"):
        p = both(pod(phase=phase))
        assert (p.uid, p.resource_version, p.uid_key, p.rv) == ("", "", None, None)
    p = both(pod(phase="Failed"))
    assert (p.uid, p.resource_version) == ("uid-llama-node-0-0-abcde", "42")
    assert PROJECTOR.wire_rv(_wire(pod())) == "42"


def test_a_pod_created_again_under_its_name_is_an_update_the_series_take_as_delete_and_add() -> None:
    """Without a uid the cache tells a Running pod replaced under its name (while the watch was down) as an
    update; the pod series are a function of the pods cached, so they end as a delete and an add leave them
    (tests/metrics/test_pod_series.py compares them with a fresh join after any sequence)."""
    first = typed(pod())
    other = pod(node="gpu-node-2")
    other["metadata"]["uid"] = "uid-recreated"
    second = PROJECTOR.from_wire(_wire(other), first)
    assert same_uid(first, second) and not PROJECTOR.unchanged(first, second)


def test_selector_is_the_jobset_name_label_existence() -> None:
    assert rules.POD_SELECTOR == "jobset.sigs.k8s.io/jobset-name"
    assert rules.REPLICATED_JOB_LABEL == "jobset.sigs.k8s.io/replicatedjob-name"
    assert rules.RESTART_ATTEMPT_LABEL == "jobset.sigs.k8s.io/restart-attempt"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (None, False)),
        ("0", (0, False)),
        ("12", (12, False)),
        ("2147483647", (2147483647, False)),
        ("2147483648", (None, True)),  # beyond JobSet's int32
        ("99999999999999999999", (None, True)),
        ("-1", (None, True)),
        ("1.5", (None, True)),
        ("", (None, True)),
        ("٣", (None, True)),  # a non-ASCII digit is not strconv.Itoa's
        (3, (None, True)),
    ],
)
def test_restart_attempt_is_jobsets_int32_decimal(value: object, expected: tuple[int | None, bool]) -> None:
    assert rules.restart_attempt(value) == expected


@pytest.mark.parametrize(
    ("node", "phase", "holds"),
    [
        ("n1", "Running", True),
        ("n1", "Pending", True),  # bound, containers starting: its devices are allocated
        ("n1", "Unknown", True),
        ("", "Pending", False),  # not scheduled yet
        ("n1", "Succeeded", False),
        ("n1", "Failed", False),
    ],
)
def test_holds_node_bound_and_not_finished(node: str, phase: str, holds: bool) -> None:
    assert rules.holds_node(node, phase) is holds
    assert both(pod(node=node, phase=phase)).holds_node is holds


def test_missing_phase_reads_as_pending() -> None:
    p = both(pod(status={}))
    assert p.phase == "Pending"


# --- devices as the scheduler counts them --------------------------------------------------------------


def _c(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "resources": resources, **extra}


def test_request_else_limit_per_resource() -> None:
    p = both(
        pod(containers=[_c({"nvidia.com/gpu": "2", "cpu": "4"}, {"nvidia.com/gpu": "2", "amd.com/gpu": "1"})])
    )
    assert p.devices == (("amd.com/gpu", 1), ("nvidia.com/gpu", 2))


def test_app_containers_are_summed_and_mig_slices_are_devices() -> None:
    p = both(
        pod(
            containers=[
                _c(limits={"nvidia.com/gpu": "1"}),
                _c(limits={"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "3"}),
                _c(limits={"gpu.intel.com/millicores": "500", "memory": "8Gi"}),  # not devices
            ]
        )
    )
    assert p.devices == (("nvidia.com/gpu", 3), ("nvidia.com/mig-1g.10gb", 3))


def test_init_containers_count_by_their_largest_step_not_their_sum() -> None:
    # kubernetes component-helpers resource/helpers.go AggregateContainerRequests: max(sum(app), max(init)).
    p = both(
        pod(
            containers=[_c(limits={"nvidia.com/gpu": "2"})],
            init_containers=[_c(limits={"nvidia.com/gpu": "4"}), _c(limits={"nvidia.com/gpu": "3"})],
        )
    )
    assert p.devices == (("nvidia.com/gpu", 4),)
    smaller = both(
        pod(
            containers=[_c(limits={"nvidia.com/gpu": "8"})],
            init_containers=[_c(limits={"nvidia.com/gpu": "1"})],
        )
    )
    assert smaller.devices == (("nvidia.com/gpu", 8),)


def test_sidecars_add_to_the_app_sum_and_to_later_init_steps() -> None:
    # A restartable init container (restartPolicy Always) runs beside the app containers and every later
    # init container: sum = 2 + 1 = 3; the init step after it needs 1 + 4 = 5; the one before it only 2.
    p = both(
        pod(
            containers=[_c(limits={"nvidia.com/gpu": "2"})],
            init_containers=[
                _c(limits={"nvidia.com/gpu": "2"}),
                _c(limits={"nvidia.com/gpu": "1"}, restartPolicy="Always"),
                _c(limits={"nvidia.com/gpu": "4"}),
            ],
        )
    )
    assert p.devices == (("nvidia.com/gpu", 5),)
    assert rules.pod_devices([(("g", 2),)], [((("g", 1),), True)]) == (("g", 3),)


def test_pod_devices_rule_directly() -> None:
    assert rules.pod_devices([], []) == ()
    assert rules.pod_devices([(("a", 1), ("b", 2)), (("a", 1),)], []) == (("a", 2), ("b", 2))
    assert rules.pod_devices([(("a", 1),)], [((("b", 5),), False)]) == (("a", 1), ("b", 5))


def test_custom_patterns_decide_what_a_device_is() -> None:
    projector = PodProjector(rules.AcceleratorMatcher(["example.com/fpga"]))
    p = projector.from_json(pod(containers=[_c(limits={"example.com/fpga": "2", "nvidia.com/gpu": "1"})]))
    assert p is not None and p.devices == (("example.com/fpga", 2),)


# --- failure data kept for the failure counter -----------------------------------------------------------


def test_failure_reasons_are_kept() -> None:
    p = both(
        pod(
            status={
                "phase": "Failed",
                "reason": "Evicted",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "b", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
                ],
            }
        )
    )
    assert (p.phase, p.status_reason, p.container_reason) == ("Failed", "Evicted", "OOMKilled")
    long = both(pod(status={"phase": "Failed", "reason": "R" * 500}))
    assert long.status_reason == "R" * rules.MAX_REASON_LABEL


# --- malformed input -------------------------------------------------------------------------------------


def test_typed_path_rejects_and_tolerant_path_salvages() -> None:
    bad = pod(containers=[_c(limits={"nvidia.com/gpu": None, "amd.com/gpu": "2"})])
    bad["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] = 7  # not a string
    with pytest.raises(msgspec.ValidationError):
        typed(bad)
    p = PROJECTOR.from_json(bad)
    assert p is not None
    assert p.flags & MALFORMED
    assert p.devices == (("amd.com/gpu", 2),)
    assert p.restart_attempt is None
    assert p.jobset == "llama"


@pytest.mark.parametrize(
    "mangle",
    [
        lambda o: o.update(spec=[]),
        lambda o: o.update(status="Running"),
        lambda o: o["spec"].update(containers={"a": 1}),
        lambda o: o["spec"].update(containers=[1, None, "x"]),
        lambda o: o["spec"].update(nodeName=5),
        lambda o: o["spec"].update(initContainers=[{"resources": []}]),
        lambda o: o["metadata"].update(labels=["a"]),
        lambda o: o["metadata"]["labels"].update({"jobset.sigs.k8s.io/jobset-name": {"x": 1}}),
        lambda o: o["status"].update(containerStatuses=[{"state": {"terminated": {"exitCode": "1"}}}, 3]),
        lambda o: o["metadata"].update(creationTimestamp=12),
        lambda o: o["metadata"].update(resourceVersion=None),
    ],
)
def test_malformed_pods_never_raise_and_are_flagged(mangle: Any) -> None:
    obj = pod()
    mangle(obj)
    p = PROJECTOR.salvage(obj)  # without from_json's safety net: a bug here must show
    assert p is not None
    assert p.key == "team-a/llama-node-0-0-abcde"


@pytest.mark.parametrize(
    "meta", [{}, {"name": "x"}, {"uid": "u"}, {"name": "", "uid": "u"}, {"name": 1, "uid": "u"}]
)
def test_pods_without_name_or_uid_are_unusable(meta: dict[str, Any]) -> None:
    assert PROJECTOR.salvage({"metadata": meta}) is None
    assert PROJECTOR.from_json("not an object") is None


def test_huge_device_counts_are_implausible_not_summed_into_overflow() -> None:
    p = both(pod(containers=[_c(limits={"nvidia.com/gpu": "1e300"})]))
    assert p.flags & IMPLAUSIBLE
    assert p.devices == (("nvidia.com/gpu", 2**63 - 1),)  # clamped to int64 as Kubernetes holds it


def test_unchanged_ignores_status_writes_the_series_do_not_read() -> None:
    a = both(pod())
    obj = pod()
    obj["metadata"]["resourceVersion"] = "43"
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    b = both(obj)
    assert PROJECTOR.unchanged(a, b)
    obj["status"]["phase"] = "Failed"
    assert not PROJECTOR.unchanged(a, both(obj))


# --- versions of one pod -----------------------------------------------------------------------------


def _wire(obj: dict[str, Any]) -> Any:
    line = msgspec.json.encode({"type": "MODIFIED", "object": obj})
    return msgspec.json.decode(line, type=WatchEvent[PROJECTOR.wire_type]).object


def test_a_new_version_shares_the_cached_key_and_uid_objects() -> None:
    """The informer passes the cached projection of the same key (``wire_key``): a new version keeps one key
    string and one uid object a pod, not one per version (the cache's dict keeps the first key)."""
    first = typed(pod(phase="Failed"))
    assert PROJECTOR.wire_key(_wire(pod())) == first.key
    update = pod(status={"phase": "Failed", "reason": "Evicted"})
    update["metadata"]["resourceVersion"] = "43"
    second = PROJECTOR.from_wire(_wire(update), first)
    assert second is not first and second.status_reason == "Evicted" and second.resource_version == "43"
    assert second.key is first.key and second.uid_key is first.uid_key
    other = pod(phase="Failed")
    other["metadata"]["uid"] = "uid-recreated"  # deleted and created again under the same name
    third = PROJECTOR.from_wire(_wire(other), first)
    assert third.key is first.key and third.uid == "uid-recreated"


def test_an_unchanged_pod_listed_again_is_the_cached_object() -> None:
    """A relist of a pod whose fields did not change, or a status write of nothing the projection reads,
    yields the cached projection itself: the cache and the pod series keep one object, not the old one
    beside a new copy. A Failed pod keeps the resourceVersion it failed at."""
    first = typed(pod())
    assert PROJECTOR.from_wire(_wire(pod()), first) is first
    probe = pod()
    probe["metadata"]["resourceVersion"] = "44"  # a status write of nothing the projection reads
    assert PROJECTOR.from_wire(_wire(probe), first) is first
    failed = typed(pod(phase="Failed"))
    later = pod(phase="Failed")
    later["metadata"]["resourceVersion"] = "45"
    assert PROJECTOR.from_wire(_wire(later), failed) is failed and failed.resource_version == "42"
