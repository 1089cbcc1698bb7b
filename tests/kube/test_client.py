"""KubeClient: kubeconfig auth through kubernetes-asyncio, timeouts, non-JSON error bodies, 401 reload."""

from __future__ import annotations

import asyncio
import email.utils
import gc
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from app.kube import client as client_mod
from app.kube.client import ApiError, KubeClient, error_from_response, parse_retry_after
from tests.support.kubeconfig import write_kubeconfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    """A tiny HTTP server whose one route is whatever the test sets as ``handler``."""

    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.requests: list[tuple[str, str, dict[str, str], dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.method, request.path, dict(request.query), dict(request.headers), body))
        assert self.handler is not None
        return await self.handler(request)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def kube(server: Server, tmp_path: Path) -> AsyncIterator[KubeClient]:
    cfg = write_kubeconfig(tmp_path / "config", server.url, token="secret-0")
    c = await KubeClient.connect(str(cfg))
    yield c
    await c.close()


# --- pure parsing --------------------------------------------------------------------------------


def test_error_from_status_json() -> None:
    body = (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: '
        b'Too large resource version: 900, current: 850","reason":"Timeout","details":{"causes":[{'
        b'"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],'
        b'"retryAfterSeconds":1},"code":504}'
    )
    err = error_from_response(504, "Gateway Timeout", {"Content-Type": "application/json"}, body)
    assert (err.status, err.reason, err.retry_after) == (504, "Timeout", 1.0)
    assert err.message.startswith("Timeout: Too large resource version")
    assert err.is_too_large_resource_version


def test_error_from_text_plain_429() -> None:
    err = error_from_response(
        429,
        "Too Many Requests",
        {"Content-Type": "text/plain; charset=utf-8", "Retry-After": "1"},
        b"Too many requests, please try again later.\n",
    )
    assert (err.status, err.reason, err.retry_after) == (429, "Too Many Requests", 1.0)
    assert err.message == "Too many requests, please try again later."
    assert not err.is_too_large_resource_version


def test_error_from_html_and_empty_and_broken_json() -> None:
    html = b"<html><head><title>502 Bad Gateway</title></head><body>" + b"x" * 10_000 + b"</body></html>"
    err = error_from_response(502, "Bad Gateway", {"Content-Type": "application/json"}, html)
    assert err.status == 502 and err.reason == "Bad Gateway" and len(err.message) <= 512
    assert error_from_response(503, None, {}, b"").message == ""
    broken = error_from_response(500, "Internal Server Error", {}, b'{"kind":"Status", "mess')
    assert broken.reason == "Internal Server Error" and "Status" in broken.message
    # A JSON body that is not a Status (e.g. a proxy's own JSON) keeps the HTTP reason phrase.
    other = error_from_response(500, "Internal Server Error", {}, b"[1, 2]")
    assert other.reason == "Internal Server Error"


def test_parse_retry_after() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


# --- requests ------------------------------------------------------------------------------------


async def test_request_json_sends_auth_query_and_body(server: Server, kube: KubeClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True, "echo": await request.json()}, status=201)

    server.handler = handler
    got = await kube.request_json(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
        query={"a": "b c"},
        body={"x": 1},
        timeout=2,
    )
    assert got == {"ok": True, "echo": {"x": 1}}
    method, path, query, headers, _body = server.requests[-1]
    assert (method, path, query) == (
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
        {"a": "b c"},
    )
    assert headers["Authorization"] == "Bearer secret-0"
    assert headers["Content-Type"] == "application/json"


async def test_no_response_body_outlives_its_request(server: Server, kube: KubeClient) -> None:
    """kubernetes-asyncio's ApiClient keeps the last response it returned (``last_response``), body and all:
    a LIST page of pods is MBs, held until the next request. The client drops it."""
    page = {"items": [{"metadata": {"name": f"p{i}"}} for i in range(20_000)]}

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(page)

    server.handler = handler
    assert (await kube.request_json("GET", "/api/v1/pods", timeout=5))["items"][-1] == page["items"][-1]
    held = [
        o for o in gc.get_objects() if isinstance(o, aiohttp.ClientResponse) and o._body is not None
    ]  # what an ApiClient's last_response kept alive
    assert not held
    assert kube._api.last_response is None


async def test_request_json_merge_patch_content_type(server: Server, kube: KubeClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ct": request.content_type})

    server.handler = handler
    got = await kube.request_json(
        "PATCH", "/x", body={"a": None}, content_type="application/merge-patch+json", timeout=2
    )
    assert got == {"ct": "application/merge-patch+json"}
    assert server.requests[-1][4] == b'{"a": null}'


async def test_request_json_errors(server: Server, kube: KubeClient) -> None:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'leases.coordination.k8s.io "l" not found',
        "reason": "NotFound",
        "details": {"name": "l", "group": "coordination.k8s.io", "kind": "leases"},
        "code": 404,
    }
    responses: list[web.Response] = [
        web.json_response(status, status=404),
        web.Response(
            status=429, text="Too many requests, please try again later.", headers={"Retry-After": "1"}
        ),
        web.Response(status=503, text="<html><body>upstream down</body></html>", content_type="text/html"),
        web.Response(status=200, text="not json", content_type="application/json"),
        web.Response(status=200),
    ]

    async def handler(request: web.Request) -> web.StreamResponse:
        return responses.pop(0)

    server.handler = handler
    with pytest.raises(ApiError) as e404:
        await kube.request_json("GET", "/l", timeout=2)
    assert (e404.value.status, e404.value.reason, e404.value.details["kind"]) == (404, "NotFound", "leases")
    with pytest.raises(ApiError) as e429:
        await kube.request_json("GET", "/l", timeout=2)
    assert (e429.value.status, e429.value.retry_after) == (429, 1.0)
    assert "Too many requests" in e429.value.message
    with pytest.raises(ApiError) as e503:
        await kube.request_json("GET", "/l", timeout=2)
    assert e503.value.status == 503 and "upstream down" in e503.value.message
    with pytest.raises(ApiError) as ebad:
        await kube.request_json("GET", "/l", timeout=2)
    assert ebad.value.reason == "InvalidResponse"
    assert await kube.request_json("GET", "/l", timeout=2) is None


