"""docs/design/k8s-protocol.md §0/§3 object rules, checked directly on the Store (the API the generator
shares)."""

from __future__ import annotations

import orjson
import pytest

from kubesim.apiserver.core import LEASES
from kubesim.apiserver.schema.validation import WriteOptions
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.leases import now_micro
from kubesim.trainer import manifests
from kubesim.trainer.cluster import load_cluster_training_runtimes, trainer_store
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINJOBS

from .conftest import trainjob


def test_one_global_revision_and_noop_writes_do_not_bump() -> None:
    store = trainer_store()
    assert store.resource_version == 4  # the system namespaces: default, kube-node-lease, kube-public, ...
    a = store.create(TRAINJOBS, "team1", trainjob("a"))  # namespace team1 is created first (rv 5)
    lease = store.create(LEASES, "team1", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "x"}})
    assert (a["metadata"]["resourceVersion"], lease["metadata"]["resourceVersion"]) == ("6", "7")
    same = store.update(TRAINJOBS, "team1", a)
    assert same["metadata"]["resourceVersion"] == "6" and store.resource_version == 7
    items, list_rv = store.list(TRAINJOBS, None)
    assert list_rv == 7 and [i["metadata"]["name"] for i in items] == ["a"]


def test_server_fields_defaults_and_status_dropped_on_create() -> None:
    store = trainer_store()
    obj = trainjob("a")
    obj["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    created = store.create(TRAINJOBS, "team1", obj)
    meta = created["metadata"]
    assert meta["generation"] == 1 and len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z")
    assert len(meta["creationTimestamp"]) == 20  # RFC3339, second precision
    assert "status" not in created
    assert created["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert created["spec"]["suspend"] is False
    assert created["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    mf = meta["managedFields"][0]
    assert mf["fieldsType"] == "FieldsV1" and "f:spec" in mf["fieldsV1"]


def test_generation_bumps_on_spec_only_and_status_subresource_rules() -> None:
    store = trainer_store()
    a = store.create(TRAINJOBS, "team1", trainjob("a"))
    a["metadata"]["labels"]["x"] = "y"
    a = store.update(TRAINJOBS, "team1", a)
    assert a["metadata"]["generation"] == 1
    a["spec"]["suspend"] = True
    a["status"] = {"ignored": True}  # main-resource writes keep the stored status
    a = store.update(TRAINJOBS, "team1", a)
    assert a["metadata"]["generation"] == 2 and "status" not in a
    a["status"] = {"conditions": []}
    a["spec"]["suspend"] = False  # status writes change only .status
    s = store.update(TRAINJOBS, "team1", a, subresource="status")
    assert s["status"] == {"conditions": []} and s["spec"]["suspend"] is True
    assert s["metadata"]["generation"] == 2
    assert [m.get("subresource") for m in s["metadata"]["managedFields"]] == [None, "status"]


def test_update_preconditions() -> None:
    store = trainer_store()
    a = store.create(TRAINJOBS, "team1", trainjob("a"))
    stale = dict(a)
    a["spec"]["suspend"] = True
    store.update(TRAINJOBS, "team1", a)
    with pytest.raises(StoreError) as exc:
        store.update(TRAINJOBS, "team1", stale)
    assert exc.value.code == 409 and exc.value.status["reason"] == "Conflict"
    del a["metadata"]["resourceVersion"]
    with pytest.raises(StoreError) as exc:
        store.update(TRAINJOBS, "team1", a)
    assert exc.value.code == 422
    assert exc.value.status["message"] == (
        'TrainJob.trainer.kubeflow.org "a" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )


def test_delete_with_finalizers_then_removal() -> None:
    store = trainer_store()
    obj = trainjob("a")
    obj["metadata"]["finalizers"] = ["example.com/keep"]
    store.create(TRAINJOBS, "team1", obj)
    marked = store.delete(TRAINJOBS, "team1", "a")
    assert marked["metadata"]["deletionTimestamp"] and marked["metadata"]["deletionGracePeriodSeconds"] == 0
    marked["metadata"]["finalizers"] = []
    gone = store.update(TRAINJOBS, "team1", marked)
    with pytest.raises(StoreError):
        store.get(TRAINJOBS, "team1", "a")
    events = store.events_since(TRAINJOBS, 0)
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[-1].rv == store.resource_version == int(gone["metadata"]["resourceVersion"])


def test_history_window_expires_old_revisions() -> None:
    store = trainer_store(history_window=16)
    for i in range(40):
        store.create(TRAINJOBS, "team1", trainjob(f"j{i}"))
    with pytest.raises(StoreError) as exc:
        store.events_since(TRAINJOBS, 1)
    assert exc.value.code == 410 and exc.value.status["message"].startswith("too old resource version: 1 (")
    assert len(store.events_since(TRAINJOBS, store.resource_version - 5)) == 5


def test_lease_rules() -> None:
    store = trainer_store()
    opts = WriteOptions(require_namespace=False)
    ok = {"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 15, "renewTime": now_micro()}}
    assert "generation" not in store.create(LEASES, "ns", ok, opts=opts)["metadata"]
    for bad_time in ("2025-03-01T10:05:02Z", "2025-03-01T10:05:02.123Z"):
        with pytest.raises(StoreError) as exc:
            store.create(
                LEASES, "ns", {"metadata": {"name": "b"}, "spec": {"renewTime": bad_time}}, opts=opts
            )
        assert exc.value.code == 400
    with pytest.raises(StoreError) as exc:
        store.create(
            LEASES, "ns", {"metadata": {"name": "b"}, "spec": {"leaseDurationSeconds": 0}}, opts=opts
        )
    assert exc.value.code == 422 and exc.value.status["details"]["kind"] == "Lease"
    with pytest.raises(StoreError) as exc:
        store.create(LEASES, "ns", {"metadata": {"name": "b"}, "spec": {"leaseTransitions": -1}}, opts=opts)
    assert exc.value.code == 422
    # Python callers without options write what they are given (objects a real cluster may hold).
    assert store.create(LEASES, "ns", {"metadata": {"name": "raw"}, "spec": {"leaseTransitions": -1}})


def test_real_runtimes_load_and_objects_have_realistic_size() -> None:
    store = trainer_store()
    assert load_cluster_training_runtimes(store) == len(manifests.cluster_training_runtimes()) > 0
    assert load_cluster_training_runtimes(store) == 0
    job = store.create(TRAINJOBS, "team1", trainjob("a", trainer={"numNodes": 2}))
    assert len(orjson.dumps(job)) > 700
    names = [e.key[1] for e in store.entries(CLUSTER_TRAINING_RUNTIMES, None)]
    assert "torch-distributed" in names


def test_merge_and_json_patch() -> None:
    store = trainer_store()
    store.create(TRAINJOBS, "team1", trainjob("a"))
    p = store.patch(TRAINJOBS, "team1", "a", {"metadata": {"labels": {"app": None, "b": "1"}}})
    assert p["metadata"]["labels"] == {"b": "1"}
    p = store.patch(
        TRAINJOBS,
        "team1",
        "a",
        [{"op": "replace", "path": "/spec/suspend", "value": True}],
        patch_type="json",
    )
    assert p["spec"]["suspend"] is True and p["metadata"]["generation"] == 2
    with pytest.raises(StoreError) as exc:
        store.patch(TRAINJOBS, "team1", "a", {"metadata": {"resourceVersion": "1"}})
    assert exc.value.code == 409
