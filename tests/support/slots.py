"""Scrape targets that cannot collide: every slot's listening socket is bound up front and held for the run.

A harness that serves replicas as Prometheus targets (the chaos soak, the e2e fleet) declares every slot to
Prometheus before any replica exists, so that a new replica is scraped from its first second. Taking each
slot's port from a ``bind(0)`` that is closed at once (and binding the number again later) let two slots
get the same port: nothing holds a number between the two binds, and this kernel hands out about 14k odd
ports for ``bind(0)``. Prometheus then scraped one replica under two ``pod`` labels and counted its
increments twice.

Here each slot's socket is bound (without ``SO_REUSEADDR``) when the harness starts and stays open until it
ends. While it is open, the kernel gives its port to nobody else: ``bind(0)`` skips ports that have a bound
socket, and an explicit bind of the number fails with EADDRINUSE, with or without ``SO_REUSEADDR`` (both
sockets would need it). A slot's server gets a duplicate of the socket (``serving``; uvicorn's
``Server.serve(sockets=[...])`` listens on it and closes it when it stops), or its descriptor for a child
process (``fd``); either way the slot's own descriptor keeps the port. An unused slot is bound but not
listening: a scrape is refused. A slot whose server has stopped is still listening (a listening socket
cannot stop listening without giving up its port); ``retire`` accepts and resets its connections, so a
scrape fails at once, as it would against a pod that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import Iterable

__all__ = ["SlotSockets", "TargetCollision", "check_distinct"]


class TargetCollision(ValueError):
    """Two scrape targets share an address: Prometheus would scrape one server under two labels."""


def check_distinct(addresses: Iterable[str]) -> None:
    """Raise ``TargetCollision`` if an address occurs twice."""
    shared = sorted(address for address, n in Counter(addresses).items() if n > 1)
    if shared:
        raise TargetCollision(f"scrape targets share an address: {', '.join(shared)}")


class _Reset(asyncio.Protocol):
    """A retired slot: every connection is reset at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


class SlotSockets:
    """``count`` loopback sockets, bound now and held until ``close``: one per scrape target."""

    def __init__(self, count: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self._sockets: list[socket.socket] = []
        self._retired: list[asyncio.Server] = []
        try:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._sockets.append(sock)
                sock.bind((host, 0))
            check_distinct(self.addresses)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._sockets)

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every slot, in slot order."""
        return [f"{self.host}:{sock.getsockname()[1]}" for sock in self._sockets]

    def port(self, slot: int) -> int:
        return int(self._sockets[slot].getsockname()[1])

    def serving(self, slot: int) -> socket.socket:
        """A duplicate of the slot's socket for a server in this process to listen on and close."""
        return self._sockets[slot].dup()

    def fd(self, slot: int) -> int:
        """The slot's descriptor, to hand to a child process (``pass_fds``); it stays open here."""
        return self._sockets[slot].fileno()

    async def retire(self, slot: int) -> None:
        """The slot's server has stopped: reset every connection to it from now on (a gone pod)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Reset, sock=self._sockets[slot].dup(), backlog=16)
        self._retired.append(server)

    def close(self) -> None:
        for server in self._retired:
            server.close()
        self._retired.clear()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.clear()
