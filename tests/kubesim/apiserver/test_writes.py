"""docs/design/k8s-protocol.md §3/§4 writes: POST/PUT/PATCH/DELETE, status subresource, Leases, exact
Status bodies."""

from __future__ import annotations

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kubesim.apiserver.core import LEASES
from kubesim.apiserver.storage.leases import now_micro
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.kinds import TRAINJOBS

from .conftest import trainjob

G, V = "trainer.kubeflow.org", "v1alpha1"
NS_TJ = TRAINJOBS.collection_path("team1")
NOW = "2025-03-01T10:15:30Z"


async def test_create_201_and_already_exists_409(http: aiohttp.ClientSession) -> None:
    async with http.post(NS_TJ, json=trainjob("a")) as resp:
        assert resp.status == 201
        assert (await resp.json())["metadata"]["managedFields"][0]["manager"] == "Python"  # aiohttp's UA
    async with http.post(NS_TJ, json=trainjob("a")) as resp:
        assert resp.status == 409
        assert await resp.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'trainjobs.trainer.kubeflow.org "a" already exists',
            "reason": "AlreadyExists",
            "details": {"name": "a", "group": "trainer.kubeflow.org", "kind": "trainjobs"},
            "code": 409,
        }


async def test_update_with_conflicts_kubernetes_asyncio(sim: SimulatedCluster, api: client.ApiClient) -> None:
    crd = client.CustomObjectsApi(api)
    created = await crd.create_namespaced_custom_object(G, V, "team1", "trainjobs", trainjob("a"))
    created["spec"]["suspend"] = True
    updated = await crd.replace_namespaced_custom_object(G, V, "team1", "trainjobs", "a", created)
    assert updated["metadata"]["generation"] == 2
    try:
        await crd.replace_namespaced_custom_object(G, V, "team1", "trainjobs", "a", created)  # stale RV
    except ApiException as exc:
        assert exc.status == 409 and "the object has been modified" in exc.body
    else:
        raise AssertionError("expected 409")
    cond = {"type": "Complete", "status": "True", "reason": "Done", "message": "", "lastTransitionTime": NOW}
    status = dict(updated, status={"conditions": [cond]})
    after = await crd.replace_namespaced_custom_object_status(G, V, "team1", "trainjobs", "a", status)
    assert after["status"]["conditions"][0]["type"] == "Complete" and after["metadata"]["generation"] == 2
    patched = await crd.patch_namespaced_custom_object(
        G,
        V,
        "team1",
        "trainjobs",
        "a",
        {"metadata": {"labels": {"p": "1"}}},
        _content_type="application/merge-patch+json",
    )
    assert patched["metadata"]["labels"]["p"] == "1"


async def test_put_requires_resource_version_and_cr_put_to_missing_is_404(
    http: aiohttp.ClientSession,
) -> None:
    async with http.post(NS_TJ, json=trainjob("a")) as resp:
        obj = await resp.json()
    del obj["metadata"]["resourceVersion"]
    async with http.put(f"{NS_TJ}/a", json=obj) as resp:
        assert resp.status == 422
        body = await resp.json()
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0x0: must be specified for an update",
            "field": "metadata.resourceVersion",
        }
    ]
    async with http.put(f"{NS_TJ}/missing", json=trainjob("missing")) as resp:
        assert resp.status == 404
        assert (await resp.json())["message"] == 'trainjobs.trainer.kubeflow.org "missing" not found'


async def test_patch_content_types(http: aiohttp.ClientSession) -> None:
    await (await http.post(NS_TJ, json=trainjob("a"))).read()
    ops = b'[{"op":"add","path":"/metadata/labels/x","value":"y"}]'
    async with http.patch(
        f"{NS_TJ}/a", data=ops, headers={"Content-Type": "application/json-patch+json"}
    ) as resp:
        assert resp.status == 200 and (await resp.json())["metadata"]["labels"]["x"] == "y"
    obj_patch = b'{"metadata":{"labels":{"x":"z"}}}'
    async with http.patch(
        f"{NS_TJ}/a", data=obj_patch, headers={"Content-Type": "application/json-patch+json"}
    ) as r:
        assert r.status == 400  # the kubernetes-asyncio dict-body pitfall
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    async with http.patch(f"{NS_TJ}/a", data=obj_patch, headers=smp) as resp:
        assert resp.status == 415 and (await resp.json())["reason"] == "UnsupportedMediaType"
    apply = {"Content-Type": "application/apply-patch+yaml"}
    config = b"apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {labels: {x: w}}"
    async with http.patch(f"{NS_TJ}/a", data=config, headers=apply) as resp:
        assert resp.status == 422  # fieldManager required
    async with http.patch(
        f"{NS_TJ}/a?fieldManager=me", data=b"metadata: {labels: {x: w}}", headers=apply
    ) as r:
        assert r.status == 400  # an apply configuration names its kind
    async with http.patch(f"{NS_TJ}/a?fieldManager=me", data=config, headers=apply) as r:
        assert r.status == 409  # x was set by the JSON patch above: owned by another manager
        assert (await r.json())["details"]["causes"][0]["field"] == ".metadata.labels.x"
    async with http.patch(f"{NS_TJ}/a?fieldManager=me&force=true", data=config, headers=apply) as r:
        assert r.status == 200 and (await r.json())["metadata"]["labels"]["x"] == "w"


