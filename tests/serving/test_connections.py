"""The HTTP server's connection guard (app/serving/server.py), in process, against a real loopback listener.

Each test runs ``HttpServer`` (uvicorn with the guard) around a tiny app and drives raw sockets at it from
several loopback addresses (127.0.0.x: one per "host"), checking what the guard promises: deadlines on the
request head and the response, per-client and listener caps with displacement of waiting connections only,
the probe-only listener, bounded logging, and the numbers in self-telemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from app.config import Settings
from app.kube.priority import LoopPriority
from app.serving.clientaddr import client_key
from app.serving.guard import ConnectionGuard
from app.serving.limits import FD_RESERVE, PROBE_MAX_CONNECTIONS, Limits, ServerStartError
from app.serving.listeners import GuardedListener
from app.serving.server import HttpServer
from app.serving.telemetry import ConnectionTelemetry
from app.serving.tls import CertificateReloader
from tests.support.auth_rig import OPENSSL, make_cert
from tests.support.waiting import eventually

HEADER_TIMEOUT = 1.0
# How late a deadline may be seen to fire: the guard's sweep period (0.1 s here) plus scheduling on a
# loaded two-core machine, where this test's client and the server share one event loop.
LATE = 1.0


class App:
    """Routes for the guard to protect: probes, /metrics, a request that waits, a large body."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0

    def build(self) -> Starlette:
        async def ok(request: Request) -> Response:
            return PlainTextResponse("ok\n")

        async def slow(request: Request) -> Response:
            self.waiting += 1
            await self.release.wait()
            return PlainTextResponse("done\n")

        async def big(request: Request) -> Response:
            return Response(b"x" * (64 * 1024 * 1024))

        routes = [Route(p, ok) for p in ("/livez", "/readyz", "/metrics")]
        return Starlette(routes=[*routes, Route("/slow", slow), Route("/big", big)])


@contextlib.asynccontextmanager
async def serving(
    tls: CertificateReloader | None = None, **overrides: Any
) -> AsyncIterator[tuple[HttpServer, App]]:
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "probe_port": 0,
        "http_header_timeout_seconds": HEADER_TIMEOUT,
        "http_keep_alive_timeout_seconds": 1,
        **overrides,
    }
    app = App()
    server = HttpServer(app.build(), Settings(**values), tls)
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.server.started or task.done(), timeout=10, what="server started")
        assert not task.done(), task.exception()
        yield server, app
    finally:
        app.release.set()
        server.server.should_exit = True
        await asyncio.wait_for(task, 15)


