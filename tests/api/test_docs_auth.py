"""Defaults a person meets: /docs works without a CDN, the API docs are behind the bearer-token check when
auth is on (like /metrics and /debug/*), and the start-up line says the version, the namespaces watched and
the auth and TLS state."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app import __version__
from app.api.auth import DEFAULT_PROTECTED_PREFIXES, UNAUTHORIZED, BearerAuth, Decision, _forbidden
from app.api.docs import render_docs
from app.cli import startup_line
from app.config import Settings
from app.main import create_app

ALLOWED, DENIED = "ops-token", "prom-token"


class FakeReviewer:
    """Allows ALLOWED on every path, denies DENIED: records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def review(self, token: str, path: str, verb: str = "get", *_: Any) -> Decision:
        self.asked.append((path, verb))
        if token == ALLOWED:
            return Decision(200, "", "", "ops")
        if token == DENIED:
            return _forbidden("prometheus", verb, path, "")
        return UNAUTHORIZED


def settings(**overrides: Any) -> Settings:
    return Settings(**{"kubeconfig": "/nonexistent", **overrides})


async def get(app: Any, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # No lifespan: these routes and the middleware need no running service.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.get(path, headers=headers)


async def test_docs_page_is_self_contained_and_lists_every_endpoint() -> None:
    app = create_app(settings())
    resp = await get(app, "/docs")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    page = resp.text
    # Nothing loaded from elsewhere: no script, no stylesheet link, no absolute URL at all.
    assert "<script" not in page and "<link" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), re.findall(r"https?://\S+", page)
    for path in app.openapi()["paths"]:
        assert f"{path}</code>" in page, path
    assert f"trainer-metrics {__version__}" in page
    # FastAPI's CDN pages are gone, the schema is still served.
    assert (await get(app, "/redoc")).status_code == 404
    assert (await get(app, "/openapi.json")).json()["info"]["version"] == __version__


def test_render_docs_escapes_and_links_schemas() -> None:
    schema = {
        "info": {"title": "t<x>", "version": "1"},
        "paths": {
            "/a": {
                "get": {
                    "summary": "<b>",
                    "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"}}],
                    "responses": {
                        "200": {
                            "description": "ok",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/S"}}},
                        }
                    },
                }
            }
        },
        "components": {"schemas": {"S": {"properties": {"f": {"type": "string"}}, "required": ["f"]}}},
    }
    page = render_docs(schema)
    assert "t&lt;x&gt;" in page and "&lt;b&gt;" in page and "<b>" not in page
    assert '<a href="#schema-S">S</a>' in page and 'id="schema-S"' in page
    assert "<code>limit</code>" in page and "<code>f</code>" in page


def test_docs_and_schema_are_protected_by_default() -> None:
    assert {"/docs", "/openapi.json", "/metrics", "/debug"} <= set(DEFAULT_PROTECTED_PREFIXES)


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/metrics", "/debug/terminal"])
async def test_protected_paths_need_an_allowed_token(path: str) -> None:
    inner = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @inner.get(path)
    async def ok() -> dict[str, str]:
        return {"ok": path}

    reviewer = FakeReviewer()
    app = BearerAuth(inner, reviewer=reviewer)
    assert (await get(app, path)).status_code == 401
    assert (await get(app, path, DENIED)).status_code == 403
    allowed = await get(app, path, ALLOWED)
    assert allowed.status_code == 200 and allowed.json() == {"ok": path}
    # The SubjectAccessReview is for the request's own path: what <release>-debug-reader grants.
    assert reviewer.asked[-1] == (path, "get")


@pytest.mark.parametrize("path", ["/", "/livez", "/readyz", "/healthz", "/docsx", "/openapi.jsonx"])
async def test_open_paths_pass_without_a_review(path: str) -> None:
    inner = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @inner.get(path)
    async def ok() -> str:
        return "ok"

    reviewer = FakeReviewer()
    assert (await get(BearerAuth(inner, reviewer=reviewer), path)).status_code == 200
    assert reviewer.asked == []


async def test_the_app_with_auth_on_guards_its_docs() -> None:
    app = create_app(settings(auth_enabled=True))
    for path in ("/docs", "/openapi.json"):
        resp = await get(app, path)
        assert resp.status_code == 401, path
        assert resp.json()["reason"] == "Unauthorized"
    # With auth off they stay open (no token to ask for).
    assert (await get(create_app(settings()), "/openapi.json")).status_code == 200


def test_startup_line_names_version_namespaces_auth_and_tls() -> None:
    line = startup_line(settings(namespaces=["team-a", "team-b"], lease_name="tm", identity="pod-0"), None)
    assert line.startswith(f"trainer-metrics {__version__} starting: ")
    for needle in ("namespaces team-a,team-b", "auth off", "TLS off", "(http)", "debug endpoints on"):
        assert needle in line, needle
    assert "Lease " in line and "/tm, identity pod-0" in line
    line = startup_line(settings(auth_enabled=True, debug_endpoints=False, leader_election=False), None)
    for needle in ("namespaces all", "auth on (TokenReview + SubjectAccessReview)", "debug endpoints off"):
        assert needle in line, needle
    assert "leader election off" in line
    assert "probes on the main port" in startup_line(settings(probe_port=0), None)
    assert "probes on 0.0.0.0:9082 (http)" in startup_line(settings(probe_port=9082), None)


def test_startup_line_with_tls() -> None:
    class _Tls:  # startup_line only asks whether TLS is on
        pass

    line = startup_line(settings(tls_cert_file="/etc/tls/tls.crt", tls_key_file="/etc/tls/tls.key"), _Tls())  # type: ignore[arg-type]
    assert "TLS on (/etc/tls/tls.crt)" in line and "(https)" in line


def test_cli_logs_the_startup_line_before_serving(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main() logs it once the settings are loaded and checked, before the app is built and bound."""
    from app import cli, main

    class Stop(Exception):
        pass

    def no_cluster(coro: Any, *_: Any, **__: Any) -> None:
        coro.close()  # the pre-flight check would reach for a cluster: skipped here

    def stop(*_: Any, **__: Any) -> None:
        raise Stop

    for name in list(os.environ):
        if name.startswith("TRAINER_METRICS_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(cli, "configure_logging", lambda *_: None)
    monkeypatch.setattr(cli.asyncio, "run", no_cluster)
    monkeypatch.setattr(main, "create_app", stop)
    with caplog.at_level(logging.INFO, logger="app.cli"), pytest.raises(Stop):
        cli.main(["--kubeconfig", "/nonexistent", "--namespaces", "a,b"])
    (record,) = [r for r in caplog.records if r.name == "app.cli"]
    assert record.getMessage().startswith(f"trainer-metrics {__version__} starting: ")
    assert "namespaces a,b" in record.getMessage()


async def test_an_app_and_its_service_are_freed_once_dropped() -> None:
    """No endpoint closes over the app: FastAPI keeps every endpoint function in module-level caches
    (fastapi.dependencies.models), so such a closure kept each app built, its ``state.service`` and a
    stopped replica's caches alive for the life of the process (tests/chaos/test_no_leak.py)."""
    import gc
    import weakref

    class Marker:
        pass

    app = create_app(settings())
    app.state.service = marker = Marker()
    assert (await get(app, "/docs")).status_code == 200
    refs = [weakref.ref(app), weakref.ref(marker)]
    del app, marker
    gc.collect()
    assert [r() for r in refs] == [None, None]
