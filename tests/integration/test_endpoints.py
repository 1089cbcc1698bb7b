"""HTTP endpoints of one replica against a simulated cluster: debug views, probes, /metrics, index.

Each test runs the real service (informers over real HTTP to ``SimulatedCluster``) and calls the FastAPI
app the service serves; see README "HTTP endpoints" and product.md §4.
"""

from __future__ import annotations

import base64
import gzip
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from app.api.models import SnapshotResponse, TerminalPage
from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.harness import (
    cluster_ref,
    runtime_manifest,
    terminal_status,
    trainjob_manifest,
    wait_caught_up,
    wait_leading,
    write_status,
)
from tests.support.replica_inprocess import Replica, replica
from tests.support.samples import parse_samples, scrape_counts
from tests.support.waiting import eventually

NO_ELECTION: dict[str, Any] = {
    "leader_election": False,
    "watch_timeout_min_seconds": 300,
    "watch_timeout_max_seconds": 600,
}
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"load_runtimes": True}  # the upstream ClusterTrainingRuntimes (tests/conftest.py: sim)


def assert_json_error(resp: Any, status: int) -> Any:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert body.get("detail")
    return body["detail"]


# --- /debug/snapshot -----------------------------------------------------------------------------------


async def test_debug_snapshot_content(sim: SimulatedCluster, kubeconfig: Path) -> None:
    custom = sim.store.create(
        TRAINING_RUNTIMES,
        "team1",
        runtime_manifest(
            "custom",
            namespace="team1",
            num_nodes=3,
            ml_policy="mpi",
            framework="deepspeed",
            pod_group_policy="coscheduling",
            gpus_per_node=2,
        ),
    )
    for i in range(4):
        sim.store.create(TRAINJOBS, "team1", trainjob_manifest(f"job-{i}"))
    write_status(sim.store, "team1", "job-0", terminal_status("Complete"))

    async with replica(kubeconfig, "a", **NO_ELECTION) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        resp = await r.http.get("/debug/snapshot")
        assert resp.status_code == 200
        body = resp.json()
        SnapshotResponse.model_validate(body)

        runtimes = {rt["runtime_ref"]: rt for rt in body["runtimes"]}
        assert [rt["runtime_ref"] for rt in body["runtimes"]] == sorted(runtimes)
        cluster_names = {e.key[1] for e in sim.store.entries(CLUSTER_TRAINING_RUNTIMES, None)}
        assert set(runtimes) == {cluster_ref(n) for n in cluster_names} | {
            "trainer.kubeflow.org/TrainingRuntime/team1/custom"
        }
        assert runtimes["trainer.kubeflow.org/TrainingRuntime/team1/custom"] == {
            "runtime_ref": "trainer.kubeflow.org/TrainingRuntime/team1/custom",
            "kind": "TrainingRuntime",
            "namespace": "team1",
            "name": "custom",
            "ml_policy": "mpi",
            "pod_group_policy": "coscheduling",
            "framework": "deepspeed",
            "num_nodes": 3,
            "default_nodes": 3,
            "accelerator_class": "nvidia.com/gpu",
            "accelerators_per_node": 2,
            "accelerators": {"nvidia.com/gpu": 2},
            "resource_version": custom["metadata"]["resourceVersion"],
        }
        torch = runtimes[cluster_ref("torch-distributed")]
        stored = sim.store.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")
        assert torch["kind"] == "ClusterTrainingRuntime" and torch["namespace"] == ""
        assert (torch["ml_policy"], torch["framework"]) == ("torch", "torch")
        assert torch["num_nodes"] == stored["spec"]["mlPolicy"].get("numNodes")
        assert torch["resource_version"] == stored["metadata"]["resourceVersion"]

        informers = {i["name"]: i for i in body["informers"]}
        assert set(informers) == {"clustertrainingruntimes", "trainingruntimes", "trainjobs"}
        assert informers["clustertrainingruntimes"]["objects"] == len(cluster_names)
        assert informers["trainingruntimes"]["objects"] == 1
        assert informers["trainjobs"]["objects"] == 4
        for info in informers.values():
            assert info["synced"] is True and info["stale"] is False
            assert info["resource_version"].isdigit()
            assert info["last_event_age_seconds"] >= 0
        assert body["trainjobs"] == 4
        assert body["terminal_entries"] == 1
        assert body["unknown_runtime_refs"] == 0
        remembered = body["remembered"]
        assert remembered["journal_size"] == r.service.settings.handover_journal_size
        # Nothing happened after the initial list: nothing to remember yet.
        assert remembered["journal_entries"] == remembered["tombstones"] == remembered["held_edges"] == 0
        assert remembered["metric_series"] > 0

        # A creation and a deletion after it: one countable event remembered, one deleted uid.
        sim.store.create(TRAINJOBS, "team1", trainjob_manifest("job-new"))
        sim.store.delete(TRAINJOBS, "team1", "job-1")
        await wait_caught_up(r, sim.store)
        remembered = (await r.http.get("/debug/snapshot")).json()["remembered"]
        assert (remembered["journal_entries"], remembered["tombstones"]) == (1, 1), remembered
        assert remembered["pending_created"] == 0


