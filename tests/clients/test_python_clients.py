"""The official ``kubernetes`` Python client (list pages, watch with bookmarks, resume, 410, its leader
election), lightkube (generic CRD resources, server-side apply) and kr8s against ``python -m kubesim``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from .conftest import Cluster, calling, trainjob

KUBE = "kubernetes (official Python client)"
G, V, P = "trainer.kubeflow.org", "v1alpha1", "trainjobs"


@pytest.fixture
def kube(cluster: Cluster) -> Any:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client
    api_client.close()


def _api(cluster: Cluster) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


def test_kubernetes_list_pages_watch_resume_and_410(cluster: Cluster) -> None:
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException

    api_client = _api(cluster)
    crd = client.CustomObjectsApi(api_client)
    ns = "clients-python"
    with calling(KUBE, "list_cluster_custom_object (all pages, limit=7)"):
        everything = crd.list_cluster_custom_object(G, V, P)
        names, token, pages = [], None, 0
        while True:
            page = crd.list_cluster_custom_object(G, V, P, limit=7, _continue=token)
            names += [i["metadata"]["name"] for i in page["items"]]
            pages += 1
            token = page["metadata"].get("continue")
            if not token:
                break
        assert pages > 1 and sorted(names) == sorted(i["metadata"]["name"] for i in everything["items"])
    with calling(KUBE, "create_namespaced_custom_object"):
        crd.create_namespaced_custom_object(G, V, ns, P, trainjob("w0", ns))
    with calling(KUBE, "create into a missing namespace (404)"):
        with pytest.raises(ApiException) as missing:
            crd.create_namespaced_custom_object(G, V, "nowhere", P, trainjob("w0", "nowhere"))
        assert missing.value.status == 404
    with calling(KUBE, "create an invalid TrainJob (422)"):
        with pytest.raises(ApiException) as bad:
            crd.create_namespaced_custom_object(G, V, ns, P, trainjob("Bad_Name", ns))
        assert bad.value.status == 422
    listed = crd.list_namespaced_custom_object(G, V, ns, P)
    start_rv = listed["metadata"]["resourceVersion"]
    with calling(KUBE, "Watch().stream with allow_watch_bookmarks"):
        w = watch.Watch()
        seen: list[str] = []
        for event in w.stream(
            crd.list_namespaced_custom_object, G, V, ns, P, allow_watch_bookmarks=True, timeout_seconds=3
        ):
            seen.append(event["type"])
            if "BOOKMARK" in seen:
                w.stop()
        assert seen[0] == "ADDED" and "BOOKMARK" in seen
    with calling(KUBE, "resume a watch from a list's resourceVersion"):
        crd.create_namespaced_custom_object(G, V, ns, P, trainjob("w1", ns))
        w = watch.Watch()
        events = []
        for event in w.stream(
            crd.list_namespaced_custom_object, G, V, ns, P, resource_version=start_rv, timeout_seconds=2
        ):
            events.append((event["type"], event["object"]["metadata"]["name"]))
            w.stop()
        assert events == [("ADDED", "w1")]
    with calling(KUBE, "watch from a compacted resourceVersion (410 Expired)"):
        for i in range(400):  # more than the 300-event watch history (trimmed in batches of 300 // 8)
            body = {"metadata": {"labels": {"n": str(i)}}}
            crd.patch_namespaced_custom_object(G, V, ns, P, "w1", body)
        with pytest.raises(ApiException) as gone:
            for _ in watch.Watch().stream(
                crd.list_namespaced_custom_object, G, V, ns, P, resource_version=start_rv, timeout_seconds=2
            ):
                pass
        assert gone.value.status == 410
    api_client.close()


def test_kubernetes_leader_election(cluster: Cluster) -> None:
    """The client's own LeaseLock election, in a child process (its loop never returns while leading)."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from kubernetes import config
        from kubernetes.leaderelection import electionconfig, leaderelection
        from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
        config.load_kube_config(config_file={str(cluster.kubeconfig)!r})
        def lead():
            print("LEADING", flush=True)
            os._exit(0)
        lock = LeaseLock("py-election", "clients-python", "candidate-1")
        cfg = electionconfig.Config(lock, lease_duration=4, renew_deadline=3, retry_period=1,
                                    onstarted_leading=lead, onstopped_leading=None)
        leaderelection.LeaderElection(cfg).run()
        sys.exit(3)
        """
    )
    with calling(KUBE, "leaderelection.LeaderElection(LeaseLock).run()"):
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0 and "LEADING" in proc.stdout, proc.stdout + proc.stderr
    from kubernetes import client

    api_client = _api(cluster)
    with calling(KUBE, "read_namespaced_lease"):
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease("py-election", "clients-python")
        assert lease.spec.holder_identity == "candidate-1" and lease.spec.lease_duration_seconds == 4
    api_client.close()


LIGHTKUBE = "lightkube"


def test_lightkube_generic_resources(cluster: Cluster) -> None:
    from lightkube import ApiError, Client, KubeConfig
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.core_v1 import Namespace
    from lightkube.types import PatchType

    ns = "clients-lightkube"
    TrainJob = create_namespaced_resource(G, V, "TrainJob", P)
    with calling(LIGHTKUBE, "Client(KubeConfig.from_file)"):
        kc = Client(KubeConfig.from_file(str(cluster.kubeconfig)), field_manager="lightkube")
    with calling(LIGHTKUBE, "list(Namespace)"):
        assert ns in [n.metadata.name for n in kc.list(Namespace)]
    with calling(LIGHTKUBE, "list(TrainJob, namespace='*')"):
        assert len(list(kc.list(TrainJob, namespace="*"))) >= 30
    with calling(LIGHTKUBE, "create(TrainJob)"):
        made = kc.create(TrainJob.from_dict(trainjob("lk", ns, trainer={"numNodes": 2})))  # type: ignore[attr-defined]
        assert made.metadata.name == "lk" and made.spec["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    with calling(LIGHTKUBE, "patch(TrainJob, merge)"):
        patched = kc.patch(
            TrainJob, "lk", {"spec": {"suspend": True}}, namespace=ns, patch_type=PatchType.MERGE
        )
        assert patched.spec["suspend"] is True
    with calling(LIGHTKUBE, "apply(TrainJob) (server-side apply)"):
        config = trainjob("lk-applied", ns, trainer={"numNodes": 1})
        applied = kc.apply(TrainJob.from_dict(config))  # type: ignore[attr-defined]
        assert any(m.operation == "Apply" for m in applied.metadata.managedFields)
    with calling(LIGHTKUBE, "create an invalid TrainJob raises ApiError 422"):
        with pytest.raises(ApiError) as bad:
            kc.create(TrainJob.from_dict(trainjob("bad", ns, trainer={"numNodes": "abc"})))  # type: ignore[attr-defined]
        assert bad.value.status.code == 422
    with calling(LIGHTKUBE, "watch(TrainJob)"):
        for op, obj in kc.watch(TrainJob, namespace=ns):
            assert op == "ADDED" and obj.metadata.name in ("lk", "lk-applied")
            break
    with calling(LIGHTKUBE, "delete(TrainJob)"):
        kc.delete(TrainJob, "lk", namespace=ns)
        with pytest.raises(ApiError) as gone:
            kc.get(TrainJob, "lk", namespace=ns)
        assert gone.value.status.code == 404


KR8S = "kr8s"


def test_kr8s(cluster: Cluster) -> None:
    import kr8s
    from kr8s.objects import new_class

    ns = "clients-kr8s"
    with calling(KR8S, "kr8s.api(kubeconfig=...)"):
        api = kr8s.api(kubeconfig=str(cluster.kubeconfig))
    with calling(KR8S, "api.version()"):
        assert api.version()["gitVersion"].startswith("v1.")
    with calling(KR8S, "api.get('namespaces')"):
        assert ns in [n.name for n in api.get("namespaces")]
    with calling(KR8S, "api.get('trainjobs', namespace=kr8s.ALL)"):
        assert len(list(api.get("trainjobs", namespace=kr8s.ALL))) >= 30
    TrainJob = new_class(kind="TrainJob", version=f"{G}/{V}", namespaced=True)
    with calling(KR8S, "TrainJob(...).create()"):
        job = TrainJob(trainjob("k8", ns), api=api)
        job.create()
        assert job.raw["metadata"]["uid"]
    with calling(KR8S, "patch()"):
        job.patch({"metadata": {"labels": {"by": "kr8s"}}})
        assert job.labels["by"] == "kr8s"
    with calling(KR8S, "refresh() and exists()"):
        job.refresh()
        assert job.exists() and job.spec["runtimeRef"]["name"] == "torch-distributed"
    with calling(KR8S, "delete()"):
        job.delete()
        assert not job.exists()
