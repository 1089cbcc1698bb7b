"""Waiting for conditions instead of sleeping: THE condition-wait helpers of the test suite.

``eventually`` (async) and ``wait_for`` (blocking, for threads and subprocesses) poll a predicate until it
returns something truthy and return that value; after the deadline they fail with a message naming what
was awaited and the predicate's last value. The predicate is checked once more after the deadline has
passed, so a poller that woke up late (a starved event loop, a loaded machine) does not turn a condition
that did become true into a failure.

``LoopLag`` measures how late the event loop runs its timers: the scheduling slack of every deadline in
this process (an elector's renew deadline included), to add to a timing bound measured under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def describe(check: Callable[..., Any], what: str | None) -> str:
    """``what``, or else the predicate's source (a lambda's text) or name."""
    if what:
        return what
    with contextlib.suppress(OSError, TypeError):
        source = inspect.getsource(check).strip()
        if "lambda" in source:
            source = source[source.index("lambda") :]
        return source.rstrip(",)") if len(source) < 200 else source[:200] + "..."
    return getattr(check, "__qualname__", repr(check))


async def eventually(
    check: Callable[[], Any],
    timeout: float = 10.0,
    *,
    what: str | None = None,
    interval: float = 0.05,
) -> Any:
    """Poll ``check`` (sync, or returning an awaitable) until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {describe(check, what)} (last: {last!r})"
            )
        await asyncio.sleep(interval)


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Blocking ``eventually``: exceptions of the ``ignoring`` types count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = check()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)  # the poll interval of this wait, not a wait for something to happen


class LoopLag:
    """``async with LoopLag() as lag``: ``lag.max`` is the longest a timer was late in that window.

    A deadline timer (``asyncio.timeout``, ``asyncio.sleep``) of the code under test fires at most this
    much after its due time, so a bound on "when did it react" measured under load gets this added."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.max = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period
            await asyncio.sleep(self.period)  # the probe's tick: how late it wakes is the measurement
            self.max = max(self.max, loop.time() - due)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._run(), name="loop lag probe")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