# --- /debug/terminal -----------------------------------------------------------------------------------


async def walk_terminal(r: Replica, limit: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": limit}
        if token is not None:
            params["continue"] = token
        resp = await r.http.get("/debug/terminal", params=params)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        TerminalPage.model_validate(page)
        assert len(page["items"]) <= limit
        items.extend(page["items"])
        pages += 1
        token = page.get("continue")
        if token is None:
            return items
        assert len(page["items"]) == limit  # only the last page is short
        assert pages < 1000


async def test_debug_terminal_pagination(sim: SimulatedCluster, kubeconfig: Path) -> None:
    uids = {}
    for i in range(23):
        ns = f"team{i % 3}"
        name = f"done-{i:02d}"
        uids[uids_key := (ns, name)] = sim.store.create(TRAINJOBS, ns, trainjob_manifest(name))["metadata"][
            "uid"
        ]
        write_status(sim.store, *uids_key, terminal_status("Failed" if i % 4 == 0 else "Complete"))
    sim.store.create(TRAINJOBS, "team0", trainjob_manifest("not-terminal"))

    async with replica(kubeconfig, "a", terminal_page_max=50, **NO_ELECTION) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)

        for limit in (1, 5, 23, 50):
            items = await walk_terminal(r, limit)
            got = [(e["namespace"], e["name"], e["uid"]) for e in items]
            assert got == sorted(got), limit  # a stable order: (namespace, name, uid)
            assert len(got) == len(set(got)) == 23, limit  # every entry exactly once
            assert {(ns, name): uid for ns, name, uid in got} == uids
        first = (await r.http.get("/debug/terminal", params={"limit": 5})).json()
        assert first["total"] == 23 and "continue" in first
        entry = first["items"][0]
        assert entry["result"] in ("succeeded", "failed")
        assert entry["reason"] == ("FailedJobs" if entry["result"] == "failed" else "none")
        assert entry["terminal_time"] and entry["recorded_time"]
        # No limit: the default page size (100), clamped to the configured maximum (50).
        default = (await r.http.get("/debug/terminal")).json()
        assert len(default["items"]) == 23 and "continue" not in default

        # Keyset pagination: deleting entries between pages neither skips nor repeats the others.
        page = (await r.http.get("/debug/terminal", params={"limit": 5})).json()
        for e in page["items"][-2:]:
            sim.store.delete(TRAINJOBS, e["namespace"], e["name"])
        await wait_caught_up(r, sim.store)
        rest = (
            await r.http.get("/debug/terminal", params={"limit": 50, "continue": page["continue"]})
        ).json()
        seen = [e["uid"] for e in page["items"]] + [e["uid"] for e in rest["items"]]
        assert rest["total"] == 21 and len(seen) == len(set(seen)) == 23

        # Bad requests: a JSON error body, never a 500.
        for bad in ("not base64 !!", base64.urlsafe_b64encode(b'{"a": 1}').decode(), "AAAA"):
            detail = assert_json_error(await r.http.get("/debug/terminal", params={"continue": bad}), 400)
            assert "continue" in detail
        for limit in ("0", "-1", "51", "abc"):
            assert_json_error(await r.http.get("/debug/terminal", params={"limit": limit}), 422)
        assert_json_error(await r.http.get("/debug/terminal", params={"continue": "x" * 513}), 422)
        ok = await r.http.get("/debug/terminal", params={"limit": 50})
        assert ok.status_code == 200


