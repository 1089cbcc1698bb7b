"""The listening sockets: every connection is admitted through its listener's guard inside accept().

asyncio's accept loop calls ``sock.accept()`` on the very socket handed to ``create_server``, so a socket
subclass is the one place that sees every connection before any transport, TLS handshake or protocol
exists, and before it costs more than a descriptor. Refused connections are closed at once with a reset.

accept() can still fail for lack of descriptors (other files, a system-wide limit). Python 3.11's accept
loop then logs one error per backlog slot per second (the ~2 million lines seen in 35 s); instead the
pending connections are accepted on a spare descriptor and closed, and the failure is counted and logged
once per interval by the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from app.config import ENV_PREFIX
from app.serving.guard import ConnectionGuard
from app.serving.limits import ServerStartError

# Accept-loop refusals per accept() call, and admissions per turn of the event loop, before yielding to
# it (the rest on its next turn). asyncio would otherwise accept up to the backlog (2,048) in one go: a
# wave of attackers displacing one another before any of them has a transport that could be closed.
_MAX_REFUSALS_PER_ACCEPT = 256
_MAX_ADMISSIONS_PER_TURN = 64


class _AcceptedSocket(socket.socket):
    """An accepted connection that tells its guard when it closes (asyncio closes it exactly once)."""

    _guard: ConnectionGuard | None = None

    def close(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            with contextlib.suppress(OSError):
                guard.released(self.fileno())
        super().close()


_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)
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
                if self.family in _TCP_FAMILIES:
                    # asyncio turns Nagle off only when the socket says IPPROTO_TCP; without it a small
                    # response on a kept-alive connection waits for the client's delayed ACK (40 ms).
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
