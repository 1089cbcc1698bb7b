"""The HTTP server: uvicorn, with the connection limits uvicorn does not have.

Why uvicorn plus a guard, and not another server. uvicorn 0.54 bounds the size of a request head
(``h11_max_incomplete_event_size``) and idle keep-alive connections (``timeout_keep_alive``), but not the
time a client takes to send its head: its keep-alive timer starts only after a response and is cancelled by
the first byte of the next request, so a client that connects and sends nothing, or one byte every few
seconds, holds its connection and file descriptor for ever. ``limit_concurrency`` does not help either: it
answers 503 once a request head has arrived, so it never sees those connections at all. Other ASGI servers
(hypercorn, granian) have read timeouts, but switching would mean a new dependency in the image and redoing
what uvicorn gives us in one process (the live ``ssl.SSLContext`` that app/tls.py reloads in place, the
embedded simulated cluster), and none of them makes room for probes and scrapers at a connection cap, which
is the part that matters under a flood. What is missing is small, so it is added here, below uvicorn, where
every connection is seen from its first instant:

- ``GuardedListener``: the listening socket. Its ``accept()`` (called by asyncio's accept loop) counts each
  accepted socket until the socket is closed, per listener and per client address, before any transport,
  TLS handshake or protocol exists. A client at its own cap (``max_connections_per_client``) may only
  displace its own oldest connection that is still *waiting* (for a TLS handshake or a request head).
  At the listener's cap (``max_connections``), a newcomer displaces the oldest waiting connection of the
  client holding the most connections, provided that client holds more than the newcomer's; else it is
  refused (closed at once with a reset). So attackers, however many connections they open, end up sharing
  the cap and displacing each other, while a scraper or a person holding a connection or two always gets
  in; requests being served are never displaced.
- Deadlines, checked by a sweep a few times a second: a connection must deliver a complete request head
  within ``http_header_timeout_seconds`` of opening (TLS handshake included) or of its previous response;
  a response must be fully written within ``RESPONSE_TIMEOUT`` (a client that stops reading).
- A second listener for probes (``probe_port``): /livez, /healthz and /readyz only, plain HTTP, with its own
  small cap, so that a full main listener never fails the kubelet's probes.
- The file limit is raised to its hard limit at start-up, and the caps are kept below it with room for
  the process's other files, so accept() does not fail for lack of descriptors. If it does anyway (other
  files, a system-wide limit), the pending connection is accepted on a spare descriptor and closed
  instead of letting Python 3.11's accept loop log one error per backlog slot per second (the ~2 million
  lines seen in 35 s), and asyncio's and uvicorn's own warnings go through a per-message rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import math
import os
import resource
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import uvicorn
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from app.clientaddr import client_key
from app.config import ENV_PREFIX, Settings
from app.graceful import HandOverOnExit
from app.kube.logthrottle import RateLimit
from app.tls import CertificateReloader, uvicorn_tls_kwargs

log = logging.getLogger(__name__)

# A response (once its request head has arrived) must be fully written within this long. Every answer is
# built from memory (an auth review is bounded at 6 s), so this only ever cuts clients that stop reading.
RESPONSE_TIMEOUT = 60.0
# Request heads up to this size: a 16 KiB bearer token (app/api/auth.py's MAX_TOKEN_BYTES) plus headers.
MAX_HEAD_BYTES = 32 * 1024
# Connections displaced at a cap before asyncio has made their transport (in their first turns of the
# loop) still hold their descriptor until asyncio closes them; displacing stops when this many are
# closing, or twice as many for a client holding far fewer connections than the heaviest (a scraper still
# gets in while a wave of attackers displaces itself).
_MAX_CLOSING = 64
# File descriptors kept free for everything but client connections: API-server connections of the
# informers and the elector, log and certificate files, the embedded simulated cluster in --simulate
# (PROCESS_FDS), plus the displaced connections still closing.
PROCESS_FDS = 96
FD_RESERVE = PROCESS_FDS + 2 * _MAX_CLOSING
# The probe listener: the kubelet opens about two connections per probe period, without keep-alive.
PROBE_MAX_CONNECTIONS = 32
PROBE_MAX_PER_CLIENT = 16
PROBE_PATHS = frozenset({"/livez", "/healthz", "/readyz"})
# Clients of one weight looked at when choosing whose connection to displace (bounds the work per accept).
_MAX_CLIENTS_SCANNED = 64
# Accept-loop refusals per accept() call, and admissions per turn of the event loop, before yielding to
# it (the rest on its next turn). asyncio would otherwise accept up to the backlog (2,048) in one go: a
# wave of attackers displacing one another before any of them has a transport that could be closed.
_MAX_REFUSALS_PER_ACCEPT = 256
_MAX_ADMISSIONS_PER_TURN = 64
_LOG_INTERVAL = 30.0


class ServerStartError(Exception):
    """A listener cannot be set up; the message names the setting, in one line."""


# ---------------------------------------------------------------------------------------------- file limit


def raise_file_limit(target: int = 1 << 20) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most ``target``); return the soft limit in force.

    Containers commonly start with a soft limit of 1,024 and a far higher hard limit; an unprivileged
    process may raise its soft limit up to the hard one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, wanted, exc)
    return target if soft == resource.RLIM_INFINITY else soft


# ---------------------------------------------------------------------------------------------- guard


@dataclass(eq=False, slots=True)
class _Slot:
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
        self._slots: dict[int, _Slot] = {}  # by file descriptor, every accepted and not yet closed socket
        self._live = 0  # slots not closing
        self._live_per_client: dict[str, int] = {}
        # Clients by how many live connections they hold, each bucket in the order clients reached it.
        self._by_count: dict[int, OrderedDict[str, None]] = {}
        self._max_count = 0
        # Waiting (handshake or request head) and busy slots, oldest first: the first waiting one is the
        # first to time out and the one evicted at the cap.
        self._waiting: OrderedDict[_Slot, None] = OrderedDict()
        self._waiting_per_client: dict[str, OrderedDict[_Slot, None]] = {}
        self._busy: OrderedDict[_Slot, None] = OrderedDict()
        self._closing = 0
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log_limit = RateLimit(_LOG_INTERVAL)
        self.stats = GuardStats()

    # --- counts ---------------------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        """Accepted sockets not yet closed (closing ones included): what holds file descriptors."""
        return len(self._slots)

    def client_connections(self, client: str) -> int:
        return self._live_per_client.get(client, 0)

    # --- accept / close (from the socket classes below) --------------------------------------------

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
        slot = _Slot(sock, client, now)
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

    def _heaviest_waiting(self, client: str, mine: int) -> OrderedDict[_Slot, None] | None:
        """Waiting connections of the heaviest client holding more than ``mine`` (the newcomer's count),
        else the newcomer's own: one can displace only those heavier than oneself, or oneself."""
        for count in range(self._max_count, mine, -1):
            for heavy in itertools.islice(self._by_count.get(count, ()), _MAX_CLIENTS_SCANNED):
                waiting = self._waiting_per_client.get(heavy)
                if waiting:
                    return waiting
        return self._waiting_per_client.get(client)

    def _displace(self, waiting: OrderedDict[_Slot, None] | None, mine: int, why: str) -> bool:
        """Close the oldest connection of ``waiting`` to make room; False if there is none, or too many
        displaced connections are still closing."""
        limit = 2 * _MAX_CLOSING if mine * 4 < self._max_count else _MAX_CLOSING
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

    # --- states (from the protocol) ------------------------------------------------------------------

    def slot_of(self, transport: asyncio.Transport) -> _Slot | None:
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        slot = self._slots.get(sock.fileno())
        if slot is not None:
            slot.transport = transport
        return slot

    def set_busy(self, slot: _Slot) -> None:
        if slot.closing:
            return
        if slot.busy:
            self._busy.move_to_end(slot)  # a pipelined request: its own deadline
        else:
            self._unlink_waiting(slot)
        slot.busy, slot.since = True, self._clock()
        self._busy[slot] = None

    def set_waiting(self, slot: _Slot) -> None:
        if slot.closing or not slot.busy:
            return
        self._busy.pop(slot, None)
        self._set_waiting(slot, self._clock())

    def _set_waiting(self, slot: _Slot, now: float) -> None:
        slot.busy, slot.since = False, now
        self._waiting[slot] = None
        self._waiting_per_client.setdefault(slot.client, OrderedDict())[slot] = None

    def _unlink_waiting(self, slot: _Slot) -> None:
        self._waiting.pop(slot, None)
        mine = self._waiting_per_client.get(slot.client)
        if mine is not None:
            mine.pop(slot, None)
            if not mine:
                del self._waiting_per_client[slot.client]

    def _unlink(self, slot: _Slot) -> None:
        """Stop counting ``slot`` as live (it closes or is being closed)."""
        self._unlink_waiting(slot)
        self._busy.pop(slot, None)
        self._live -= 1
        self._set_count(slot.client, self._live_per_client.get(slot.client, 1) - 1)

    def _close(self, slot: _Slot, reason: str) -> None:
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


# ---------------------------------------------------------------------------------------------- sockets


class _AcceptedSocket(socket.socket):
    """An accepted connection that tells its guard when it closes (asyncio closes it exactly once)."""

    _guard: ConnectionGuard | None = None

    def close(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            with contextlib.suppress(OSError):
                guard.released(self.fileno())
        super().close()


_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, no TIME_WAIT here


class GuardedListener(socket.socket):
    """A listening socket whose ``accept()`` admits connections through a ``ConnectionGuard``.

    asyncio's accept loop calls ``sock.accept()`` on the very socket handed to ``create_server``; this is
    the one place that sees every connection before it costs more than a descriptor.
    """

    guard: ConnectionGuard

    def setup(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self._spare: int | None = _open_spare()
        self._backoff_until = 0.0
        self._admitted_this_turn = 0

    def _next_turn(self) -> None:
        self._admitted_this_turn = 0

    def accept(self) -> tuple[socket.socket, Any]:
        if self._admitted_this_turn >= _MAX_ADMISSIONS_PER_TURN:
            raise BlockingIOError(errno.EAGAIN, "yielding to the event loop")
        refusals = 0
        while True:
            fd, address = self._accept_fd()
            conn = _AcceptedSocket(self.family, self.type, self.proto, fileno=fd)
            if self.guard.admit(conn, address):
                conn._guard = self.guard
                if self._admitted_this_turn == 0:
                    # Runs on the loop's next turn: the count is per turn (accept() runs on the loop).
                    asyncio.get_running_loop().call_soon(self._next_turn)
                self._admitted_this_turn += 1
                return conn, address
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            conn.close()
            refusals += 1
            if refusals >= _MAX_REFUSALS_PER_ACCEPT:
                # Let the loop run other work; the listening socket stays readable, so asyncio calls
                # again on its next turn.
                raise BlockingIOError(errno.EAGAIN, "yielding to the event loop")

    def _raw_accept(self) -> tuple[int, Any]:
        # socket.socket._accept (the C accept returning a bare descriptor) is not in typeshed.
        accept: Callable[[], tuple[int, Any]] = getattr(self, "_accept")  # noqa: B009
        return accept()

    def _accept_fd(self) -> tuple[int, Any]:
        if time.monotonic() < self._backoff_until:
            # Out of descriptors a moment ago: asyncio is pausing this listener (one second) after the
            # error below; end its accept loop now rather than fail once per backlog slot.
            raise BlockingIOError(errno.EAGAIN, "out of file descriptors")
        try:
            return self._raw_accept()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            self.guard.accept_failed(exc)
            if self._drain_with_spare():
                raise BlockingIOError(errno.EAGAIN, "refused for lack of descriptors") from None
            self._backoff_until = time.monotonic() + 1.0
            raise

    def _drain_with_spare(self) -> bool:
        """Close pending connections using the spare descriptor (the libev/nginx trick); True if it ran.

        Refused clients get a prompt close instead of hanging in the backlog, and the listener is not
        left readable with nothing able to accept (which would spin the event loop).
        """
        if self._spare is None:
            return False
        os.close(self._spare)
        self._spare = None
        try:
            for _ in range(_MAX_REFUSALS_PER_ACCEPT):
                fd, _address = self._raw_accept()
                os.close(fd)
        except OSError:
            pass  # empty backlog (EAGAIN), or still no descriptor
        finally:
            self._spare = _open_spare()
        return True

    def close(self) -> None:
        spare, self._spare = getattr(self, "_spare", None), None
        if spare is not None:
            os.close(spare)
        super().close()


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def bind_listener(host: str, port: int, guard: ConnectionGuard, setting: str) -> GuardedListener:
    """A bound ``GuardedListener`` for host:port (not yet listening; asyncio does that with its backlog).

    Bind failures raise ServerStartError naming ``setting``.
    """
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServerStartError(
            f"invalid setting host ({ENV_PREFIX}HOST): cannot resolve {host!r}: {exc.strerror}"
        ) from None
    family, kind, proto, _canon, address = infos[0]
    sock = GuardedListener(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServerStartError(
            f"cannot listen on {where} ({ENV_PREFIX}{setting.upper()}): {exc.strerror or exc}"
        ) from None
    sock.setup(guard)
    return sock


# ---------------------------------------------------------------------------------------------- protocol


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, telling the guard when a request head has arrived and when its response
    is complete (so that the right deadline applies, and busy connections are never evicted)."""

    guard: ClassVar[ConnectionGuard]
    _slot: _Slot | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._slot = self.guard.slot_of(transport)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self._slot is not None:
            self.guard.set_busy(self._slot)  # a new request head was parsed

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


class ProbeOnly:
    """ASGI app for the probe listener: the probe paths of ``app``; 404 for anything else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # lifespan is off on this listener; websockets are not served
        body = b"not found: this listener serves /livez, /healthz and /readyz only\n"
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------------------------------- logs


class RateLimitedLog(logging.Filter):
    """Lets each distinct message template (WARNING and above) through once per ``interval``.

    uvicorn logs "Invalid HTTP request received." for every malformed request and asyncio one line per
    failed accept: under attack both would write as fast as a client can send.
    """

    def __init__(self, interval: float = _LOG_INTERVAL) -> None:
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
def bounded_loop_errors(loop: asyncio.AbstractEventLoop, interval: float = _LOG_INTERVAL) -> Iterator[None]:
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


# ---------------------------------------------------------------------------------------------- telemetry


class ConnectionTelemetry(Collector):
    """``trainer_metrics_http_*``: connections, caps, refusals and closes per listener."""

    def __init__(self, guards: list[ConnectionGuard]) -> None:
        self._guards = guards

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            "trainer_metrics_http_connections", "Open client connections, by listener.", labels=["listener"]
        )
        cap = GaugeMetricFamily(
            "trainer_metrics_http_connections_max",
            "Connections a listener holds at most (after the file limit).",
            labels=["listener"],
        )
        refused = CounterMetricFamily(
            "trainer_metrics_http_connections_refused",
            "Connections closed on arrival: the listener (capacity) or the client (per_client) at its cap "
            "with no waiting connection to displace.",
            labels=["listener", "reason"],
        )
        closed = CounterMetricFamily(
            "trainer_metrics_http_connections_closed",
            "Connections closed by the server: evicted (displaced at a cap while waiting for a request), "
            "header_timeout, response_timeout.",
            labels=["listener", "reason"],
        )
        errors = CounterMetricFamily(
            "trainer_metrics_http_accept_errors",
            "accept() failures (out of file descriptors or memory).",
            labels=["listener"],
        )
        for g in self._guards:
            open_.add_metric([g.name], g.open_connections)
            cap.add_metric([g.name], g.max_connections)
            for reason, n in g.stats.refused.items():
                refused.add_metric([g.name, reason], n)
            for reason, n in g.stats.closed.items():
                closed.add_metric([g.name, reason], n)
            errors.add_metric([g.name], g.stats.accept_errors)
        yield from (open_, cap, refused, closed, errors)


# ---------------------------------------------------------------------------------------------- server


@dataclass(frozen=True, slots=True)
class Limits:
    """The effective connection caps, after the file limit."""

    file_limit: int
    max_connections: int
    max_per_client: int
    probe_max_connections: int

    @classmethod
    def compute(cls, settings: Settings, file_limit: int) -> Limits:
        probe = PROBE_MAX_CONNECTIONS if settings.probe_port is not None else 0
        room = file_limit - FD_RESERVE - probe
        if room < 16:
            raise ServerStartError(
                f"the open-file limit ({file_limit}) leaves no room for client connections: at least "
                f"{FD_RESERVE + probe + 16} is needed (raise `ulimit -n`)"
            )
        main = min(settings.max_connections, room)
        return cls(file_limit, main, min(settings.max_connections_per_client, main), probe)


class _Server(HandOverOnExit, uvicorn.Server):
    """uvicorn's server, closing the probe listener only after its own shutdown (lifespan included), so
    that probes are answered until the very end. The first SIGTERM hands over while /metrics is still
    served (app/graceful.py), then shuts down."""

    probe: ProbeListener | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            if self.probe is not None:
                await self.probe.close()


class ProbeListener:
    """The probe paths on their own socket, served by uvicorn's protocol without uvicorn's Server (which
    would run the lifespan a second time and fight the main server for the signal handlers)."""

    def __init__(self, app: ASGIApp, sock: GuardedListener, settings: Settings) -> None:
        self.sock = sock
        self.config = uvicorn.Config(
            ProbeOnly(app),
            http=protocol_for(sock.guard),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,
            timeout_keep_alive=settings.http_keep_alive_timeout_seconds,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        self.config.load()
        self.state = ServerState()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        protocol = self.config.http_protocol_class

        def factory() -> asyncio.Protocol:
            return protocol(config=self.config, server_state=self.state, app_state={})  # type: ignore[call-arg]

        self._server = await loop.create_server(factory, sock=self.sock, backlog=128)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        self._server = None
        for connection in list(self.state.connections):
            connection.shutdown()
        # Probes are answered in microseconds; do not wait long for a client that does not read.
        deadline = time.monotonic() + 1.0
        while self.state.connections and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


class HttpServer:
    """The main listener (every route) and the probe listener, with their guards.

    Construct it before the event loop starts: binding happens here, so a port in use or a bad host
    fails at once with ServerStartError. Then ``asyncio.run(server.serve())``.
    """

    def __init__(self, app: ASGIApp, settings: Settings, tls: CertificateReloader | None = None) -> None:
        self.limits = Limits.compute(settings, raise_file_limit())
        self.main_guard = ConnectionGuard(
            "main",
            max_connections=self.limits.max_connections,
            max_per_client=self.limits.max_per_client,
            header_timeout=settings.http_header_timeout_seconds,
        )
        self.guards = [self.main_guard]
        self.main_socket = bind_listener(settings.host, settings.port, self.main_guard, "port")
        self.probe_listener: ProbeListener | None = None
        if settings.probe_port is not None:
            probe_guard = ConnectionGuard(
                "probe",
                max_connections=self.limits.probe_max_connections,
                max_per_client=PROBE_MAX_PER_CLIENT,
                header_timeout=settings.http_header_timeout_seconds,
            )
            self.guards.append(probe_guard)
            try:
                probe_socket = bind_listener(settings.host, settings.probe_port, probe_guard, "probe_port")
            except ServerStartError:
                self.main_socket.close()
                raise
            self.probe_listener = ProbeListener(app, probe_socket, settings)
        self.telemetry = ConnectionTelemetry(self.guards)
        self.tls = tls
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=self.port,
            http=protocol_for(self.main_guard),
            ws="none",
            lifespan="on",
            log_config=None,
            access_log=False,
            # No proxy in front of us: X-Forwarded-For must not let a client pick the address that the
            # per-client caps count it under.
            proxy_headers=False,
            timeout_keep_alive=settings.http_keep_alive_timeout_seconds,
            timeout_graceful_shutdown=math.ceil(settings.renew_deadline_seconds),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            **uvicorn_tls_kwargs(tls),
        )
        self.server = _Server(config)
        self.server.probe = self.probe_listener

    @property
    def port(self) -> int:
        return int(self.main_socket.getsockname()[1])

    @property
    def probe_port(self) -> int | None:
        if self.probe_listener is None:
            return None
        return int(self.probe_listener.sock.getsockname()[1])

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        with bounded_loop_errors(loop), bounded_uvicorn_log():
            for guard in self.guards:
                guard.start(loop)
            try:
                if self.probe_listener is not None:
                    await self.probe_listener.start()
                scheme = "https" if self.tls is not None else "http"
                log.info(
                    "serving %s on port %d%s",
                    scheme,
                    self.port,
                    f", probes (http) on port {self.probe_port}" if self.probe_port is not None else "",
                    extra={
                        "max_connections": self.limits.max_connections,
                        "max_connections_per_client": self.limits.max_per_client,
                        "file_limit": self.limits.file_limit,
                    },
                )
                await self.server.serve(sockets=[self.main_socket])
            finally:
                for guard in self.guards:
                    guard.stop()
                if self.probe_listener is not None:
                    await self.probe_listener.close()