async def connect(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def closed_after(reader: asyncio.StreamReader, limit: float) -> float:
    """Seconds until the server closes the connection (reading whatever it sends); fails after ``limit``."""
    started = time.monotonic()
    async with asyncio.timeout(limit):
        while True:
            try:
                if not await reader.read(65536):
                    break
            except ConnectionResetError:
                break
    return time.monotonic() - started


async def still_open(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    except ConnectionResetError:
        return False
    return bool(data)


async def get(port: int, path: str = "/metrics", source: str = "127.0.0.1") -> httpx.Response:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(transport=transport, timeout=5) as http:
        return await http.get(f"http://127.0.0.1:{port}{path}")


# ---------------------------------------------------------------------------------------------- listeners


async def test_accepted_connections_send_without_nagle() -> None:
    """Every accepted TCP connection has TCP_NODELAY, whatever protocol number its listener was made
    with: asyncio sets it only on sockets that say IPPROTO_TCP, and without it a small response on a
    kept-alive connection waits for the client's delayed ACK (40 ms per scrape, seen in the benchmarks)."""
    for proto in (0, socket.IPPROTO_TCP):
        listener = GuardedListener(socket.AF_INET, socket.SOCK_STREAM, proto)
        listener.setup(ConnectionGuard("main", max_connections=4, max_per_client=4, header_timeout=1.0))
        with listener, socket.create_connection(_listen(listener)):
            conn, _ = listener.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), proto


async def test_a_request_head_asks_ingestion_to_step_aside() -> None:
    """The protocol nudges the loop's ingestion when it has parsed a request head (app/kube/priority.py)."""
    priority = LoopPriority()
    async with serving() as (server, _):
        assert not priority.wanted
        assert (await get(server.port, "/livez")).status_code == 200
    assert priority.wanted


def _listen(listener: GuardedListener) -> tuple[str, int]:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host, port = listener.getsockname()
    return str(host), int(port)


async def test_probe_listener_serves_only_the_probes() -> None:
    async with serving() as (server, _):
        assert server.probe_port is not None and server.probe_port != server.port
        for path in ("/livez", "/readyz"):
            assert (await get(server.probe_port, path)).status_code == 200
        refused = await get(server.probe_port, "/metrics")
        assert refused.status_code == 404
        assert "serves /livez, /healthz and /readyz only" in refused.text
        assert (await get(server.port, "/metrics")).status_code == 200


async def test_probe_listener_off() -> None:
    async with serving(probe_port="off") as (server, _):
        assert server.probe_port is None and server.probe_listener is None
        assert (await get(server.port, "/readyz")).status_code == 200


def test_port_in_use_is_one_line_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for setting, kwargs in (("PORT", {"port": port}), ("PROBE_PORT", {"probe_port": port})):
            with pytest.raises(ServerStartError) as info:
                HttpServer(Starlette(), Settings(host="127.0.0.1", **{"port": 0, "probe_port": 0, **kwargs}))
            message = str(info.value)
            assert f"(TRAINER_METRICS_{setting})" in message and "\n" not in message, message


def test_caps_follow_the_file_limit() -> None:
    settings = Settings(max_connections=100_000, max_connections_per_client=64)
    limits = Limits.compute(settings, 4096)
    assert limits.max_connections == 4096 - FD_RESERVE - PROBE_MAX_CONNECTIONS
    assert Limits.compute(Settings(max_connections=512), 65536).max_connections == 512
    with pytest.raises(ServerStartError, match="open-file limit"):
        Limits.compute(settings, FD_RESERVE + PROBE_MAX_CONNECTIONS + 8)


def test_file_limit_is_raised_to_the_hard_limit() -> None:
    # In a child process, so that this one keeps its limits.
    code = textwrap.dedent(
        """
        import resource
        from app.serving.server import raise_file_limit
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, min(hard, 4096)))
        print(raise_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    returned, soft = map(int, out.split())
    assert returned == soft > 256


def test_client_key() -> None:
    assert client_key(("10.1.2.3", 5555)) == "10.1.2.3"
    assert client_key(("2001:db8:1:2:aaaa::1", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert client_key(("2001:db8:1:2:ffff::9", 1, 0, 0)) == "2001:db8:1:2::/64"  # same host range
    assert client_key(("::ffff:10.0.0.7", 1, 0, 0)) == "10.0.0.7"
    assert client_key(("fe80::1%eth0", 1, 0, 2)) == "fe80::/64"
    assert client_key(None) == ""


# ---------------------------------------------------------------------------------------------- deadlines


async def test_idle_and_slow_header_connections_are_closed_at_the_header_timeout() -> None:
    async with serving() as (server, _):
        idle_r, idle_w = await connect(server.port)
        slow_r, slow_w = await connect(server.port)
        slow_w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                while not slow_w.is_closing():
                    slow_w.write(b"X-Slow: 1\r\n")  # a byte every 0.2 s never restarts the clock
                    await slow_w.drain()
                    await asyncio.sleep(0.2)  # the trickle's pace

        trickler = asyncio.create_task(trickle())
        waited = await asyncio.gather(closed_after(idle_r, 5), closed_after(slow_r, 5))
        trickler.cancel()
        for w in (idle_w, slow_w):
            w.close()
        assert all(HEADER_TIMEOUT <= t < HEADER_TIMEOUT + LATE for t in waited), waited
        assert server.main_guard.stats.closed["header_timeout"] == 2
        assert (await get(server.port)).status_code == 200


async def test_idle_keep_alive_connection_is_closed() -> None:
    async with serving() as (server, _):
        reader, writer = await connect(server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"ok\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert 0.9 <= await closed_after(reader, 5) < HEADER_TIMEOUT + LATE  # uvicorn's keep-alive: 1 s
        writer.close()


async def test_request_being_served_is_not_cut_by_the_header_timeout() -> None:
    async with serving() as (server, app):
        reader, writer = await connect(server.port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: app.waiting == 1, what="request in the app")
        assert await still_open(reader, HEADER_TIMEOUT + 0.5)
        app.release.set()
        assert (await reader.readuntil(b"done\n")).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_client_that_stops_reading_is_cut_at_the_response_timeout() -> None:
    async with serving() as (server, _):
        server.main_guard.response_timeout = 0.5  # RESPONSE_TIMEOUT is 60 s
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")  # 64 MiB, and never read
        await eventually(lambda: server.main_guard.stats.closed["response_timeout"] == 1, timeout=5)
        await eventually(lambda: server.main_guard.open_connections == 0, timeout=2)
        sock.close()


@pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not available")
async def test_tls_handshake_counts_against_the_header_timeout(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "tls", 1)
    async with serving(tls=CertificateReloader(str(pair.cert), str(pair.key))) as (server, _):
        reader, writer = await connect(server.port)  # TCP only: no ClientHello, ever
        assert HEADER_TIMEOUT <= await closed_after(reader, 5) < HEADER_TIMEOUT + LATE
        writer.close()
        assert server.main_guard.stats.closed["header_timeout"] == 1
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(pair.cert))) as http:
            assert (await http.get(f"https://127.0.0.1:{server.port}/metrics")).status_code == 200
        assert server.probe_port is not None  # the probe port stays plain HTTP
        assert (await get(server.probe_port, "/readyz")).status_code == 200


# ---------------------------------------------------------------------------------------------- caps


async def test_client_at_its_cap_displaces_its_own_waiting_connections() -> None:
    async with serving(max_connections_per_client=4) as (server, _):
        conns = [await connect(server.port, "127.0.0.2") for _ in range(4)]
        fifth = await connect(server.port, "127.0.0.2")
        assert await closed_after(conns[0][0], 2) < 1  # the oldest one goes
        assert await still_open(fifth[0], 0.2)
        assert server.main_guard.client_connections("127.0.0.2") == 4
        assert server.main_guard.stats.closed["evicted"] == 1
        assert (await get(server.port, source="127.0.0.3")).status_code == 200
        for _, w in (*conns, fifth):
            w.close()


async def test_at_the_cap_a_light_client_displaces_the_heaviest_one() -> None:
    async with serving(max_connections=16, max_connections_per_client=16) as (server, _):
        hogs = [await connect(server.port, "127.0.0.2") for _ in range(12)]
        others = [await connect(server.port, "127.0.0.3") for _ in range(4)]
        await eventually(lambda: server.main_guard.open_connections == 16)
        light = []
        for _ in range(3):  # three connections from a third host, each one served
            r, w = await connect(server.port, "127.0.0.4")
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await r.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200")
            light.append((r, w))
        # The heaviest host paid for them, oldest first; the other one kept all four.
        assert server.main_guard.stats.closed["evicted"] == 3
        assert server.main_guard.client_connections("127.0.0.2") == 9
        assert server.main_guard.client_connections("127.0.0.3") == 4
        for r, _ in hogs[:3]:
            assert await closed_after(r, 1) < 1
        # A newcomer from the heaviest host can only displace its own oldest waiting connection.
        await connect(server.port, "127.0.0.2")
        assert await closed_after(hogs[3][0], 1) < 1
        assert server.main_guard.client_connections("127.0.0.3") == 4
        for _, w in (*hogs, *others, *light):
            w.close()


async def test_at_the_cap_with_every_connection_busy_newcomers_are_refused() -> None:
    async with serving(max_connections=16, max_connections_per_client=16) as (server, app):
        busy = []
        for i in range(16):
            r, w = await connect(server.port, f"127.0.0.{2 + i % 2}")
            w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append((r, w))
        await eventually(lambda: app.waiting == 16, what="16 requests in the app")
        try:  # reset at once (the reset may even beat the client's own connect): nothing to displace
            late_r, late_w = await connect(server.port, "127.0.0.9")
            assert await closed_after(late_r, 2) < 1
            late_w.close()
        except ConnectionResetError:
            pass
        assert server.main_guard.stats.refused["capacity"] == 1
        assert server.main_guard.stats.closed["evicted"] == 0
        app.release.set()
        for r, w in busy:
            assert (await r.readuntil(b"done\n")).startswith(b"HTTP/1.1 200")
            w.close()
        assert (await get(server.port, source="127.0.0.9")).status_code == 200


async def test_probes_answer_while_the_main_listener_is_full() -> None:
    async with serving(max_connections=16, max_connections_per_client=16) as (server, app):
        assert server.probe_port is not None
        busy = []
        for _ in range(16):
            r, w = await connect(server.port, "127.0.0.2")
            w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append((r, w))
        await eventually(lambda: app.waiting == 16)
        started = time.monotonic()
        assert (await get(server.probe_port, "/readyz")).status_code == 200
        assert time.monotonic() - started < 1
        app.release.set()
        for _, w in busy:
            w.close()


async def test_connection_telemetry() -> None:
    async with serving(max_connections_per_client=2) as (server, _):
        conns = [await connect(server.port, "127.0.0.2") for _ in range(3)]
        await eventually(lambda: server.main_guard.stats.closed["evicted"] == 1)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in ConnectionTelemetry(server.guards).collect()
            for s in family.samples
        }
        main = (("listener", "main"),)
        assert samples[("trainer_metrics_http_connections", main)] == 2
        assert samples[("trainer_metrics_http_connections_max", main)] == server.limits.max_connections
        evicted = (("listener", "main"), ("reason", "evicted"))
        assert samples[("trainer_metrics_http_connections_closed_total", evicted)] == 1
        assert samples[("trainer_metrics_http_accept_errors_total", (("listener", "probe"),))] == 0
        for _, w in conns:
            w.close()


# ---------------------------------------------------------------------------------------------- accept errors

_OUT_OF_FILES = textwrap.dedent(
    """
    import asyncio, json, logging, os, resource, sys, time
    from app.serving.server import ConnectionGuard, bind_listener, bounded_loop_errors

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    async def main():
        guard = ConnectionGuard("main", max_connections=10_000, max_per_client=10_000, header_timeout=30)
        sock = bind_listener("127.0.0.1", 0, guard, "port")
        loop = asyncio.get_running_loop()
        with bounded_loop_errors(loop):
            server = await loop.create_server(asyncio.Protocol, sock=sock, backlog=2048)
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            hog = []
            try:
                while True:
                    hog.append(os.open(os.devnull, os.O_RDONLY))  # every descriptor left
            except OSError:
                pass
            print(sock.getsockname()[1], flush=True)
            cpu = time.process_time()
            await asyncio.sleep(float(sys.argv[1]))  # the clients connect meanwhile
            print(json.dumps({"accept_errors": guard.stats.accept_errors,
                              "cpu": time.process_time() - cpu}), flush=True)
            server.close()

    asyncio.run(main())
    """
)


async def test_out_of_descriptors_refuses_promptly_and_logs_once() -> None:
    """Python 3.11's accept loop logs one error per backlog slot per second when accept() fails for lack
    of descriptors; the listener refuses those connections on a spare descriptor instead, and logs once."""
    seconds = 3.0
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OUT_OF_FILES, str(seconds),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    port = int(await proc.stdout.readline())
    waits = []
    for i in range(40):
        reader, writer = await connect(port, f"127.0.0.{2 + i % 4}")
        waits.append(await closed_after(reader, 2))
        writer.close()
    result = json.loads(await proc.stdout.readline())
    stderr = (await proc.stderr.read()).decode()
    await proc.wait()
    assert max(waits) < 1, waits  # closed at once, not left hanging in the backlog
    assert result["accept_errors"] >= 1
    assert result["cpu"] < seconds / 2, result  # no busy loop on a listener nobody can accept from
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= 3, lines
    assert "accept() failed" in lines[0]
