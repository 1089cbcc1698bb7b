"""Bearer auth while the API server cannot be reached (docs/security.md, "When the API server is down"), and
HEAD authorized as get.

kube-apiserver's webhook token authenticator and kube-rbac-proxy cache what the API answered and fail closed
on an error; without more, any outage longer than the cache time blanks every scrape. The exporter keeps a
grant ``auth_outage_grace_seconds`` past its cache time and honours it only while the API cannot be asked:
a denial is never extended, an identity never allowed is never let in, and each use is counted.
"""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from app.api.auth import AuthTelemetry, KubeReviewer
from app.config import Settings
from app.kube.client import KubeClient
from kubesim.apiserver.http.authn import TokenRegistry
from tests.support.auth_rig import ALICE_TOKEN, PROM_TOKEN, ApiServer, bearer, protected_app


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_scraper_allowed_before_an_outage_keeps_scraping_for_the_grace_then_gets_503(
    kube: KubeClient, api_server: ApiServer
) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(kube, cache_seconds=30, outage_grace_seconds=120, clock=clock)
    app = protected_app(reviewer)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://exporter") as http:
        assert (await http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
        await api_server.stop()
        clock.now += 31  # the cached decision has expired, the API server is down
        during = await http.get("/metrics", headers=bearer(PROM_TOKEN))
        assert during.status_code == 200, during.text
        assert reviewer.stats.outage_grace == 1
        assert reviewer.stats.api_errors == 1  # it did ask: the grace is used only when asking fails
        clock.now += 118  # 149 s after the decision: still within 30 + 120
        assert (await http.get("/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
        clock.now += 2  # past the grace
        after = await http.get("/metrics", headers=bearer(PROM_TOKEN))
        assert after.status_code == 503
        assert after.json()["reason"] == "ServiceUnavailable"
        assert reviewer.stats.outage_grace == 2


async def test_the_grace_covers_only_the_path_the_identity_was_allowed_on(
    kube: KubeClient, api_server: ApiServer
) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(kube, cache_seconds=30, outage_grace_seconds=300, clock=clock)
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).allowed
    await api_server.stop()
    clock.now += 60
    assert (await reviewer.review(PROM_TOKEN, "/debug/snapshot")).status == 503
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).allowed


async def test_denials_are_never_extended(kube: KubeClient, api_server: ApiServer) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(
        kube, cache_seconds=30, deny_cache_seconds=5, outage_grace_seconds=300, clock=clock
    )
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).status == 403
    await api_server.stop()
    clock.now += 6  # the denial has expired: unknown now, not allowed
    assert (await reviewer.review(ALICE_TOKEN, "/metrics")).status == 503
    assert reviewer.stats.outage_grace == 0


async def test_a_revocation_the_api_answered_ends_the_grace(
    kube: KubeClient, api_server: ApiServer, registry: TokenRegistry
) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(kube, cache_seconds=30, outage_grace_seconds=300, clock=clock)
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).allowed
    registry.rules.clear()  # the RoleBinding is removed
    clock.now += 31
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).status == 403  # the API said so
    await api_server.stop()
    clock.now += 6
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).status == 503
    assert reviewer.stats.outage_grace == 0


async def test_no_grace_when_it_is_zero(kube: KubeClient, api_server: ApiServer) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(kube, cache_seconds=30, outage_grace_seconds=0, clock=clock)
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).allowed
    await api_server.stop()
    clock.now += 31
    assert (await reviewer.review(PROM_TOKEN, "/metrics")).status == 503


async def test_its_use_is_exported(kube: KubeClient, api_server: ApiServer) -> None:
    clock = FakeClock()
    reviewer = KubeReviewer(kube, cache_seconds=30, outage_grace_seconds=60, clock=clock)
    await reviewer.review(PROM_TOKEN, "/metrics")
    await api_server.stop()
    clock.now += 31
    await reviewer.review(PROM_TOKEN, "/metrics")
    registry = CollectorRegistry()
    registry.register(AuthTelemetry(reviewer.stats))
    assert b"trainer_metrics_auth_outage_grace_total 1.0" in generate_latest(registry)


def test_the_setting_is_bounded_and_on_by_default() -> None:
    assert Settings().auth_outage_grace_seconds == 300
    field = Settings.model_fields["auth_outage_grace_seconds"]
    bounds = {type(m).__name__: m for m in field.metadata}
    assert bounds["Ge"].ge == 0 and bounds["Le"].le == 3600


async def test_head_is_authorized_as_get(kube: KubeClient) -> None:
    # The scraper's RBAC grants "get" on /metrics: a HEAD of it (curl -I, a load balancer's check) is the
    # same read, less the body, and must not need a "head" verb nobody grants.
    app = protected_app(KubeReviewer(kube, cache_seconds=30))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://exporter") as http:
        head = await http.head("/metrics", headers=bearer(PROM_TOKEN))
        assert head.status_code == 200, head.text
        assert head.content == b""
        assert (await http.head("/metrics", headers=bearer(ALICE_TOKEN))).status_code == 403
