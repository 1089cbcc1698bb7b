"""Pods in the simulated API server (core/v1, as kube-apiserver serves them): created through the typed
client, status reset to Pending on create and written through pods/status only, listed and watched by label
selector (existence included), and RBAC denials (``faults.deny``) answered with the authorizer's 403."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kubesim.apiserver.core import PODS
from kubesim.trainer.cluster import SimulatedCluster

JOBSET = "jobset.sigs.k8s.io/jobset-name"


def pod(name: str, labels: dict[str, str] | None = None, node: str = "n1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "node", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


async def test_create_resets_status_and_status_is_its_own_subresource(
    sim: SimulatedCluster, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    created = await core.create_namespaced_pod("team1", pod("p1", {JOBSET: "llama"}))
    # pkg/registry/core/pod/strategy.go PrepareForCreate: the status a client sends is not kept
    assert created.status.phase == "Pending"
    assert created.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
    stored = sim.store.get(PODS, "team1", "p1")
    stored["status"] = {
        "phase": "Failed",
        "reason": "Evicted",
        "containerStatuses": [
            {
                "name": "node",
                "ready": False,
                "restartCount": 0,
                "image": "pytorch",
                "imageID": "",
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        ],
    }
    updated = await core.replace_namespaced_pod_status("p1", "team1", stored)
    assert (updated.status.phase, updated.status.reason) == ("Failed", "Evicted")
    assert updated.status.container_statuses[0].state.terminated.reason == "OOMKilled"
    # A write of the pod itself keeps the stored status (the kubelet's).
    again = sim.store.get(PODS, "team1", "p1")
    again["metadata"]["labels"]["extra"] = "x"
    again["status"] = {"phase": "Running"}
    relabelled = await core.replace_namespaced_pod("p1", "team1", again)
    assert relabelled.status.phase == "Failed" and relabelled.metadata.labels["extra"] == "x"


async def test_list_and_watch_by_label_existence(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    sim.store.create(PODS, "team1", pod("of-jobset", {JOBSET: "llama"}))
    sim.store.create(PODS, "team2", pod("other-jobset", {JOBSET: "mistral"}))
    sim.store.create(PODS, "team1", pod("plain"))
    async with http.get(f"{sim.url}/api/v1/pods", params={"labelSelector": JOBSET}) as resp:
        body = orjson.loads(await resp.read())
    assert body["kind"] == "PodList"
    assert sorted(i["metadata"]["name"] for i in body["items"]) == ["of-jobset", "other-jobset"]
    rv = body["metadata"]["resourceVersion"]
    params = {"labelSelector": JOBSET, "watch": "true", "resourceVersion": rv, "timeoutSeconds": "5"}
    async with http.get(f"{sim.url}/api/v1/namespaces/team1/pods", params=params) as resp:
        sim.store.create(PODS, "team1", pod("plain-2"))
        sim.store.create(PODS, "team1", pod("of-jobset-2", {JOBSET: "llama"}))
        line = await asyncio.wait_for(resp.content.readline(), 5)
    event = orjson.loads(line)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "of-jobset-2")


async def test_denied_pods_get_the_authorizers_403_and_the_rest_works(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    sim.faults.deny("pods")
    async with http.get(f"{sim.url}/api/v1/pods", params={"labelSelector": JOBSET}) as resp:
        assert resp.status == 403
        status = orjson.loads(await resp.read())
    assert status["reason"] == "Forbidden" and status["details"] == {"kind": "pods"}
    assert status["message"] == (
        'pods is forbidden: User "system:serviceaccount:default:trainer-metrics" cannot list resource "pods" '
        'in API group "" at the cluster scope'
    )
    async with http.get(f"{sim.url}/api/v1/namespaces/team1/pods/p", params={}) as resp:
        status = orjson.loads(await resp.read())
    assert (
        status["message"].startswith('pods "p" is forbidden')
        and 'cannot get resource "pods"' in status["message"]
    )
    assert status["message"].endswith('in the namespace "team1"')
    async with http.get(f"{sim.url}/api/v1/namespaces/team1/events") as resp:
        assert resp.status == 200
    sim.faults.allow("pods")
    async with http.get(f"{sim.url}/api/v1/pods") as resp:
        assert resp.status == 200


async def test_a_denial_can_be_per_namespace_and_verb(
    sim: SimulatedCluster, http: aiohttp.ClientSession
) -> None:
    sim.faults.deny("pods", namespace="team1", verbs=("watch",))
    async with http.get(f"{sim.url}/api/v1/namespaces/team1/pods") as resp:
        assert resp.status == 200
    async with http.get(f"{sim.url}/api/v1/namespaces/team1/pods", params={"watch": "true"}) as resp:
        assert resp.status == 403
    async with http.get(
        f"{sim.url}/api/v1/namespaces/team2/pods", params={"watch": "true", "timeoutSeconds": "1"}
    ) as resp:
        assert resp.status == 200


async def test_pods_are_in_discovery_with_their_status_subresource(
    sim: SimulatedCluster, api: client.ApiClient
) -> None:
    resources = await client.CoreV1Api(api).get_api_resources()
    names = {r.name for r in resources.resources}
    assert {"pods", "pods/status"} <= names
    try:
        await client.CoreV1Api(api).read_namespaced_pod("absent", "team1")
    except ApiException as exc:
        assert exc.status == 404


async def test_binding_assigns_a_node_once(sim: SimulatedCluster, http: aiohttp.ClientSession) -> None:
    # pkg/registry/core/pod/storage BindingREST: what the scheduler POSTs to pods/<name>/binding.
    sim.store.create(PODS, "team1", pod("p", node=""))
    url = f"{sim.url}/api/v1/namespaces/team1/pods/p/binding"
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": "n7"},
    }
    async with http.post(url, json=binding) as resp:
        assert resp.status == 201
        assert orjson.loads(await resp.read())["status"] == "Success"
    assert sim.store.get(PODS, "team1", "p")["spec"]["nodeName"] == "n7"
    async with http.post(url, json={**binding, "target": {"kind": "Node", "name": "n8"}}) as resp:
        assert resp.status == 409
        status = orjson.loads(await resp.read())
    assert (
        status["message"]
        == 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n7"'
    )
    async with http.post(url, json={**binding, "target": {"kind": "Pod", "name": "x"}}) as resp:
        assert resp.status == 422
    async with http.post(f"{sim.url}/api/v1/namespaces/team1/pods/absent/binding", json=binding) as resp:
        assert resp.status == 404


async def test_a_pods_spec_is_immutable_but_for_images(sim: SimulatedCluster, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod("team1", pod("p", node=""))
    stored = sim.store.get(PODS, "team1", "p")
    stored["spec"]["nodeName"] = "n1"  # binding is the way to a node, not an update
    try:
        await core.replace_namespaced_pod("p", "team1", stored)
        raise AssertionError("the update was accepted")
    except ApiException as exc:
        assert exc.status == 422
        assert "pod updates may not change fields other than" in orjson.loads(exc.body)["message"]
    stored = sim.store.get(PODS, "team1", "p")
    stored["spec"]["containers"][0]["image"] = "pytorch:2"
    stored["metadata"]["labels"] = {"relabelled": "yes"}
    updated = await core.replace_namespaced_pod("p", "team1", stored)
    assert updated.spec.containers[0].image == "pytorch:2" and updated.metadata.labels == {
        "relabelled": "yes"
    }
