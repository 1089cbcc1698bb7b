"""HTTP routes. Thin: every answer comes from the running service's in-memory state (app/api/views.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from app.api import views
from app.api.deps import RunningService
from app.api.models import (
    ErrorResponse,
    LeadershipResponse,
    ProbeResponse,
    SnapshotResponse,
    TerminalPage,
)
from app.metrics.telemetry import Limit
from app.replica.service import Service
from app.serving.head import HeadAsGet


def _started(service: Service | None) -> Service:
    if service is None:
        raise HTTPException(status_code=503, detail="service is starting")
    return service


def _debug(service: Service | None) -> Service:
    started = _started(service)
    if not started.debug_endpoints:
        raise HTTPException(status_code=404, detail="debug endpoints are disabled")
    return started


def _probe(problems: list[str]) -> JSONResponse:
    body = ProbeResponse(status="ok" if not problems else "not-ready", reasons=problems)
    return JSONResponse(body.model_dump(), status_code=200 if not problems else 503)


_INDEX = """<!doctype html>
<html><head><meta charset="utf-8"><title>trainer-metrics</title></head>
<body><h1>trainer-metrics</h1>
<p>Prometheus exporter for Kubeflow Trainer.</p>
<ul>
<li><a href="metrics">/metrics</a>: Prometheus exposition</li>
<li><a href="debug/snapshot">/debug/snapshot</a>: runtime inventory and informer state</li>
<li><a href="debug/terminal">/debug/terminal</a>: terminal-dedup set</li>
<li><a href="debug/leadership">/debug/leadership</a>: leader election</li>
<li><a href="readyz">/readyz</a>, <a href="livez">/livez</a>: probes</li>
<li><a href="docs">/docs</a>: API reference</li>
</ul></body></html>
"""

_PROBE_RESPONSES: dict[int | str, dict[str, object]] = {503: {"model": ProbeResponse}}


def build_router() -> APIRouter:
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return _INDEX

    @router.get("/healthz", response_model=ProbeResponse, responses=_PROBE_RESPONSES, tags=["probes"])
    async def healthz(service: RunningService) -> JSONResponse:
        """Liveness: the process and its event loop answer. Never fails for an unreachable API server."""
        return _probe(_started(service).liveness_problems())

    @router.get("/livez", response_model=ProbeResponse, responses=_PROBE_RESPONSES, tags=["probes"])
    async def livez(service: RunningService) -> JSONResponse:
        """Liveness (same as /healthz)."""
        return _probe(_started(service).liveness_problems())

    @router.get("/readyz", response_model=ProbeResponse, responses=_PROBE_RESPONSES, tags=["probes"])
    async def readyz(service: RunningService) -> JSONResponse:
        """Readiness: every informer has synced its initial list and its watch is not stale."""
        return _probe(_started(service).readiness_problems())

    @router.get(
        "/metrics",
        tags=["metrics"],
        response_class=Response,
        responses={
            200: {
                "content": {
                    "text/plain": {},
                    "application/openmetrics-text": {},
                    "application/vnd.google.protobuf": {},
                }
            }
        },
    )
    async def metrics(
        service: RunningService,
        accept: Annotated[str | None, Header()] = None,
        accept_encoding: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Prometheus exposition: text 0.0.4, OpenMetrics (with exemplars) or protobuf (native histograms), by
        the Accept header's q-values; gzip if accepted."""
        body, headers = await _started(service).render_metrics(accept, accept_encoding)
        return Response(content=body, headers=headers)

    debug = APIRouter(prefix="/debug", tags=["debug"])

    @debug.get("/snapshot", response_model=SnapshotResponse, responses={404: {"model": ErrorResponse}})
    async def snapshot(service: RunningService) -> SnapshotResponse:
        """Runtime inventory, informer sync state and object counts."""
        return views.snapshot(_debug(service))

    @debug.get(
        "/terminal",
        response_model=TerminalPage,
        response_model_by_alias=True,
        response_model_exclude_none=True,
        responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
    )
    async def terminal(
        request: Request,
        service: RunningService,
        limit: Annotated[int, Query(ge=1, description="Entries per page (at most terminal_page_max).")] = 100,
        continue_: Annotated[
            str | None, Query(alias="continue", max_length=512, description="Token from the previous page.")
        ] = None,
    ) -> TerminalPage:
        """The terminal-dedup set: TrainJobs this replica has seen terminal, paginated."""
        view = _debug(service)
        if limit > view.terminal_page_max:
            if "limit" in request.query_params:
                view.telemetry.limit_hit(Limit.DEBUG_PAGE_SIZE)
                # FastAPI's own 422 body (HTTPValidationError): what the schema documents for 422.
                raise RequestValidationError(
                    [
                        {
                            "type": "less_than_equal",
                            "loc": ("query", "limit"),
                            "msg": f"limit must be at most {view.terminal_page_max}",
                            "input": limit,
                            "ctx": {"le": view.terminal_page_max},
                        }
                    ]
                )
            limit = view.terminal_page_max  # the default page size, clamped to a smaller configured maximum
        try:
            return views.terminal_page(view, limit, continue_)
        except views.InvalidContinueToken as exc:
            raise HTTPException(status_code=400, detail=f"invalid continue token: {exc}") from None

    @debug.get("/leadership", response_model=LeadershipResponse, responses={404: {"model": ErrorResponse}})
    async def leadership(service: RunningService) -> LeadershipResponse:
        """Leader election state of this replica."""
        return views.leadership(_debug(service))

    router.include_router(debug)
    return router


def install_routes(app: FastAPI) -> None:
    app.include_router(build_router())
    # No redirect from /metrics/ to /metrics: Starlette builds its Location from the Host header, so any
    # client could have the exporter answer with a link to a host of its choosing. A path we do not serve
    # is a 404 with a JSON body, trailing slash or not; scrape configs name the exact path.
    app.router.redirect_slashes = False
    app.add_middleware(HeadAsGet)