async def test_request_json_timeout_is_status_zero(server: Server, kube: KubeClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response({})

    server.handler = handler
    started = time.monotonic()
    with pytest.raises(ApiError) as err:
        await kube.request_json("GET", "/slow", timeout=0.3)
    assert err.value.status == 0 and err.value.reason == "Timeout"
    assert time.monotonic() - started < 2


async def test_request_json_slow_body_is_bounded(server: Server, kube: KubeClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"a":')
        await asyncio.sleep(5)
        return resp

    server.handler = handler
    with pytest.raises(ApiError) as err:
        await kube.request_json("GET", "/slow-body", timeout=0.3)
    assert err.value.status == 0


async def test_connection_refused_is_status_zero(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    cfg = write_kubeconfig(tmp_path / "config", f"http://127.0.0.1:{port}", token="t")
    c = await KubeClient.connect(str(cfg))
    try:
        with pytest.raises(ApiError) as err:
            await c.request_json("GET", "/", timeout=2)
        assert err.value.status == 0
        with pytest.raises(ApiError) as err2:
            async with c.stream("/", query={}, timeout=aiohttp.ClientTimeout(sock_connect=1, sock_read=1)):
                pass
        assert err2.value.status == 0
    finally:
        await c.close()


async def test_stream_yields_2xx_and_raises_otherwise(server: Server, kube: KubeClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("fail"):
            return web.Response(status=429, text="slow down", headers={"Retry-After": "2"})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"type":"ADDED"}\n')
        await resp.write(b'{"type":"DELETED"}\n')
        return resp

    server.handler = handler
    timeout = aiohttp.ClientTimeout(sock_connect=1, sock_read=1)
    async with kube.stream("/w", query={"watch": "true"}, timeout=timeout) as resp:
        assert resp.status == 200
        assert await resp.read() == b'{"type":"ADDED"}\n{"type":"DELETED"}\n'
    assert server.requests[-1][2] == {"watch": "true"}
    assert server.requests[-1][3]["Authorization"] == "Bearer secret-0"
    with pytest.raises(ApiError) as err:
        async with kube.stream("/w", query={"fail": "1"}, timeout=timeout):
            pytest.fail("must not yield")
    assert (err.value.status, err.value.retry_after, err.value.message) == (429, 2.0, "slow down")


async def test_context_selection(server: Server, tmp_path: Path) -> None:
    cfg = write_kubeconfig(tmp_path / "config", server.url, token="t")
    c = await KubeClient.connect(str(cfg), context="other")
    try:
        assert c.host == "http://127.0.0.1:1"
    finally:
        await c.close()


async def test_kubeconfig_env_fallback(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_kubeconfig(tmp_path / "config", server.url, token="t")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(cfg))
    c = await KubeClient.connect()
    try:
        assert c.host == server.url
    finally:
        await c.close()


async def test_401_reloads_token_file_for_the_retry(server: Server, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old")
    cfg = write_kubeconfig(tmp_path / "config", server.url, token_file=token_file)
    valid = {"Bearer new"}

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") not in valid:
            return web.json_response(
                {
                    "kind": "Status",
                    "status": "Failure",
                    "message": "Unauthorized",
                    "reason": "Unauthorized",
                    "code": 401,
                },
                status=401,
            )
        return web.json_response({"ok": 1})

    server.handler = handler
    c = await KubeClient.connect(str(cfg))
    try:
        token_file.write_text("new")  # rotated after we loaded it
        with pytest.raises(ApiError) as err:
            await c.request_json("GET", "/x", timeout=2)
        assert err.value.status == 401
        assert await c.request_json("GET", "/x", timeout=2) == {"ok": 1}  # the caller's retry succeeds
    finally:
        await c.close()


async def test_in_cluster_config_and_401_forces_token_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-1")
    ca.write_text("not really a cert")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(client_mod, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(client_mod, "SERVICE_CERT_FILENAME", str(ca))
    created: list[Any] = []

    class FakeApiClient:
        def __init__(self, configuration: Any) -> None:
            self.configuration = configuration
            self.user_agent = ""
            created.append(self)

        async def close(self) -> None:
            pass

    monkeypatch.setattr(client_mod, "ApiClient", FakeApiClient)
    c = await KubeClient.connect()
    cfg = created[0].configuration
    assert c.host == "https://10.0.0.1:443"
    assert await cfg.get_api_key_with_prefix("BearerToken") == "Bearer sa-1"
    token.write_text("sa-2")
    # Within the refresh period the hook keeps the cached token; a 401 makes it re-read at once.
    assert await cfg.get_api_key_with_prefix("BearerToken") == "Bearer sa-1"
    assert c._reloader is not None
    await c._reloader.reload()
    assert await cfg.get_api_key_with_prefix("BearerToken") == "Bearer sa-2"
    await c.close()
