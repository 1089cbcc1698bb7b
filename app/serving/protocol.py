"""uvicorn's h11 protocol, telling the guard what state each connection is in.

The guard applies the header deadline to a connection waiting for a request head and the response
deadline to one being answered, and never displaces one being answered; only the protocol knows when a
request head has been parsed and when its response has been delivered, so it reports those two edges.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, cast

from uvicorn.protocols.http.h11_impl import H11Protocol

from app.kube.priority import request_arrived
from app.serving.guard import ConnectionGuard, Slot

# Request heads up to this size: a 16 KiB bearer token (app/api/auth/middleware.py's MAX_TOKEN_BYTES)
# plus headers.
MAX_HEAD_BYTES = 32 * 1024


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, telling the guard when a request head has arrived and when its response
    is complete (so that the right deadline applies, and busy connections are never evicted)."""

    guard: ClassVar[ConnectionGuard]
    _slot: Slot | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._slot = self.guard.slot_of(transport)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:
            # A new request head was parsed and its task queued: ingestion lets it run first.
            request_arrived()
            if self._slot is not None:
                self.guard.set_busy(self._slot)

    def on_response_complete(self) -> None:
        # Before super(): it may start a pipelined request. A response still in the transport's buffer
        # (uvicorn calls this once the last byte is handed to the transport) is still being delivered: it
        # stays under the response deadline until the buffer drains (resume_writing), so a client that
        # does not read is cut by that deadline, and one reading a large body slowly is not cut early.
        if self._slot is not None and self.transport.get_write_buffer_size() == 0:
            self.guard.set_waiting(self._slot)
        super().on_response_complete()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._slot is not None and self.cycle is not None and self.cycle.response_complete:
            self.guard.set_waiting(self._slot)


def protocol_for(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    """uvicorn instantiates the protocol class itself; give each listener a subclass bound to its guard."""
    bound = type(f"GuardedH11Protocol_{guard.name}", (GuardedH11Protocol,), {"guard": guard})
    return cast(type[GuardedH11Protocol], bound)