async def test_status_subresource_semantics(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    async with http.post(NS_TJ, json=dict(trainjob("a"), status={"x": 1})) as resp:
        obj = await resp.json()
    assert "status" not in obj
    obj["spec"]["suspend"] = True
    obj["status"] = {"conditions": []}
    async with http.put(f"{NS_TJ}/a/status", json=obj) as resp:
        after = await resp.json()
    assert after["status"] == {"conditions": []} and after["spec"]["suspend"] is False
    async with http.put(f"{LEASES.collection_path('team1')}/l/status", json={}) as resp:
        assert resp.status == 404


async def test_delete_returns_object_and_200_with_finalizers(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    obj = trainjob("a")
    obj["metadata"]["finalizers"] = ["x/y"]
    await (await http.post(NS_TJ, json=obj)).read()
    async with http.delete(f"{NS_TJ}/a") as resp:
        # Not gone yet (a finalizer holds it): 200 with the object, as handlers/delete.go answers.
        assert resp.status == 200 and (await resp.json())["metadata"]["deletionTimestamp"]
    sim.store.patch(TRAINJOBS, "team1", "a", {"metadata": {"finalizers": None}})
    async with http.get(f"{NS_TJ}/a") as resp:
        assert resp.status == 404


async def test_leases_read_write_with_kubernetes_asyncio(
    sim: SimulatedCluster, api: client.ApiClient
) -> None:
    coord = client.CoordinationV1Api(api)
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="op-lock"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15, lease_transitions=0),
    )
    lease = await coord.create_namespaced_lease("team1", body)
    assert lease.metadata.resource_version and lease.spec.holder_identity == "a"
    lease.spec.holder_identity = "b"
    renewed = await coord.replace_namespaced_lease("op-lock", "team1", lease)
    assert renewed.spec.holder_identity == "b"
    try:
        await coord.replace_namespaced_lease("op-lock", "team1", lease)
    except ApiException as exc:
        assert exc.status == 409
    leases = await coord.list_namespaced_lease("team1")
    assert [x.metadata.name for x in leases.items] == ["op-lock"]
    await coord.delete_namespaced_lease("op-lock", "team1")
    assert sim.store.count(LEASES) == 0


async def test_lease_put_creates_and_validates_microtime(http: aiohttp.ClientSession) -> None:
    path = f"{LEASES.collection_path('team1')}/op-lock"
    lease = {
        "metadata": {"name": "op-lock"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "renewTime": now_micro(),
            "acquireTime": now_micro(),
        },
    }
    async with http.put(path, json=lease) as resp:
        assert resp.status == 201
        stored = await resp.json()
    stored["spec"]["renewTime"] = "2025-03-01T10:05:02Z"
    async with http.put(path, json=stored) as resp:
        assert resp.status == 400
    stored["spec"]["renewTime"] = now_micro()
    stored["spec"]["leaseDurationSeconds"] = 0
    async with http.put(path, json=stored) as resp:
        assert resp.status == 422
        assert (await resp.json())["message"] == (
            'Lease.coordination.k8s.io "op-lock" is invalid: spec.leaseDurationSeconds: Invalid value: 0: '
            "must be greater than 0"
        )


async def test_unknown_paths_and_discovery(http: aiohttp.ClientSession) -> None:
    async with http.get("/apis/example.com/v1/widgets") as resp:
        assert resp.status == 404
        assert await resp.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server could not find the requested resource",
            "reason": "NotFound",
            "details": {},
            "code": 404,
        }
    async with http.get("/version") as resp:
        assert (await resp.json())["major"] == "1"
    async with http.get("/apis") as resp:
        groups = {g["name"] for g in (await resp.json())["groups"]}
    assert groups == {"trainer.kubeflow.org", "coordination.k8s.io"}
    async with http.get("/apis/trainer.kubeflow.org/v1alpha1") as resp:
        names = {r["name"] for r in (await resp.json())["resources"]}
    assert "trainjobs/status" in names and "clustertrainingruntimes" in names
