"""A graceful stop in two steps: hand over while ``/metrics`` is still served, then shut the server down.

uvicorn's first SIGTERM (or SIGINT) stops accepting connections at once and closes idle keep-alive ones,
before the application's lifespan shutdown runs: a leader stopping there could not be scraped any more.
But the counts it made after the last scrape that reached it exist for PromQL only once a scrape shows
them (docs/metrics.md, "How counting works"). So the first signal runs ``Service.hand_over()`` first, with
the server still serving: the leader stops counting, waits (bounded) until every scraper has seen its last
counts, and only then lets uvicorn shut down; the lifespan's ``Service.stop()`` then releases the Lease
with the served watermarks. A second signal during the wait shuts down at once.

``HandOverOnExit`` is a mixin for ``uvicorn.Server`` subclasses (app/serving/server.py's, and the test
fleets').
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["HandOverOnExit"]


class HandOverOnExit:
    """Mixin before ``uvicorn.Server`` in the bases: the first exit signal hands over, then exits."""

    _hand_over_task: asyncio.Task[None] | None = None
    # From uvicorn.Server (declared for the type checker; the mixin is only used with it).
    config: Any
    should_exit: bool

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._hand_over_task is not None or self.should_exit or self._service() is None:
            super().handle_exit(sig, frame)  # type: ignore[misc]
            return
        # A signal handler runs between two bytecodes of the event loop's thread: schedule, do not run.
        loop = asyncio.get_running_loop()
        loop.call_soon_threadsafe(self.begin_graceful_stop, sig, frame)

    def begin_graceful_stop(self, sig: int = 0, frame: FrameType | None = None) -> asyncio.Task[None]:
        """Hand over, then exit as for ``sig`` (0: no signal, as a test's stop). Idempotent."""
        if self._hand_over_task is None:
            self._hand_over_task = asyncio.get_running_loop().create_task(
                self._hand_over_then_exit(sig, frame), name="hand over before exit"
            )
        return self._hand_over_task

    async def _hand_over_then_exit(self, sig: int, frame: FrameType | None) -> None:
        service = self._service()
        try:
            if service is not None:
                await service.hand_over()
        except Exception:
            log.exception("hand-over before shutdown failed; shutting down anyway")
        finally:
            if sig:
                super().handle_exit(sig, frame)  # type: ignore[misc]
            else:
                self.should_exit = True

    def _service(self) -> Any:
        app = getattr(self.config, "app", None)
        state = getattr(app, "state", None)
        return getattr(state, "service", None)
