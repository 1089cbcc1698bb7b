"""uvicorn's h11 protocol, telling the guard what state each connection is in, and refusing what h11 lets by.

The guard applies the header deadline to a connection waiting for a request head and the response
deadline to one being answered, and never displaces one being answered; only the protocol knows when a
request head has been parsed and when its response has been delivered, so it reports those two edges.

h11 bounds a request head only while it is incomplete (``max_incomplete_event_size``): a head that arrives
whole in one read is parsed whatever its size, so the limit held for a head sent in pieces and not for the
same head sent at once. And h11 accepts a request with both ``Content-Length`` and ``Transfer-Encoding``
(framing it by the latter), which RFC 9112 §6.1 says a server must treat as an error and close the
connection after: the two framings are how requests are smuggled past a proxy. ``StrictConnection`` checks
every parsed head for both; a refused head is answered 400 and its connection closed, as h11's own errors.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.kube.priority import request_arrived
from app.serving.guard import ConnectionGuard, Slot

# Request heads up to this size: a 16 KiB bearer token (app/api/auth/middleware.py's MAX_TOKEN_BYTES)
# plus headers.
MAX_HEAD_BYTES = 32 * 1024
# Per header line beyond its name and value: ": " and CRLF; per request line beyond method, target and
# version: two spaces, "HTTP/" and CRLF; the head ends with one more CRLF.
_HEADER_OVERHEAD = 4
_REQUEST_LINE_OVERHEAD = 9


def head_size(request: h11.Request) -> int:
    """The bytes of a parsed request head (as sent, less optional whitespace h11 has trimmed)."""
    line = len(request.method) + len(request.target) + len(request.http_version) + _REQUEST_LINE_OVERHEAD
    headers = sum(len(name) + len(value) + _HEADER_OVERHEAD for name, value in request.headers.raw_items())
    return line + headers + 2


def head_problem(request: h11.Request, max_head_bytes: int) -> str | None:
    """Why a parsed request head is refused, or None."""
    if head_size(request) > max_head_bytes:
        return f"request head larger than {max_head_bytes} bytes"
    names = {name for name, _ in request.headers}  # h11 lower-cases them
    if b"transfer-encoding" in names and b"content-length" in names:
        return "both Content-Length and Transfer-Encoding (RFC 9112 section 6.1)"
    return None


class StrictConnection(h11.Connection):
    """h11's server connection, refusing a request head over ``max_incomplete_event_size`` however it
    arrived, and one framed by both Content-Length and Transfer-Encoding."""

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            problem = head_problem(event, self._max_incomplete_event_size)
            if problem is not None:
                # What h11 raises for its own malformed heads: uvicorn answers 400 and closes.
                raise h11.RemoteProtocolError(problem, error_status_hint=400)
        return event


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, telling the guard when a request head has arrived and when its response
    is complete (so that the right deadline applies, and busy connections are never evicted)."""

    guard: ClassVar[ConnectionGuard]
    _slot: Slot | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = StrictConnection(h11.SERVER, self.conn._max_incomplete_event_size)

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
