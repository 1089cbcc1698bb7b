"""Connection accounting for one listener: caps, displacement and deadlines.

uvicorn has no cap that sees a connection before its request head, and no deadline on a head that
never arrives (app/serving/server.py says why we add them rather than change servers). This module is the
bookkeeping behind both, kept apart from sockets and protocols so it can be reasoned about (and tested)
as plain data: every accepted socket is counted until it closes, per listener and per client address.

- A client at its own cap (``max_per_client``) may only displace its own oldest connection that is still
  *waiting* (for a TLS handshake or a request head).
- At the listener's cap (``max_connections``), a newcomer displaces the oldest waiting connection of the
  client holding the most connections, provided that client holds more than the newcomer's; else it is
  refused. So attackers, however many connections they open, end up sharing the cap and displacing each
  other, while a scraper or a person holding a connection or two always gets in; requests being served
  are never displaced.
- Deadlines, checked by a sweep a few times a second: a complete request head within ``header_timeout``
  of opening (TLS handshake included) or of the previous response; a response fully written within
  ``response_timeout`` (a client that stops reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.kube.logthrottle import RateLimit
from app.serving.clientaddr import client_key
from app.serving.logs import LOG_INTERVAL

# The name these lines had before the server was split into modules: log filters key on it.
log = logging.getLogger("app.serving.server")

# A response (once its request head has arrived) must be fully written within this long. Every answer is
# built from memory (an auth review is bounded at 6 s), so this only ever cuts clients that stop reading.
RESPONSE_TIMEOUT = 60.0
# Connections displaced at a cap before asyncio has made their transport (in their first turns of the
# loop) still hold their descriptor until asyncio closes them; displacing stops when this many are
# closing, or twice as many for a client holding far fewer connections than the heaviest (a scraper still
# gets in while a wave of attackers displaces itself).
MAX_CLOSING = 64
# Clients of one weight looked at when choosing whose connection to displace (bounds the work per accept).
_MAX_CLIENTS_SCANNED = 64


@dataclass(eq=False, slots=True)
class Slot:
    """One accepted connection, from accept() to close()."""

    sock: socket.socket
    client: str
    since: float  # start of the current state
    busy: bool = False  # a request head has arrived and its response is not complete yet
    closing: bool = False  # evicted or timed out; still holds its descriptor until asyncio closes it
    transport: asyncio.Transport | None = None  # set once the protocol has it (after the TLS handshake)


@dataclass(slots=True)
class GuardStats:
    """Counters for self-telemetry and tests."""

    accepted: int = 0
    refused: dict[str, int] = field(default_factory=lambda: {"capacity": 0, "per_client": 0})
    closed: dict[str, int] = field(
        default_factory=lambda: {"evicted": 0, "header_timeout": 0, "response_timeout": 0}
    )
    accept_errors: int = 0


class ConnectionGuard:
    """Caps, eviction and deadlines for the connections of one listener. Event-loop thread only."""

    def __init__(
        self,
        name: str,
        *,
        max_connections: int,
        max_per_client: int,
        header_timeout: float,
        response_timeout: float = RESPONSE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.max_connections = max_connections
        self.max_per_client = min(max_per_client, max_connections)
        self.header_timeout = header_timeout
        self.response_timeout = response_timeout
        self._clock = clock
        self._slots: dict[int, Slot] = {}  # by file descriptor, every accepted and not yet closed socket
        self._live = 0  # slots not closing
        self._live_per_client: dict[str, int] = {}
        # Clients by how many live connections they hold, each bucket in the order clients reached it.
        self._by_count: dict[int, OrderedDict[str, None]] = {}
        self._max_count = 0
        # Waiting (handshake or request head) and busy slots, oldest first: the first waiting one is the
        # first to time out and the one evicted at the cap.
        self._waiting: OrderedDict[Slot, None] = OrderedDict()
        self._waiting_per_client: dict[str, OrderedDict[Slot, None]] = {}
        self._busy: OrderedDict[Slot, None] = OrderedDict()
        self._closing = 0
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log_limit = RateLimit(LOG_INTERVAL)
        self.stats = GuardStats()

    # --- counts ---------------------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        """Accepted sockets not yet closed (closing ones included): what holds file descriptors."""
        return len(self._slots)

    def client_connections(self, client: str) -> int:
        return self._live_per_client.get(client, 0)

    # --- accept / close (from app/serving/listeners.py) -----------------------------------------

    def admit(self, sock: socket.socket, address: Any) -> bool:
        """Count a just-accepted socket, making room if it can; False: close it, it is refused."""
        now = self._clock()
        client = client_key(address)
        mine = self._live_per_client.get(client, 0)
        if mine >= self.max_per_client:
            if not self._displace(self._waiting_per_client.get(client), mine, "per_client"):
                return self._refuse("per_client", client)
        elif self._live >= self.max_connections and not self._displace(
            self._heaviest_waiting(client, mine), mine, "capacity"
        ):
            return self._refuse("capacity", client)
        slot = Slot(sock, client, now)
        self._slots[sock.fileno()] = slot
        self._live += 1
        self._set_count(client, self._live_per_client.get(client, 0) + 1)  # a displaced one may be its own
        self._set_waiting(slot, now)
        self.stats.accepted += 1
        return True

    def released(self, fd: int) -> None:
        """The socket with this descriptor is being closed."""
        slot = self._slots.pop(fd, None)
        if slot is None:
            return
        if slot.closing:
            self._closing -= 1
        else:
            self._unlink(slot)

    def _refuse(self, reason: str, client: str) -> bool:
        self.stats.refused[reason] += 1
        self._throttled_warning(
            f"refused-{reason}",
            "%s listener: refusing connections (%s): %s",
            self.name,
            "every connection busy" if reason == "capacity" else f"client {client} at its cap",
            f"{self.max_connections} max" if reason == "capacity" else f"{self.max_per_client} per client",
        )
        return False

    def _heaviest_waiting(self, client: str, mine: int) -> OrderedDict[Slot, None] | None:
        """Waiting connections of the heaviest client holding more than ``mine`` (the newcomer's count),
        else the newcomer's own: one can displace only those heavier than oneself, or oneself."""
        for count in range(self._max_count, mine, -1):
            for heavy in itertools.islice(self._by_count.get(count, ()), _MAX_CLIENTS_SCANNED):
                waiting = self._waiting_per_client.get(heavy)
                if waiting:
                    return waiting
        return self._waiting_per_client.get(client)

    def _displace(self, waiting: OrderedDict[Slot, None] | None, mine: int, why: str) -> bool:
        """Close the oldest connection of ``waiting`` to make room; False if there is none, or too many
        displaced connections are still closing."""
        limit = 2 * MAX_CLOSING if mine * 4 < self._max_count else MAX_CLOSING
        if not waiting or self._closing >= limit:
            return False
        self._close(next(iter(waiting)), "evicted")
        self._throttled_warning(
            f"evicted-{why}",
            "%s listener at its %s cap: closing connections that wait for a request head, from the "
            "clients holding the most",
            self.name,
            "connection" if why == "capacity" else "per-client",
        )
        return True

    def _set_count(self, client: str, count: int) -> None:
        old = self._live_per_client.get(client, 0)
        bucket = self._by_count.get(old)
        if bucket is not None:
            bucket.pop(client, None)
            if not bucket:
                del self._by_count[old]
        if count > 0:
            self._live_per_client[client] = count
            self._by_count.setdefault(count, OrderedDict())[client] = None
        else:
            self._live_per_client.pop(client, None)
        self._max_count = max(self._max_count, count)
        while self._max_count > 0 and self._max_count not in self._by_count:
            self._max_count -= 1

    # --- states (from app/serving/protocol.py) ----------------------------------------------

    def slot_of(self, transport: asyncio.Transport) -> Slot | None:
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        slot = self._slots.get(sock.fileno())
        if slot is not None:
            slot.transport = transport
        return slot

    def set_busy(self, slot: Slot) -> None:
        if slot.closing:
            return
        if slot.busy:
            self._busy.move_to_end(slot)  # a pipelined request: its own deadline
        else:
            self._unlink_waiting(slot)
        slot.busy, slot.since = True, self._clock()
        self._busy[slot] = None

    def set_waiting(self, slot: Slot) -> None:
        if slot.closing or not slot.busy:
            return
        self._busy.pop(slot, None)
        self._set_waiting(slot, self._clock())

    def _set_waiting(self, slot: Slot, now: float) -> None:
        slot.busy, slot.since = False, now
        self._waiting[slot] = None
        self._waiting_per_client.setdefault(slot.client, OrderedDict())[slot] = None

    def _unlink_waiting(self, slot: Slot) -> None:
        self._waiting.pop(slot, None)
        mine = self._waiting_per_client.get(slot.client)
        if mine is not None:
            mine.pop(slot, None)
            if not mine:
                del self._waiting_per_client[slot.client]

    def _unlink(self, slot: Slot) -> None:
        """Stop counting ``slot`` as live (it closes or is being closed)."""
        self._unlink_waiting(slot)
        self._busy.pop(slot, None)
        self._live -= 1
        self._set_count(slot.client, self._live_per_client.get(slot.client, 1) - 1)

    def _close(self, slot: Slot, reason: str) -> None:
        self._unlink(slot)
        slot.closing = True
        self._closing += 1
        self.stats.closed[reason] += 1
        if slot.transport is not None:
            # abort() takes the socket out of the selector at once and schedules connection_lost; the
            # descriptor would only be closed after that, on the next turn of the loop. Close it now, so
            # that a burst of arrivals displacing one another never holds more descriptors than the cap
            # (asyncio's own close of it later is a no-op).
            slot.transport.abort()
            slot.sock.close()  # -> released()
            return
        # Still in the TLS handshake (or not yet handed to a protocol): end it at the socket level;
        # asyncio sees the end of the stream, fails the handshake and closes the socket.
        with contextlib.suppress(OSError):
            slot.sock.shutdown(socket.SHUT_RDWR)

    # --- deadlines ---------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._schedule_sweep()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._loop = None

    def _schedule_sweep(self) -> None:
        if self._loop is None:
            return
        # A tenth of the shortest deadline: a connection is cut at most 10 % late.
        interval = min(0.5, max(0.05, min(self.header_timeout, self.response_timeout) / 10))
        self._sweeper = self._loop.call_later(interval, self.sweep)

    def sweep(self) -> None:
        """Close every connection past its deadline (both queues are in deadline order)."""
        try:
            now = self._clock()
            for queue, timeout, reason in (
                (self._waiting, self.header_timeout, "header_timeout"),
                (self._busy, self.response_timeout, "response_timeout"),
            ):
                while queue:
                    slot = next(iter(queue))
                    if now - slot.since < timeout:
                        break
                    self._close(slot, reason)
        finally:
            self._schedule_sweep()

    # --- accept errors -----------------------------------------------------------------------------

    def accept_failed(self, exc: OSError) -> None:
        self.stats.accept_errors += 1
        self._throttled_warning(
            "accept-error",
            "%s listener: accept() failed: %s; pending connections are closed until descriptors free up",
            self.name,
            exc.strerror or exc,
        )

    def _throttled_warning(self, topic: str, message: str, *args: object) -> None:
        suppressed = self._log_limit.allow(topic)
        if suppressed is None:
            return
        if suppressed:
            message += f" ({suppressed} more since the last such line)"
        log.warning(message, *args)
