"""A graceful stop in two steps: hand over while ``/metrics`` is still served, then shut the server down.

uvicorn's first SIGTERM (or SIGINT) stops accepting connections at once and closes idle keep-alive ones,
before the application's lifespan shutdown runs: a leader stopping there could not be scraped any more.
But the counts it made after the last scrape that reached it exist for PromQL only once a scrape shows
them (docs/metrics.md, "How counting works"). So the first signal runs ``Service.hand_over()`` first, with
the server still serving: the leader stops counting, waits (bounded) until every scraper has seen its last
counts, and only then lets uvicorn shut down; the lifespan's ``Service.stop()`` then releases the Lease
with the served watermarks. A second signal during the wait shuts down at once.

At the signal, before any wait, one line says what the stop waits for and for how long at most
(``stop_plan``), so that a stop that takes a while is never a silent one.

``HandOverOnExit`` is a mixin for ``uvicorn.Server`` subclasses (app/serving/server.py's, and the test
fleets').
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any

from app.handover.scrape_wait import NO_SCRAPE_GRACE

log = logging.getLogger(__name__)

__all__ = ["HandOverOnExit", "stop_plan"]


def stop_plan(service: Any, drain_seconds: float | None) -> str:
    """What a graceful stop of ``service`` (None: not started) waits for, and the bound of each wait."""
    drain = (
        f"then up to {drain_seconds:g} s for requests in flight"
        if drain_seconds is not None
        else "then for requests in flight"
    )
    if service is None:
        return f"stopping: the service has not started, nothing to hand over; {drain}"
    if not hasattr(service, "journal"):
        # The mixin needs only hand_over() of its service; a stand-in without the rest says less.
        return f"stopping: handing over first; {drain}; a second signal stops at once"
    leading = bool(service.journal.leading) and service.elector is not None
    if not leading:
        return f"stopping: not the leader, nothing to hand over; {drain}; a second signal stops at once"
    wait = float(service.handover_wait_seconds)
    if wait <= 0:
        return (
            "stopping: releasing the Lease without waiting for scrapes (handover_wait_seconds is 0); "
            f"{drain}; a second signal stops at once"
        )
    quiet = float(service.ledger.hold) + NO_SCRAPE_GRACE
    return (
        f"stopping: waiting up to {wait:g} s for every scraper to see this leader's last counts (less if "
        f"no scrape comes for {quiet:g} s), then releasing the Lease; {drain}; a second signal stops at once"
    )


class HandOverOnExit:
    """Mixin before ``uvicorn.Server`` in the bases: the first exit signal hands over, then exits."""

    _hand_over_task: asyncio.Task[None] | None = None
    exit_signal: int = 0  # the first exit signal received (0: none)
    # From uvicorn.Server (declared for the type checker; the mixin is only used with it).
    config: Any
    should_exit: bool

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.exit_signal = self.exit_signal or sig
        if self._hand_over_task is not None or self.should_exit:
            log.info("stopping at once (second signal): no more waiting for scrapes")
            asyncio.get_running_loop().call_soon_threadsafe(self._abandon_hand_over)
            super().handle_exit(sig, frame)  # type: ignore[misc]
            return
        if self._service() is None:
            log.info(stop_plan(None, self._drain_seconds()))
            super().handle_exit(sig, frame)  # type: ignore[misc]
            return
        # A signal handler runs between two bytecodes of the event loop's thread: schedule, do not run.
        loop = asyncio.get_running_loop()
        loop.call_soon_threadsafe(self.begin_graceful_stop, sig, frame)

    def begin_graceful_stop(self, sig: int = 0, frame: FrameType | None = None) -> asyncio.Task[None]:
        """Hand over, then exit as for ``sig`` (0: no signal, as a test's stop). Idempotent."""
        if self._hand_over_task is None:
            log.info(stop_plan(self._service(), self._drain_seconds()))
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

    def _abandon_hand_over(self) -> None:
        # Both the wait under way and the one the lifespan's Service.stop() would start again.
        abandon = getattr(self._service(), "abandon_hand_over", None)
        if abandon is not None:
            abandon()
        if self._hand_over_task is not None:
            self._hand_over_task.cancel()

    def _drain_seconds(self) -> float | None:
        timeout = getattr(self.config, "timeout_graceful_shutdown", None)
        return float(timeout) if timeout is not None else None

    def _service(self) -> Any:
        app = getattr(self.config, "app", None)
        state = getattr(app, "state", None)
        return getattr(state, "service", None)
