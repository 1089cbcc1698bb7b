"""Informer pieces without a network: backoff, line decoding (typed vs tolerant), relist diffs, telemetry."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import orjson
import pytest
from prometheus_client import CollectorRegistry

from app.kube.backoff import Backoff
from app.kube.informer import Informer, InformerOptions, _WatchStop
from app.kube.informer_telemetry import InformerTelemetry
from app.kube.resources import ResourceKind

THINGS = ResourceKind("example.com", "v1", "things", "Thing", namespaced=True)


# --- test projector ------------------------------------------------------------------------------


class Meta(msgspec.Struct):
    name: str
    uid: str
    namespace: str = ""
    resourceVersion: str = ""


class Spec(msgspec.Struct):
    value: int = 0


class Wire(msgspec.Struct):
    metadata: Meta
    spec: Spec | None = None


class Thing(msgspec.Struct, frozen=True):
    key: str
    uid: str
    resource_version: str
    value: int | None


class Projector:
    wire_type: type = Wire

    def __init__(self) -> None:
        self.typed = 0
        self.tolerant = 0

    def from_wire(self, wire: Any) -> Thing:
        self.typed += 1
        w: Wire = wire
        m = w.metadata
        key = f"{m.namespace}/{m.name}" if m.namespace else m.name
        return Thing(key, m.uid, m.resourceVersion, w.spec.value if w.spec else 0)

    def from_json(self, obj: Any) -> Thing | None:
        self.tolerant += 1
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            return None
        name, uid, ns = meta.get("name"), meta.get("uid"), meta.get("namespace") or ""
        if not isinstance(name, str) or not name or not isinstance(uid, str):
            return None
        spec = obj.get("spec")
        value = spec.get("value") if isinstance(spec, dict) else None
        return Thing(
            f"{ns}/{name}" if ns else name,
            uid,
            str(meta.get("resourceVersion", "")),
            value if isinstance(value, int) else None,
        )


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on: set[str] = set()

    def on_added(self, obj: Thing, initial: bool) -> None:
        self.calls.append(("added", obj.key, obj.resource_version, initial))
        if obj.key in self.fail_on:
            raise RuntimeError("handler bug")

    def on_updated(self, old: Thing, new: Thing) -> None:
        self.calls.append(("updated", new.key, old.resource_version, new.resource_version))
        if new.key in self.fail_on:
            raise RuntimeError("handler bug")

    def on_deleted(self, last: Thing) -> None:
        self.calls.append(("deleted", last.key, last.resource_version))


def obj(name: str, rv: int, *, uid: str | None = None, value: Any = 1, ns: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Thing",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
            "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"value": value},
    }


def line(etype: str, o: Any) -> bytes:
    return orjson.dumps({"type": etype, "object": o})


def make(telemetry: InformerTelemetry | None = None) -> tuple[Informer[Thing], Projector, Recorder]:
    p, r = Projector(), Recorder()
    inf: Informer[Thing] = Informer(
        cast(Any, None), THINGS, None, p, r, options=InformerOptions(), telemetry=telemetry
    )
    return inf, p, r


def page(items: list[dict[str, Any]], rv: int, cont: str = "") -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "example.com/v1",
            "kind": "ThingList",
            "metadata": {"resourceVersion": str(rv), "continue": cont},
            "items": items,
        }
    )


def replace(inf: Informer[Thing], body: bytes) -> None:
    items: dict[str, Thing] = {}
    unusable: set[str] = set()
    rv, _ = inf._decode_page(body, items, unusable)
    inf._replace(items, rv, unusable)


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


def test_typed_fast_path_skips_the_tolerant_decoder() -> None:
    inf, p, r = make()
    inf._process_line(line("ADDED", obj("a", 10)))
    inf._process_line(memoryview(b"  " + line("MODIFIED", obj("a", 11, value=2)))[2:])
    assert (p.typed, p.tolerant) == (2, 0)
    assert r.calls == [("added", "ns/a", "10", False), ("updated", "ns/a", "10", "11")]
    assert inf.get("ns/a") == Thing("ns/a", "uid-a", "11", 2)
    assert inf.resource_version == "11"
    assert (inf.counters.added, inf.counters.modified) == (1, 1)


def test_typed_failure_falls_back_to_tolerant_projection() -> None:
    inf, p, r = make()
    inf._process_line(line("ADDED", obj("a", 10, value="not-an-int")))
    assert p.tolerant == 1
    assert inf.get("ns/a") == Thing("ns/a", "uid-a", "10", None)
    assert r.calls == [("added", "ns/a", "10", False)]
    assert inf.counters.skipped["malformed"] == 0


def test_unusable_objects_and_lines_are_skipped_counted_and_rv_advances(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inf, _, r = make()
    no_name = {"metadata": {"namespace": "ns", "resourceVersion": "12"}}
    inf._process_line(line("ADDED", no_name))
    inf._process_line(line("ADDED", no_name))
    inf._process_line(b"this is not json")
    inf._process_line(b'["a list"]')
    inf._process_line(line("SURPRISE", obj("a", 13)))
    inf._process_line(
        line("MODIFIED", {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "14"}})
    )
    inf._process_line(
        line("MODIFIED", {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "14"}})
    )
    assert r.calls == []
    assert inf.counters.skipped["malformed"] == 7
    assert inf.resource_version == "14"  # a skipped object is not replayed on the next watch
    # Logged once per (key, rv), not per occurrence.
    assert sum("ns/b" in rec.getMessage() for rec in caplog.records) == 1


def test_event_semantics_follow_the_cache_not_the_event_type() -> None:
    inf, _, r = make()
    inf._process_line(line("MODIFIED", obj("a", 10)))  # unknown key -> add
    inf._process_line(line("ADDED", obj("a", 11)))  # known key -> update
    inf._process_line(line("ADDED", obj("a", 11)))  # same RV again -> nothing
    inf._process_line(line("DELETED", obj("zz", 12)))  # unknown key -> nothing
    inf._process_line(line("MODIFIED", obj("a", 13, uid="uid-a2")))  # recreated -> delete + add
    inf._process_line(line("DELETED", obj("a", 14, uid="uid-a2")))
    assert r.calls == [
        ("added", "ns/a", "10", False),
        ("updated", "ns/a", "10", "11"),
        ("deleted", "ns/a", "11"),
        ("added", "ns/a", "13", False),
        ("deleted", "ns/a", "14"),  # the event's object: RV is the deletion RV
    ]
    assert len(inf) == 0 and inf.resource_version == "14"


def test_deleted_with_unusable_object_reports_cached_state() -> None:
    inf, _, r = make()
    inf._process_line(line("ADDED", obj("a", 10)))
    inf._process_line(
        line("DELETED", {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "11"}})
    )
    assert r.calls[-1] == ("deleted", "ns/a", "10")
    assert len(inf) == 0 and inf.resource_version == "11"


def test_bookmark_only_moves_rv_and_error_events_stop_the_watch() -> None:
    inf, _, r = make()
    inf._process_line(line("BOOKMARK", {"kind": "Thing", "metadata": {"resourceVersion": "99"}}))
    assert inf.resource_version == "99" and r.calls == [] and inf.counters.bookmark == 1
    with pytest.raises(_WatchStop) as stop:
        inf._process_line(
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
    assert (stop.value.reason, stop.value.relist, stop.value.fresh) == ("expired", "expired", True)
    with pytest.raises(_WatchStop) as stop2:
        inf._process_line(line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}))
    assert (stop2.value.relist, stop2.value.fresh, stop2.value.backoff) == ("watch_error", False, True)
    assert inf.counters.error == 2


def test_handler_exceptions_are_contained() -> None:
    inf, _, r = make()
    r.fail_on.add("ns/a")
    inf._process_line(line("ADDED", obj("a", 10)))
    inf._process_line(line("MODIFIED", obj("a", 11)))
    inf._process_line(line("ADDED", obj("b", 12)))
    assert inf.counters.skipped["handler_error"] == 2
    assert inf.get("ns/a") is not None and inf.get("ns/b") is not None


# --- relist diff ------------------------------------------------------------------------------------


def test_relist_diffs_against_the_cache() -> None:
    inf, p, r = make()
    replace(inf, page([obj("a", 1), obj("b", 2), obj("c", 3)], 5))
    assert r.calls == [("added", f"ns/{k}", str(i), True) for i, k in enumerate("abc", 1)]
    assert inf.synced and inf.resource_version == "5" and p.tolerant == 0
    r.calls.clear()
    # During a gap: a unchanged, b modified, c deleted, d created, e created+deleted (never seen),
    # f is malformed in the list -> unseen; a recreated object would change its uid.
    replace(inf, page([obj("a", 1), obj("b", 7), obj("d", 8)], 9))
    assert r.calls == [("updated", "ns/b", "2", "7"), ("added", "ns/d", "8", False), ("deleted", "ns/c", "3")]
    r.calls.clear()
    replace(inf, page([obj("a", 10, uid="new-a"), obj("b", 7), obj("d", 8)], 11))
    assert r.calls == [("deleted", "ns/a", "1"), ("added", "ns/a", "10", False)]
    assert inf.keys() == ["ns/a", "ns/b", "ns/d"]


def test_relist_keeps_last_good_state_of_an_unusable_item() -> None:
    inf, p, r = make()
    replace(inf, page([obj("a", 1), obj("b", 2)], 5))
    r.calls.clear()
    broken_b = {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "6"}}  # no uid
    replace(inf, page([obj("a", 1), broken_b, {"metadata": {}}], 7))
    assert r.calls == []  # b is not reported deleted; the nameless item is dropped
    assert inf.get("ns/b") == Thing("ns/b", "uid-b", "2", 1)
    assert inf.counters.skipped["malformed"] == 2
    assert p.tolerant >= 2


def test_list_page_typed_decoding_and_garbage() -> None:
    inf, p, _ = make()
    items: dict[str, Thing] = {}
    rv, cont = inf._decode_page(page([obj("a", 1)], 5, cont="tok"), items, set())
    assert (rv, cont, list(items), p.tolerant) == ("5", "tok", ["ns/a"], 0)
    rv, cont = inf._decode_page(b'{"metadata":{"resourceVersion":"6"},"items":null}', items, set())
    assert (rv, cont) == ("6", "")
    from app.kube.client import ApiError

    with pytest.raises(ApiError):
        inf._decode_page(b"<html>oops</html>", items, set())


# --- telemetry -------------------------------------------------------------------------------------


def test_telemetry_collects_plain_counters() -> None:
    registry = CollectorRegistry()
    telemetry = InformerTelemetry(registry)
    inf, _, _r = make(telemetry)
    replace(inf, page([obj("a", 1)], 5))
    inf._process_line(line("ADDED", obj("b", 6)))
    inf._process_line(b"junk")
    inf.counters.relists["expired"] += 1
    labels = {"informer": "things"}
    assert registry.get_sample_value("trainer_metrics_informer_synced", labels) == 1
    assert registry.get_sample_value("trainer_metrics_informer_objects", labels) == 2
    assert (
        registry.get_sample_value("trainer_metrics_informer_events_total", {**labels, "type": "ADDED"}) == 1
    )
    assert (
        registry.get_sample_value("trainer_metrics_informer_relists_total", {**labels, "reason": "expired"})
        == 1
    )
    assert (
        registry.get_sample_value(
            "trainer_metrics_informer_skipped_objects_total", {**labels, "reason": "malformed"}
        )
        == 1
    )
    assert registry.get_sample_value("trainer_metrics_informer_stale", labels) == 0
    age = registry.get_sample_value("trainer_metrics_informer_last_event_age_seconds", labels)
    assert age is not None and 0 <= age < 5
    with pytest.raises(ValueError):
        make(telemetry)  # the same informer name twice
    telemetry.unregister("things")
    assert registry.get_sample_value("trainer_metrics_informer_synced", labels) is None


def test_informer_name_and_options_from_settings() -> None:
    from app.config import Settings

    s = Settings(
        watch_timeout_min_seconds=10, watch_timeout_max_seconds=20, list_page_size=7, leader_election=False
    )
    o = InformerOptions.from_settings(s)
    assert (o.page_size, o.watch_timeout_range, o.max_object_bytes) == (7, (10, 20), s.max_object_bytes)
    p, r = Projector(), Recorder()
    assert Informer(cast(Any, None), THINGS, "team1", p, r).name == "things/team1"
    cluster = ResourceKind("example.com", "v1", "globals", "Global", namespaced=False)
    assert Informer(cast(Any, None), cluster, "team1", p, r).name == "globals"


def test_a_handler_is_told_around_a_relist_diff_with_the_rv_held_before_the_gap() -> None:
    inf, _, r = make()
    relists: list[int | None] = []

    def on_relist(since: int | None) -> None:
        relists.append(since)
        r.calls.append(("relist", since))

    r.on_relist = on_relist  # type: ignore[attr-defined]
    replace(inf, page([obj("a", 1)], 5))
    assert relists == []  # the initial list is not a relist
    replace(inf, page([obj("a", 1), obj("d", 8)], 9))
    assert r.calls[-3:] == [("relist", 5), ("added", "ns/d", "8", False), ("relist", None)]
