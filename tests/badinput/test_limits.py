"""Safety limits (issue item 6): each cap, when hit, counts in trainer_metrics_limit_hits_total{limit}.

Unit level first (the cap and its hook), then as the Service wires them.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
from fastapi import FastAPI

from app.api.routes import install_routes
from app.config import Settings
from app.kube.informer import Informer, InformerOptions
from app.main import create_app
from app.metrics.telemetry import Limit, SelfTelemetry
from app.replica.service import Service
from app.trainer.informer_projectors import TRAINJOB_PROJECTOR
from app.trainer.kinds import TRAINJOBS
from app.trainer.state import TrainerState
from tests.badinput import strategies as S
from tests.support.informer_fakes import FakeClient, running, until


def hits(telemetry: SelfTelemetry, limit: str) -> float:
    value = telemetry.registry.get_sample_value("trainer_metrics_limit_hits_total", {"limit": limit})
    return value or 0.0


def job(i: int, runtime: str) -> Any:
    return TRAINJOB_PROJECTOR.from_json(
        {
            "metadata": {
                "name": f"j{i}",
                "uid": f"u{i}",
                "namespace": "ns",
                "resourceVersion": str(i),
                "creationTimestamp": "2025-06-01T10:00:00Z",
            },
            "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 1}},
        }
    )


def test_every_limit_is_exported_from_the_start() -> None:
    t = SelfTelemetry()
    for limit in Limit:
        assert t.registry.get_sample_value("trainer_metrics_limit_hits_total", {"limit": limit}) == 0.0


# --- unknown_runtime_refs ----------------------------------------------------------------------------


def test_unknown_runtime_ref_cap_counts_each_ref_it_collapses() -> None:
    telemetry = SelfTelemetry()
    sink = S.recording_sink()
    state = TrainerState(
        sink, max_unknown_runtime_refs=2, runtime_wait_seconds=0, on_limit=telemetry.limit_hit
    )
    for i, rt in enumerate(["rt-a", "rt-b", "rt-c", "rt-c", "rt-d", "rt-a"]):
        state.job_handler.on_added(job(i, rt), False)
    # rt-a and rt-b are admitted; rt-c (once, though two jobs use it) and rt-d collapse into "unknown"
    assert hits(telemetry, "unknown_runtime_refs") == 2
    refs = {key[1] for key in sink.gauge}
    assert refs == {
        "trainer.kubeflow.org/ClusterTrainingRuntime//rt-a",
        "trainer.kubeflow.org/ClusterTrainingRuntime//rt-b",
        "unknown",
    }


def test_unknown_runtime_ref_cap_without_hook_still_caps() -> None:
    sink = S.recording_sink()
    state = TrainerState(sink, max_unknown_runtime_refs=0, runtime_wait_seconds=0)
    state.job_handler.on_added(job(1, "rt-a"), False)
    assert {key[1] for key in sink.gauge} == {"unknown"}


def test_service_counts_unknown_runtime_ref_hits() -> None:
    svc = Service(Settings(max_unknown_runtime_refs=0, leader_election=False))
    svc.state.job_handler.on_added(job(1, "rt-a"), False)
    assert hits(svc.telemetry, "unknown_runtime_refs") == 1


# --- object_too_large --------------------------------------------------------------------------------


def _oversized(client: FakeClient, inf: Informer[Any]) -> None:
    """Run ``inf`` on ``client`` over a watch line above 64 KiB (in two chunks) until the watch ends."""
    line = b'{"type":"ADDED","object":{"metadata":{"name":"j"' + b" " * 70_000 + b"}}}\n"

    async def main() -> None:
        client.add_list(b'{"metadata":{"resourceVersion":"1"},"items":[]}')
        client.add_watch(line[:1000], line[1000:])
        async with running(inf):
            await until(lambda: sum(inf.counters.watch_restarts.values()) > 0)
        assert inf.counters.watch_restarts["oversized_line"] == 1

    asyncio.run(main())


def test_oversized_watch_line_is_skipped_and_counted_by_the_informer() -> None:
    state = TrainerState(S.recording_sink())
    client = FakeClient()
    inf: Informer[Any] = Informer(
        client,
        TRAINJOBS,
        None,
        TRAINJOB_PROJECTOR,
        state.job_handler,
        options=InformerOptions(max_object_bytes=64 * 1024),
    )
    _oversized(client, inf)
    assert inf.counters.skipped["too_large"] == 1
    assert len(inf) == 0


def test_service_counts_object_too_large_hits() -> None:
    svc = Service(Settings(max_object_bytes=64 * 1024, leader_election=False))
    client = FakeClient()
    informers = svc._build_informers(cast(Any, client))
    _oversized(client, informers[-1])
    assert hits(svc.telemetry, "object_too_large") == 1


# --- debug_page_size ---------------------------------------------------------------------------------


class View:
    terminal_page_max = 50
    debug_endpoints = True
    settings = Settings()

    def __init__(self) -> None:
        self.telemetry = SelfTelemetry()
        self.state = TrainerState(S.recording_sink())

    def terminal_page(self, limit: int, continue_token: str | None) -> Any:
        from app.api.models import TerminalPage

        entries, _ = self.state.terminal_entries(limit, continue_token)
        return TerminalPage(total=len(entries), items=[])


async def _get(app: FastAPI, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        return await http.get(path)


async def test_debug_page_size_cap_counts_rejected_requests_with_a_schema_shaped_body() -> None:
    app = FastAPI()
    install_routes(app)
    view = View()
    app.state.service = view
    resp = await _get(app, "/debug/terminal?limit=51")
    assert resp.status_code == 422
    (error,) = resp.json()["detail"]  # the HTTPValidationError shape that openapi.json documents for 422
    assert error["loc"] == ["query", "limit"] and error["type"] == "less_than_equal" and "50" in error["msg"]
    assert hits(view.telemetry, "debug_page_size") == 1
    # within the cap, or the default page clamped to a smaller configured maximum: not a hit
    for path in ("/debug/terminal?limit=50", "/debug/terminal"):
        assert (await _get(app, path)).status_code == 200
    assert hits(view.telemetry, "debug_page_size") == 1


async def test_service_counts_debug_page_size_hits() -> None:
    settings = Settings(terminal_page_max=10, leader_election=False)
    svc = Service(settings)
    app = create_app(settings)
    app.state.service = svc
    assert (await _get(app, "/debug/terminal?limit=100000")).status_code == 422
    assert hits(svc.telemetry, "debug_page_size") == 1
