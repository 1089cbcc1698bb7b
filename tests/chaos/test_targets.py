"""Scrape targets cannot collide (tests/support/slots.py): the chaos soak and the e2e fleet bind every
slot's socket up front and hold it for the whole run; a harness with two targets on one address refuses to
start. Before, slots took ports from a ``bind(0)`` closed at once, two slots could get one port, and
Prometheus counted that replica's increments twice (issue 28)."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import socket
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from tests.chaos.soak.config import SoakConfig
from tests.chaos.soak.runner import Soak
from tests.support.fleet import FleetPrometheus
from tests.support.prom import Prometheus, listening_ports
from tests.support.slots import SlotSockets, TargetCollision, check_distinct
from tests.support.waiting import eventually


def _bind(port: int, *, reuse: bool) -> int:
    """0 if a fresh socket could bind 127.0.0.1:port (and listen), else the errno."""
    with socket.socket() as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError as exc:
            return exc.errno or -1
    return 0


def _connect(port: int) -> str:
    with socket.socket() as sock:
        sock.settimeout(5.0)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            data = sock.recv(4096)
        except ConnectionRefusedError:
            return "refused"
        except ConnectionResetError:
            return "reset"
        return "answered" if data else "closed"


def test_every_slot_has_its_own_port_and_nothing_else_can_bind_it() -> None:
    slots = SlotSockets(64)
    try:
        ports = [slots.port(slot) for slot in range(len(slots))]
        assert len(set(ports)) == len(ports)
        for port in ports[:8]:
            # Another server cannot take a held port, even one that sets SO_REUSEADDR (uvicorn, Go's
            # net.Listen: Prometheus) ...
            assert _bind(port, reuse=False) == errno.EADDRINUSE
            assert _bind(port, reuse=True) == errno.EADDRINUSE
        # ... and bind(0) never hands one out.
        others = []
        try:
            for _ in range(256):
                sock = socket.socket()
                others.append(sock)
                sock.bind(("127.0.0.1", 0))
            assert not {s.getsockname()[1] for s in others} & set(ports)
        finally:
            for sock in others:
                sock.close()
        # A slot nobody serves yet refuses a scrape (bound, not listening).
        assert _connect(ports[0]) == "refused"
    finally:
        slots.close()


async def test_a_slot_is_served_through_its_held_socket_then_resets_scrapes_once_retired() -> None:
    slots = SlotSockets(2)
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("up 1\n")

    try:
        port = slots.port(1)
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off")
        )
        task = asyncio.create_task(server.serve(sockets=[slots.serving(1)]))
        await eventually(lambda: server.started, 10.0, what="the server listening")
        assert await asyncio.to_thread(_connect, port) == "answered"
        server.should_exit = True
        await task
        # uvicorn closed its duplicate: the slot still holds the port ...
        assert _bind(port, reuse=True) == errno.EADDRINUSE
        await slots.retire(1)
        # ... and a scrape of a gone replica fails at once.
        assert await asyncio.to_thread(_connect, port) in ("reset", "closed")
        assert _bind(port, reuse=True) == errno.EADDRINUSE
    finally:
        slots.close()


def test_a_harness_with_two_targets_on_one_address_refuses_to_start(tmp_path: Path) -> None:
    check_distinct(["127.0.0.1:1", "127.0.0.1:2"])
    with pytest.raises(TargetCollision, match=re.escape("127.0.0.1:9")):
        check_distinct(["127.0.0.1:9", "127.0.0.1:2", "127.0.0.1:9"])
    labels = {"pod": "slot-0"}
    with pytest.raises(TargetCollision):
        FleetPrometheus(tmp_path, [("127.0.0.1:9", labels), ("127.0.0.1:9", {"pod": "slot-1"})])
    prom = Prometheus(tmp_path, {"a": ("127.0.0.1:9", labels), "b": ("127.0.0.1:9", labels)})
    with pytest.raises(TargetCollision):
        prom.start()  # before any process is started
    assert prom.proc is None


def test_the_soak_declares_one_held_socket_per_slot(tmp_path: Path) -> None:
    soak = Soak(SoakConfig(fault_seconds=40.0), tmp_path)
    try:
        addresses = [address for address, _labels in soak.targets()]
        check_distinct(addresses)
        assert len(addresses) == len(soak.slots) >= 3
        port = int(addresses[0].rsplit(":", 1)[1])
        assert _bind(port, reuse=True) == errno.EADDRINUSE
    finally:
        soak.slots.close()


def test_listening_ports_finds_the_port_a_process_picked() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert sock.getsockname()[1] in listening_ports(os.getpid())
