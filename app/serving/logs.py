"""Bounded logging for the HTTP server: one line per message template per interval, not one per event.

Under a flood, uvicorn logs "Invalid HTTP request received." for every malformed request and asyncio one
line per failed accept (the ~2 million lines seen in 35 s when accept() ran out of descriptors): both
would write as fast as a client can send. These wrappers put a per-message rate limit in front of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from app.kube.logthrottle import RateLimit

LOG_INTERVAL = 30.0


class RateLimitedLog(logging.Filter):
    """Lets each distinct message template (WARNING and above) through once per ``interval``.

    uvicorn logs "Invalid HTTP request received." for every malformed request and asyncio one line per
    failed accept: under attack both would write as fast as a client can send.
    """

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        super().__init__()
        self._limit = RateLimit(interval)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        suppressed = self._limit.allow(f"{record.name}:{record.msg}")
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} more since the last such line)"
        return True


@contextlib.contextmanager
def bounded_loop_errors(loop: asyncio.AbstractEventLoop, interval: float = LOG_INTERVAL) -> Iterator[None]:
    """Route the loop's unhandled-error reports through a per-message rate limit."""
    limit = RateLimit(interval)
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        suppressed = limit.allow(str(context.get("message", "")))
        if suppressed is None:
            return
        if suppressed:
            context = {**context, "message": f"{context.get('message')} ({suppressed} more since)"}
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        yield
    finally:
        loop.set_exception_handler(previous)


@contextlib.contextmanager
def bounded_uvicorn_log() -> Iterator[None]:
    logger = logging.getLogger("uvicorn.error")
    limit = RateLimitedLog()
    logger.addFilter(limit)
    try:
        yield
    finally:
        logger.removeFilter(limit)
