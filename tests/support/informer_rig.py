"""A running informer on the fake client (tests/support/informer_fakes.py) and the wire lines it reads:
``Rig`` feeds watch lines and relists and waits until the informer is idle."""

from __future__ import annotations

from typing import Any

import orjson

from app.kube.informer import Informer, InformerOptions
from app.kube.informer_telemetry import InformerTelemetry
from app.kube.priority import LoopPriority
from tests.support.informer_fakes import THINGS, FakeClient, FakeStream, Projector, Recorder, Thing

__all__ = ["EXPIRED", "FAST", "Rig", "line", "page"]


def line(etype: str, o: Any) -> bytes:
    return orjson.dumps({"type": etype, "object": o})


def page(items: list[dict[str, Any]], rv: int, cont: str = "") -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "example.com/v1",
            "kind": "ThingList",
            "metadata": {"resourceVersion": str(rv), "continue": cont},
            "items": items,
        }
    )


EXPIRED = line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}) + b"\n"
# Backoff and the 410 quick relist still sleep on the event loop: keep those sleeps negligible.
FAST = InformerOptions(backoff_base=0.001, backoff_cap=0.001)


class Rig:
    """An informer on a fake client, running; ``watch`` and ``relist`` feed it and wait until it is idle."""

    def __init__(
        self,
        *,
        telemetry: InformerTelemetry | None = None,
        clock: Any = None,
        priority: LoopPriority | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.client = FakeClient()
        self.projector = Projector()
        self.recorder = recorder or Recorder()
        kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
        if priority is not None:
            kwargs["priority"] = priority
        self.informer: Informer[Thing] = Informer(
            self.client,
            THINGS,
            None,
            self.projector,
            self.recorder,
            options=FAST,
            telemetry=telemetry,
            **kwargs,
        )
        self.stream: FakeStream | None = None

    async def start(self, first_page: bytes = b"") -> None:
        """The initial LIST (empty unless given) and a watch stream with nothing on it yet."""
        self.client.add_list(first_page or page([], 1))
        self.stream = self.client.add_watch()
        await self.client.idle()

    async def lines(self, *lines: bytes, one_chunk: bool = False) -> None:
        assert self.stream is not None
        data = [ln + b"\n" for ln in lines]
        self.stream.push(*([b"".join(data)] if one_chunk else data))
        await self.client.idle()

    async def relist(self, body: bytes) -> None:
        """410 on the current watch: the informer relists (``body``), then watches a new stream."""
        assert self.stream is not None
        self.client.add_list(body)
        self.stream.push(EXPIRED)
        self.stream = self.client.add_watch()
        await self.client.idle()