# --- probes --------------------------------------------------------------------------------------------


async def test_readyz_503_until_synced(sim: SimulatedCluster, kubeconfig: Path) -> None:
    # Every TrainJob LIST fails (503 Status) until the fault is cleared; the runtime informers sync.
    sim.faults.fail_next(10_000, status=503, retry_after=None, resource="trainjobs", watch=False)
    async with replica(kubeconfig, "a", **NO_ELECTION) as r:

        async def only_trainjobs_missing() -> Any:
            resp = await r.http.get("/readyz")
            body = resp.json()
            # The TrainJobs are listed after the runtimes: wait for a refused TrainJob LIST too.
            refused = sim.faults.counters["status_503"] >= 1
            return (
                refused
                and resp.status_code == 503
                and body["reasons"] == ["informer trainjobs has not synced"]
                and body
            )

        body = await eventually(only_trainjobs_missing, timeout=20, what="readyz naming trainjobs only")
        assert body["status"] == "not-ready"
        assert sim.faults.counters["status_503"] >= 1
        assert (await r.http.get("/livez")).status_code == 200  # not synced is not dead
        metrics = await r.http.get("/metrics")
        assert metrics.status_code == 200
        assert "kubeflow_trainer_" not in metrics.text  # nothing exported from a cache not yet synced
        assert 'trainer_metrics_informer_synced{informer="trainjobs"} 0.0' in metrics.text

        sim.faults.clear()

        async def ready() -> Any:
            resp = await r.http.get("/readyz")
            return resp.status_code == 200 and resp.json()

        body = await eventually(ready, timeout=60, what="readyz 200 after the LIST succeeds")
        assert body == {"status": "ok", "reasons": []}
        await wait_leading(r)


async def test_livez_200_while_api_server_down(tmp_path: Path) -> None:
    # Bookmarks every second, as a real API server's keep a quiet watch from looking dead (the informer
    # counts only received bytes as activity after a silent watch).
    sim = SimulatedCluster(load_runtimes=True, bookmark_interval=1.0)
    await sim.start()
    try:
        await _livez_while_down(sim, sim.write_kubeconfig(tmp_path / "kubeconfig"))
    finally:
        await sim.stop()


async def _livez_while_down(sim: SimulatedCluster, kubeconfig: Path) -> None:
    sim.store.create(TRAINJOBS, "team1", trainjob_manifest("job-0"))
    async with replica(kubeconfig, "a", **NO_ELECTION) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        assert (await r.http.get("/readyz")).status_code == 200

        await sim.stop()  # the API server is gone: connections refused

        async def not_ready() -> Any:
            for path in ("/livez", "/healthz"):
                resp = await r.http.get(path)
                assert resp.status_code == 200, (path, resp.text)
                assert resp.json() == {"status": "ok", "reasons": []}
            resp = await r.http.get("/readyz")
            return resp.status_code == 503 and resp.json()["reasons"]

        # Liveness holds throughout; readiness eventually says the watches are stale.
        reasons = await eventually(not_ready, timeout=30, interval=0.2, what="readyz 503 (stale watches)")
        assert any("stale" in reason for reason in reasons), reasons
        # The last known numbers are still served from the cache.
        resp = await r.http.get("/metrics")
        assert resp.status_code == 200
        assert (
            parse_samples(resp.text)[
                (
                    "kubeflow_trainer_trainjobs",
                    (
                        ("namespace", "team1"),
                        ("runtime_ref", cluster_ref("torch-distributed")),
                        ("state", "pending"),
                    ),
                )
            ]
            == 1
        )

        await sim.start()  # same port: the informers reconnect

        async def ready() -> bool:
            return (await r.http.get("/readyz")).status_code == 200

        await eventually(ready, timeout=60, what="readyz 200 after the API server is back")
        assert (await r.http.get("/livez")).status_code == 200
        sim.store.create(TRAINJOBS, "team1", trainjob_manifest("job-after"))
        await wait_caught_up(r, sim.store)


# --- /metrics ------------------------------------------------------------------------------------------


