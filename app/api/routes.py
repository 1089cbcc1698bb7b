"""HTTP routes. Thin: every answer comes from the in-memory state behind ``ServiceView``."""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import APIRouter, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from app.api.models import (
    ErrorResponse,
    LeadershipResponse,
    ProbeResponse,
    SnapshotResponse,
    TerminalPage,
)


class InvalidContinueToken(ValueError):
    """The `continue` token of a /debug/terminal request cannot be decoded."""


class ServiceView(Protocol):
    """What the routes need of the running service."""

    terminal_page_max: int
    debug_endpoints: bool

    def liveness_problems(self) -> list[str]: ...

    def readiness_problems(self) -> list[str]: ...

    async def render_metrics(
        self, accept: str | None, accept_encoding: str | None
    ) -> tuple[bytes, dict[str, str]]: ...

    def snapshot(self) -> SnapshotResponse: ...

    def terminal_page(self, limit: int, continue_token: str | None) -> TerminalPage: ...

    def leadership(self) -> LeadershipResponse: ...


DEBUG_PAGE_SIZE_LIMIT = "debug_page_size"  # app.metrics.telemetry.LIMITS


def _limit_hit(view: ServiceView, limit: str) -> None:
    """Count a safety-limit hit in the view's SelfTelemetry, when it has one (the Service does)."""
    telemetry = getattr(view, "telemetry", None)
    if telemetry is not None:
        telemetry.limit_hit(limit)


def _view(request: Request) -> ServiceView:
    view: ServiceView | None = getattr(request.app.state, "service", None)
    if view is None:
        raise HTTPException(status_code=503, detail="service is starting")
    return view


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
    async def healthz(request: Request) -> JSONResponse:
        """Liveness: the process and its event loop answer. Never fails for an unreachable API server."""
        return _probe(_view(request).liveness_problems())

    @router.get("/livez", response_model=ProbeResponse, responses=_PROBE_RESPONSES, tags=["probes"])
    async def livez(request: Request) -> JSONResponse:
        """Liveness (same as /healthz)."""
        return _probe(_view(request).liveness_problems())

    @router.get("/readyz", response_model=ProbeResponse, responses=_PROBE_RESPONSES, tags=["probes"])
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: every informer has synced its initial list and its watch is not stale."""
        return _probe(_view(request).readiness_problems())

    @router.get(
        "/metrics",
        tags=["metrics"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}, "application/openmetrics-text": {}}}},
    )
    async def metrics(
        request: Request,
        accept: Annotated[str | None, Header()] = None,
        accept_encoding: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Prometheus exposition: text 0.0.4, OpenMetrics if the Accept header asks, gzip if accepted."""
        body, headers = await _view(request).render_metrics(accept, accept_encoding)
        return Response(content=body, headers=headers)

    debug = APIRouter(prefix="/debug", tags=["debug"])

    def _debug_view(request: Request) -> ServiceView:
        view = _view(request)
        if not view.debug_endpoints:
            raise HTTPException(status_code=404, detail="debug endpoints are disabled")
        return view

    @debug.get("/snapshot", response_model=SnapshotResponse, responses={404: {"model": ErrorResponse}})
    async def snapshot(request: Request) -> SnapshotResponse:
        """Runtime inventory, informer sync state and object counts."""
        return _debug_view(request).snapshot()

    @debug.get(
        "/terminal",
        response_model=TerminalPage,
        response_model_by_alias=True,
        response_model_exclude_none=True,
        responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
    )
    async def terminal(
        request: Request,
        limit: Annotated[int, Query(ge=1, description="Entries per page (at most terminal_page_max).")] = 100,
        continue_: Annotated[
            str | None, Query(alias="continue", max_length=512, description="Token from the previous page.")
        ] = None,
    ) -> TerminalPage:
        """The terminal-dedup set: TrainJobs this replica has seen terminal, paginated."""
        view = _debug_view(request)
        if limit > view.terminal_page_max:
            if "limit" in request.query_params:
                _limit_hit(view, DEBUG_PAGE_SIZE_LIMIT)
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
            return view.terminal_page(limit, continue_)
        except InvalidContinueToken as exc:
            raise HTTPException(status_code=400, detail=f"invalid continue token: {exc}") from None

    @debug.get("/leadership", response_model=LeadershipResponse, responses={404: {"model": ErrorResponse}})
    async def leadership(request: Request) -> LeadershipResponse:
        """Leader election state of this replica."""
        return _debug_view(request).leadership()

    router.include_router(debug)
    return router


def install_routes(app: FastAPI) -> None:
    app.include_router(build_router())
