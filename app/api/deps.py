"""Where the HTTP layer finds the running service: ``app.state.service``, set by app/main.py's lifespan
once the service has started (None before, and after shutdown). Read here only."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.applications import Starlette

from app.replica.service import Service

__all__ = ["RunningService", "running_service"]


def running_service(app: Starlette) -> Service | None:
    found: Service | None = app.state.service
    return found


async def _running_service(request: Request) -> Service | None:
    # Never raises: FastAPI runs dependencies before it validates the query, so a dependency answering
    # 503 (starting) or 404 (debug off) would pre-empt the 422 of a malformed query. The routes do it.
    # async, though it awaits nothing: FastAPI runs a plain `def` dependency in a worker thread, and on
    # every scrape that thread would take the GIL from the event loop (bench P5: scrapes of 20-30 ms and
    # loop stalls under a watch firehose).
    return running_service(request.app)


RunningService = Annotated[Service | None, Depends(_running_service)]
"""A route parameter of this type receives the running service (None while it starts)."""