async def test_metrics_content_negotiation(sim: SimulatedCluster, kubeconfig: Path) -> None:
    sim.store.create(TRAINJOBS, "team1", trainjob_manifest("job-0"))
    async with replica(kubeconfig, "a", **NO_ELECTION) as r:
        await wait_leading(r)
        await wait_caught_up(r, sim.store)
        sim.store.create(TRAINJOBS, "team1", trainjob_manifest("job-1"))  # a counter with a value
        await wait_caught_up(r, sim.store)
        await scrape_counts(r)  # past the new series' born-at-zero render, so each format below shows the 1

        text = await r.http.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert text.status_code == 200
        assert text.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "content-encoding" not in text.headers
        assert "# EOF" not in text.text
        assert (
            parse_samples(text.text)[
                (
                    "kubeflow_trainer_trainjob_created_total",
                    (("namespace", "team1"), ("runtime_ref", cluster_ref("torch-distributed"))),
                )
            ]
            == 1
        )

        for accept in (PROMETHEUS_ACCEPT, "application/openmetrics-text"):
            om = await r.http.get("/metrics", headers={"Accept": accept, "Accept-Encoding": "identity"})
            assert om.status_code == 200
            assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
            assert om.text.endswith("# EOF\n") and om.text.count("# EOF") == 1
            families = {f.name: f for f in parse_openmetrics(om.text)}  # strict parser: valid OpenMetrics
            created = families["kubeflow_trainer_trainjob_created"]
            assert created.type == "counter"
            assert [s.value for s in created.samples if s.name.endswith("_total")] == [1]
            assert "trainer_metrics_leader" in families

        # An old Prometheus asking for OpenMetrics 0.0.1 gets the text format.
        old = await r.http.get("/metrics", headers={"Accept": "application/openmetrics-text; version=0.0.1"})
        assert old.headers["content-type"].startswith("text/plain; version=0.0.4")

        for accept in (None, PROMETHEUS_ACCEPT):
            headers = {"Accept-Encoding": "gzip"} | ({"Accept": accept} if accept else {})
            async with r.http.stream("GET", "/metrics", headers=headers) as resp:
                raw = b"".join([chunk async for chunk in resp.aiter_raw()])
            assert resp.status_code == 200 and resp.headers["content-encoding"] == "gzip"
            assert "accept-encoding" in resp.headers.get("vary", "").lower()
            assert raw[:2] == b"\x1f\x8b"
            body = gzip.decompress(raw).decode()
            assert "kubeflow_trainer_trainjobs{" in body
            assert body.endswith("# EOF\n") == (accept is not None)
        refused = await r.http.get("/metrics", headers={"Accept-Encoding": "gzip;q=0, identity"})
        assert "content-encoding" not in refused.headers


# --- debug endpoints off, index --------------------------------------------------------------------------


async def test_debug_endpoints_disabled_404_json(sim: SimulatedCluster, kubeconfig: Path) -> None:
    async with replica(kubeconfig, "a", debug_endpoints=False, **NO_ELECTION) as r:
        await wait_caught_up(r, sim.store)
        for path in ("/debug/snapshot", "/debug/terminal", "/debug/terminal?limit=5", "/debug/leadership"):
            detail = assert_json_error(await r.http.get(path), 404)
            assert "disabled" in detail
        assert (await r.http.get("/metrics")).status_code == 200
        await eventually(r.exporting, timeout=20, what="exporting without debug endpoints")
        assert (await r.http.get("/readyz")).status_code == 200


async def test_index_page_links(sim: SimulatedCluster, kubeconfig: Path) -> None:
    async with replica(kubeconfig, "a", **NO_ELECTION) as r:
        await wait_caught_up(r, sim.store)
        resp = await r.http.get("/")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
        links = re.findall(r'href="([^"]+)"', resp.text)
        assert set(links) >= {
            "metrics",
            "debug/snapshot",
            "debug/terminal",
            "debug/leadership",
            "readyz",
            "livez",
            "docs",
        }
        for link in links:
            target = await r.http.get("/" + link)  # relative links, resolved against "/"
            assert target.status_code == 200, (link, target.status_code)
        assert_json_error(await r.http.get("/no-such-page"), 404)
