"""Leadership intervals of several elector candidates, recorded from their callbacks (tests/kube)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from app.kube.lease import LeaseRecord


def now() -> float:
    """The running loop's time: virtual in tests/kube/test_elector.py, time.monotonic() elsewhere."""
    return asyncio.get_running_loop().time()


@dataclass
class Timeline:
    """Leadership intervals of all candidates, in loop time, from the callbacks."""

    intervals: list[list[Any]] = field(default_factory=list)  # [identity, start, stop | None, previous]

    def started(self, identity: str, previous: LeaseRecord | None) -> None:
        assert self.current(identity) is None, f"{identity} started twice"
        self.intervals.append([identity, now(), None, previous])

    def stopped(self, identity: str) -> None:
        interval = self.current(identity)
        assert interval is not None, f"{identity} stopped without leading"
        interval[2] = now()

    def current(self, identity: str) -> list[Any] | None:
        return next((i for i in self.intervals if i[0] == identity and i[2] is None), None)

    def leaders(self) -> list[str]:
        return [i[0] for i in self.intervals if i[2] is None]

    def assert_no_overlap(self) -> None:
        spans = sorted(self.intervals, key=lambda i: i[1])
        for a, b in itertools.pairwise(spans):
            assert a[2] is not None and a[2] <= b[1], f"two leaders at once: {a[:3]} and {b[:3]}"
