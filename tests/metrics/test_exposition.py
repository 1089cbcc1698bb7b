"""MetricsExposition: negotiation, gzip, leader-only Trainer part; SelfTelemetry."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from app.handover.journal import CountJournal
from app.metrics import exposition as exposition_module
from app.metrics.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    MetricsExposition,
    accepts_gzip,
    wants_openmetrics,
)
from app.metrics.telemetry import Limit, SelfTelemetry
from app.metrics.trainer_metrics import TrainerMetricState

from .helpers import REF, created, finished, value

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


@pytest.fixture
def setup() -> tuple[MetricsExposition, TrainerMetricState, SelfTelemetry]:
    telemetry = SelfTelemetry()
    state = TrainerMetricState()
    state.on_countable(created(1, nodes=4))
    state.on_countable(finished(2, lifetime=100.0))
    state.on_jobs_gauge(("team-a", REF, "running"), 2)
    return MetricsExposition(telemetry.registry), state, telemetry


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),
        ("", False),
        ("text/plain", False),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text; version=1.0.0; charset=utf-8", True),
        ("application/openmetrics-text;version=0.0.1", False),
        ("application/openmetrics-text;q=0", False),
        (PROMETHEUS_ACCEPT, True),
        # By q-value (prometheus_client's choose_encoder takes any OpenMetrics item): text is preferred here.
        ("text/plain;version=0.0.4;q=0.9, application/openmetrics-text;q=0.1", False),
        ("text/plain;version=0.0.4;q=0.1, application/openmetrics-text;q=0.9", True),
    ],
)
def test_wants_openmetrics(accept: str | None, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        (None, False),
        ("", False),
        ("identity", False),
        ("gzip", True),
        ("br, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("deflate, GZIP", True),
        ("x-gzip", True),
    ],
)
def test_accepts_gzip(encoding: str | None, expected: bool) -> None:
    assert accepts_gzip(encoding) is expected


def test_follower_exports_only_self_telemetry(
    setup: tuple[MetricsExposition, TrainerMetricState, SelfTelemetry],
) -> None:
    exposition, state, _ = setup
    body, headers = exposition.build_metrics_response(None, None)
    assert headers["Content-Type"] == CONTENT_TYPE_TEXT and "Content-Encoding" not in headers
    assert b"kubeflow_trainer_" not in body
    assert value(body, "trainer_metrics_leader") == 0.0
    exposition.set_trainer_source(state)
    body, _ = exposition.build_metrics_response(None, None)
    assert body.startswith(state.render_text())
    assert value(body, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 1.0
    exposition.set_trainer_source(None)  # stop leading: gone from the very next scrape
    assert b"kubeflow_trainer_" not in exposition.build_metrics_response(None, "gzip")[0]
    assert b"kubeflow_trainer_" not in gzip.decompress(exposition.build_metrics_response(None, "gzip")[0])


def test_text_body_parses_and_has_unique_families(
    setup: tuple[MetricsExposition, TrainerMetricState, SelfTelemetry],
) -> None:
    exposition, state, _ = setup
    exposition.set_trainer_source(state)
    body, _ = exposition.build_metrics_response("text/plain", None)
    names = [f.name for f in text_string_to_metric_families(body.decode())]
    assert len(names) == len(set(names))
    assert "kubeflow_trainer_trainjob_lifetime_seconds" in names and "process_cpu_seconds" in names


def test_openmetrics_body_parses_with_one_eof(
    setup: tuple[MetricsExposition, TrainerMetricState, SelfTelemetry],
) -> None:
    exposition, state, _ = setup
    exposition.set_trainer_source(state)
    for encoding in (None, "gzip"):
        body, headers = exposition.build_metrics_response(PROMETHEUS_ACCEPT, encoding)
        if encoding:
            body = gzip.decompress(body)
        assert headers["Content-Type"] == CONTENT_TYPE_OPENMETRICS
        assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1
        fams = {f.name: f for f in parse_openmetrics(body.decode())}
        assert fams["kubeflow_trainer_trainjob_created"].type == "counter"
        assert fams["trainer_metrics_leader"].type == "gauge"


def test_gzip_is_one_valid_member_and_reuses_the_trainer_segment(
    setup: tuple[MetricsExposition, TrainerMetricState, SelfTelemetry],
) -> None:
    exposition, state, telemetry = setup
    exposition.set_trainer_source(state)
    plain, _ = exposition.build_metrics_response(None, None)
    body, headers = exposition.build_metrics_response(None, "gzip, deflate")
    assert headers["Content-Encoding"] == "gzip"
    # One member, strict decoders (zlib with gzip wrapper; what httpx and Go use) read all of it.
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
    unpacked = decoder.decompress(body) + decoder.flush()
    assert decoder.eof and decoder.unused_data == b""
    assert unpacked.startswith(state.render_text()) and unpacked.count(b"kubeflow_trainer_trainjobs{") == 1
    assert len(body) < len(plain) / 3
    # Unchanged Trainer text: the cached segment is reused; the self part still changes.
    telemetry.limit_hit("object_too_large")
    again = gzip.decompress(exposition.build_metrics_response(None, "gzip")[0])
    assert value(again, "trainer_metrics_limit_hits_total", limit="object_too_large") == 1.0
    # A change invalidates it.
    state.on_countable(created(3))
    changed = gzip.decompress(exposition.build_metrics_response(None, "gzip")[0])
    assert (
        value(changed, "kubeflow_trainer_trainjob_created_total", namespace="team-a", runtime_ref=REF) == 2.0
    )


async def test_async_variant_matches_sync(
    setup: tuple[MetricsExposition, TrainerMetricState, SelfTelemetry],
) -> None:
    exposition, state, _ = setup
    exposition.set_trainer_source(state)
    for i in range(3000):  # past the size from which compression moves to a thread
        state.on_jobs_gauge((f"ns-{i}", REF, "running"), 1)
    body, headers = await exposition.build_metrics_response_async(None, "gzip")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body).startswith(state.render_text())
    body, headers = await exposition.build_metrics_response_async("application/openmetrics-text", None)
    assert body.startswith(state.render_openmetrics()) and body.endswith(b"# EOF\n")


async def test_leadership_lost_while_the_trainer_part_is_compressed_serves_no_trainer_metrics(
    setup: tuple[MetricsExposition, TrainerMetricState, SelfTelemetry], monkeypatch: pytest.MonkeyPatch
) -> None:
    exposition, state, _ = setup
    exposition.set_trainer_source(state)
    for i in range(3000):  # past the size from which compression moves to a thread
        state.on_jobs_gauge((f"ns-{i}", REF, "running"), 1)
    entered, release = threading.Event(), threading.Event()
    deflate = exposition_module.deflate

    def held_deflate(parts: Sequence[bytes], level: int) -> Any:
        entered.set()
        release.wait(10)
        return deflate(parts, level)

    monkeypatch.setattr(exposition_module, "deflate", held_deflate)
    building = asyncio.ensure_future(exposition.build_metrics_response_async(None, "gzip"))
    await asyncio.to_thread(entered.wait, 10)
    exposition.set_trainer_source(None)  # stops leading while the thread compresses the leader's text
    release.set()
    body, _ = await building
    text = gzip.decompress(body)
    assert b"kubeflow_trainer_" not in text and b"trainer_metrics_leader" in text


def test_self_telemetry_and_journal_hooks() -> None:
    telemetry = SelfTelemetry()
    state = TrainerMetricState()
    journal = CountJournal(state, journal_size=2, telemetry=telemetry)
    for rv in (1, 2, 3):
        journal.on_countable(created(rv))
    journal.start_leading(1)
    journal.on_countable(created(1))
    journal.stop_leading()
    exposition = MetricsExposition(telemetry.registry)
    body, _ = exposition.build_metrics_response(None, None)
    assert value(body, "trainer_metrics_leader") == 0.0
    assert value(body, "trainer_metrics_leader_transitions_total") == 2.0
    assert value(body, "trainer_metrics_handover_replayed_events_total") == 2.0
    assert value(body, "trainer_metrics_handover_skipped_events_total") == 1.0
    assert value(body, "trainer_metrics_journal_overflow_total") == 2.0
    for limit in Limit:
        assert value(body, "trainer_metrics_limit_hits_total", limit=limit) == 0.0
    assert b'trainer_metrics_build_info{python_version="' in body
    assert b"python_gc_collections_total" in body and b"python_info" in body
    with pytest.raises(ValueError, match="unknown limit"):
        telemetry.limit_hit("nope")
