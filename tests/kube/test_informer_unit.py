"""The informer through its real list/watch loop over a fake client (tests/support/informer_fakes.py): line
decoding (typed vs tolerant), event semantics, ERROR and BOOKMARK lines, relists, telemetry; plus backoff and
the LIST page decoder as units.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from app.kube.backoff import Backoff
from app.kube.client import ApiError
from app.kube.decode import Decoder
from app.kube.informer import Informer
from app.kube.informer_telemetry import InformerTelemetry
from app.kube.ingest import watch_error_stop
from app.kube.reflector import api_error_stop
from app.kube.resources import ResourceKind
from app.replica.informer_options import informer_options
from tests.support.informer_fakes import (
    THINGS,
    FakeClient,
    Projector,
    Recorder,
    Thing,
    obj,
    running,
)
from tests.support.informer_rig import FAST, Rig, line, page


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = Rig()
    async with running(r.informer):
        await r.start()
        yield r


# --- backoff ---------------------------------------------------------------------------------------


def test_backoff_grows_caps_and_resets_after_quiet_period() -> None:
    now = [0.0]
    b = Backoff(0.8, 30.0, clock=lambda: now[0], rng=lambda: 1.0)
    delays = [b.next_delay() for _ in range(8)]
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    now[0] += 119
    assert b.next_delay() == 30.0  # failures keep coming: stay at the cap
    now[0] += 121
    assert b.next_delay() == 0.8  # two quiet minutes: start small again


def test_backoff_full_jitter_and_validation() -> None:
    b = Backoff(1.0, 8.0, rng=lambda: 0.25)
    assert [b.next_delay() for _ in range(3)] == [0.25, 0.5, 1.0]
    b.reset()
    assert b.step == 1.0
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)


# --- decoding --------------------------------------------------------------------------------------


async def test_typed_fast_path_skips_the_tolerant_decoder(rig: Rig) -> None:
    # One chunk: the second line reaches the decoder as a memoryview at an offset into it.
    await rig.lines(line("ADDED", obj("a", 10)), line("MODIFIED", obj("a", 11, value=2)), one_chunk=True)
    inf, p, r = rig.informer, rig.projector, rig.recorder
    assert (p.typed, p.tolerant) == (2, 0)
    assert r.calls == [("added", "ns/a", "10", False), ("updated", "ns/a", "10", "11")]
    assert inf.get("ns/a") == Thing("ns/a", "uid-a", "11", 2)
    assert inf.resource_version == "11"
    assert (inf.counters.added, inf.counters.modified) == (1, 1)


async def test_typed_failure_falls_back_to_tolerant_projection(rig: Rig) -> None:
    await rig.lines(line("ADDED", obj("a", 10, value="not-an-int")))
    inf, p, r = rig.informer, rig.projector, rig.recorder
    assert p.tolerant == 1
    assert inf.get("ns/a") == Thing("ns/a", "uid-a", "10", None)
    assert r.calls == [("added", "ns/a", "10", False)]
    assert inf.counters.skipped["malformed"] == 0


async def test_unusable_objects_and_lines_are_skipped_counted_and_rv_advances(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    no_name = {"metadata": {"namespace": "ns", "resourceVersion": "12"}}
    unnamed_b = {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "14"}}  # no uid
    await rig.lines(
        line("ADDED", no_name),
        line("ADDED", no_name),
        b"this is not json",
        b'["a list"]',
        line("SURPRISE", obj("a", 13)),
        line("MODIFIED", unnamed_b),
        line("MODIFIED", unnamed_b),
    )
    inf = rig.informer
    assert rig.recorder.calls == []
    assert inf.counters.skipped["malformed"] == 7
    assert inf.resource_version == "14"  # a skipped object is not replayed on the next watch
    # Logged once per (key, rv), not per occurrence.
    assert sum("ns/b" in rec.getMessage() for rec in caplog.records) == 1


async def test_event_semantics_follow_the_cache_not_the_event_type(rig: Rig) -> None:
    await rig.lines(
        line("MODIFIED", obj("a", 10)),  # unknown key -> add
        line("ADDED", obj("a", 11)),  # known key -> update
        line("ADDED", obj("a", 11)),  # same RV again -> nothing
        line("DELETED", obj("zz", 12)),  # unknown key -> nothing
        line("MODIFIED", obj("a", 13, uid="uid-a2")),  # recreated -> delete + add
        line("DELETED", obj("a", 14, uid="uid-a2")),
    )
    assert rig.recorder.calls == [
        ("added", "ns/a", "10", False),
        ("updated", "ns/a", "10", "11"),
        ("deleted", "ns/a", "11"),
        ("added", "ns/a", "13", False),
        ("deleted", "ns/a", "14"),  # the event's object: RV is the deletion RV
    ]
    assert len(rig.informer) == 0 and rig.informer.resource_version == "14"


async def test_deleted_with_unusable_object_reports_cached_state(rig: Rig) -> None:
    await rig.lines(line("ADDED", obj("a", 10)))
    await rig.lines(line("DELETED", {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "11"}}))
    assert rig.recorder.calls[-1] == ("deleted", "ns/a", "10")
    assert len(rig.informer) == 0 and rig.informer.resource_version == "11"


async def test_bookmark_only_moves_rv_and_error_events_stop_the_watch(rig: Rig) -> None:
    inf, client = rig.informer, rig.client
    await rig.lines(line("BOOKMARK", {"kind": "Thing", "metadata": {"resourceVersion": "99"}}))
    assert inf.resource_version == "99" and rig.recorder.calls == [] and inf.counters.bookmark == 1
    # 410: the watch ends, and the relist is a consistent read (the RV we hold is too old).
    client.add_list(page([], 120))
    await rig.lines(
        line(
            "ERROR",
            {
                "kind": "Status",
                "code": 410,
                "reason": "Expired",
                "message": "too old resource version: 1 (5)",
            },
        )
    )
    assert (inf.counters.watch_restarts["expired"], inf.counters.relists["expired"]) == (1, 1)
    assert "resourceVersion" not in client.list_queries()[-1]
    # Any other ERROR: the watch ends too, with a backoff and a relist from the RV we hold.
    rig.stream = client.add_watch()
    await rig.lines(line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}))
    assert (inf.counters.watch_restarts["error"], inf.counters.relists["watch_error"]) == (1, 1)
    assert client.list_queries()[-1]["resourceVersion"] == "120"
    assert inf.counters.error == 2


def test_what_an_error_event_or_a_failed_watch_request_means() -> None:
    expired = watch_error_stop({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    assert (expired.reason, expired.relist, expired.fresh) == ("expired", "expired", True)
    other = watch_error_stop({"kind": "Status", "code": 500, "reason": "InternalError"})
    assert (other.relist, other.fresh, other.backoff) == ("watch_error", False, True)
    too_large = watch_error_stop({"code": 504, "message": "Timeout: Too large resource version: 9"})
    assert (too_large.relist, too_large.fresh) == ("watch_error", True)
    assert watch_error_stop("not a Status").reason == "error"
    throttled = api_error_stop(ApiError(429, "TooManyRequests", "slow down", retry_after=3600))
    assert (throttled.reason, throttled.relist, throttled.backoff, throttled.retry_after) == (
        "throttled",
        None,
        True,
        60.0,  # capped
    )
    assert api_error_stop(ApiError(0, "ClientConnectorError", "refused")).reason == "refused"
    gone = api_error_stop(ApiError(410, "Gone", "gone"))
    assert (gone.relist, gone.fresh) == ("expired", True)


async def test_handler_exceptions_are_contained(rig: Rig) -> None:
    rig.recorder.fail_on.add("ns/a")
    await rig.lines(line("ADDED", obj("a", 10)), line("MODIFIED", obj("a", 11)), line("ADDED", obj("b", 12)))
    inf = rig.informer
    assert inf.counters.skipped["handler_error"] == 2
    assert inf.get("ns/a") is not None and inf.get("ns/b") is not None


# --- relist diff ------------------------------------------------------------------------------------


async def test_relist_diffs_against_the_cache() -> None:
    rig = Rig()
    inf, p, r = rig.informer, rig.projector, rig.recorder
    async with running(inf):
        await rig.start(page([obj("a", 1), obj("b", 2), obj("c", 3)], 5))
        assert r.calls == [("added", f"ns/{k}", str(i), True) for i, k in enumerate("abc", 1)]
        assert inf.synced and inf.resource_version == "5" and p.tolerant == 0
        r.calls.clear()
        # During a gap: a unchanged, b modified, c deleted, d created, e created+deleted (never seen),
        # f is malformed in the list -> unseen; a recreated object would change its uid.
        await rig.relist(page([obj("a", 1), obj("b", 7), obj("d", 8)], 9))
        assert r.calls == [
            ("updated", "ns/b", "2", "7"),
            ("added", "ns/d", "8", False),
            ("deleted", "ns/c", "3"),
        ]
        r.calls.clear()
        await rig.relist(page([obj("a", 10, uid="new-a"), obj("b", 7), obj("d", 8)], 11))
        assert r.calls == [("deleted", "ns/a", "1"), ("added", "ns/a", "10", False)]
        assert inf.keys() == ["ns/a", "ns/b", "ns/d"]


async def test_relist_keeps_last_good_state_of_an_unusable_item() -> None:
    rig = Rig()
    inf, p, r = rig.informer, rig.projector, rig.recorder
    async with running(inf):
        await rig.start(page([obj("a", 1), obj("b", 2)], 5))
        r.calls.clear()
        broken_b = {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "6"}}  # no uid
        await rig.relist(page([obj("a", 1), broken_b, {"metadata": {}}], 7))
        assert r.calls == []  # b is not reported deleted; the nameless item is dropped
        assert inf.get("ns/b") == Thing("ns/b", "uid-b", "2", 1)
        assert inf.counters.skipped["malformed"] == 2
        assert p.tolerant >= 2


async def test_a_handler_is_told_around_a_relist_diff_with_the_rv_held_before_the_gap() -> None:
    rig = Rig()
    r = rig.recorder
    relists: list[int | None] = []

    def on_relist(since: int | None) -> None:
        relists.append(since)
        r.calls.append(("relist", since))

    r.on_relist = on_relist  # type: ignore[attr-defined]
    async with running(rig.informer):
        await rig.start(page([obj("a", 1)], 5))
        assert relists == []  # the initial list is not a relist
        await rig.relist(page([obj("a", 1), obj("d", 8)], 9))
        assert r.calls[-3:] == [("relist", 5), ("added", "ns/d", "8", False), ("relist", None)]


# --- LIST page decoding -----------------------------------------------------------------------------


def test_list_page_typed_decoding_and_garbage() -> None:
    p = Projector()
    decoder: Decoder[Thing] = Decoder(p)
    skipped: list[tuple[str, str | None, str]] = []

    def decode(body: bytes, items: dict[str, Thing], unusable: set[str]) -> tuple[str, str]:
        return decoder.page(body, {}, items, unusable, lambda *skip: skipped.append(skip))

    items: dict[str, Thing] = {}
    rv, cont = decode(page([obj("a", 1)], 5, cont="tok"), items, set())
    assert (rv, cont, list(items), p.tolerant) == ("5", "tok", ["ns/a"], 0)
    rv, cont = decode(b'{"metadata":{"resourceVersion":"6"},"items":null}', items, set())
    assert (rv, cont) == ("6", "")
    with pytest.raises(ApiError):
        decode(b"<html>oops</html>", items, set())
    unusable: set[str] = set()
    decode(page([{"metadata": {"name": "x", "namespace": "ns", "resourceVersion": "7"}}], 8), items, unusable)
    assert unusable == {"ns/x"} and skipped == [("malformed", "ns/x", "7")]


async def test_a_list_that_is_not_json_is_retried_not_applied() -> None:
    rig = Rig()
    async with running(rig.informer):
        rig.client.add_list(b"<html>oops</html>")
        await rig.start(page([obj("a", 1)], 5))
        assert rig.recorder.calls == [("added", "ns/a", "1", True)] and len(rig.client.list_queries()) == 2


# --- telemetry -------------------------------------------------------------------------------------


async def test_telemetry_collects_plain_counters() -> None:
    registry = CollectorRegistry()
    now = [1000.0]
    telemetry = InformerTelemetry(registry, clock=lambda: now[0])
    rig = Rig(telemetry=telemetry, clock=lambda: now[0])
    async with running(rig.informer):
        await rig.start(page([obj("a", 1)], 5))
        await rig.lines(line("ADDED", obj("b", 6)), b"junk")
        rig.informer.counters.relists["expired"] += 1
        now[0] += 2.5
        labels = {"informer": "things"}
        assert registry.get_sample_value("trainer_metrics_informer_synced", labels) == 1
        assert registry.get_sample_value("trainer_metrics_informer_objects", labels) == 2
        assert (
            registry.get_sample_value("trainer_metrics_informer_events_total", {**labels, "type": "ADDED"})
            == 1
        )
        assert (
            registry.get_sample_value(
                "trainer_metrics_informer_relists_total", {**labels, "reason": "expired"}
            )
            == 1
        )
        assert (
            registry.get_sample_value(
                "trainer_metrics_informer_skipped_objects_total", {**labels, "reason": "malformed"}
            )
            == 1
        )
        assert registry.get_sample_value("trainer_metrics_informer_stale", labels) == 0
        assert registry.get_sample_value("trainer_metrics_informer_last_event_age_seconds", labels) == 2.5
        now[0] += FAST.inactivity_timeout  # nothing received since: stale, by the injected clock
        assert registry.get_sample_value("trainer_metrics_informer_stale", labels) == 1
        with pytest.raises(ValueError):
            Rig(telemetry=telemetry)  # the same informer name twice
        telemetry.unregister("things")
        assert registry.get_sample_value("trainer_metrics_informer_synced", labels) is None


async def test_failed_lists_are_counted_as_sync_failures() -> None:
    registry = CollectorRegistry()
    rig = Rig(telemetry=InformerTelemetry(registry))
    labels = {"informer": "things"}
    async with running(rig.informer):
        rig.client.add_list(ApiError(500, "InternalError", "etcd unavailable"))
        rig.client.add_list(ApiError(0, "ClientConnectorError", "refused"))
        await rig.start(page([obj("a", 1)], 5))
        assert rig.informer.synced

        def failures(method: str) -> float | None:
            return registry.get_sample_value(
                "trainer_metrics_informer_sync_failures_total", {**labels, "method": method}
            )

        assert (failures("list"), failures("streaming")) == (2, 0)
        assert registry.get_sample_value("trainer_metrics_informer_streaming_list", labels) == 0


def test_informer_name_and_options_from_settings() -> None:
    from app.config import Settings

    s = Settings(
        watch_timeout_min_seconds=10,
        watch_timeout_max_seconds=20,
        list_page_size=7,
        leader_election=False,
        streaming_list="auto",
        initial_events_timeout_seconds=45,
    )
    o = informer_options(s)
    assert (o.page_size, o.watch_timeout_range, o.max_object_bytes) == (7, (10, 20), s.max_object_bytes)
    assert (o.streaming_list, o.initial_events_timeout) == (None, 45)
    p, r = Projector(), Recorder()
    assert Informer(FakeClient(), THINGS, "team1", p, r).name == "things/team1"
    cluster = ResourceKind("example.com", "v1", "globals", "Global", namespaced=False)
    assert Informer(FakeClient(), cluster, "team1", p, r).name == "globals"
