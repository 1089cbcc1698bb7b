"""Cache: event semantics and relist diffs as a pure unit (no decoding, no I/O)."""

from __future__ import annotations

from app.kube.cache import Cache
from app.kube.informer_telemetry import InformerCounters
from tests.support.informer_fakes import Recorder, Thing


def thing(name: str, rv: int, *, uid: str | None = None, value: int = 1) -> Thing:
    return Thing(f"ns/{name}", uid or f"uid-{name}", str(rv), value)


def items(*things: Thing) -> dict[str, Thing]:
    return {t.key: t for t in things}


def make() -> tuple[Cache[Thing], Recorder, InformerCounters]:
    r, c = Recorder(), InformerCounters()
    return Cache(r, c, name="things"), r, c


def test_events_follow_the_cache_not_the_event_type() -> None:
    cache, r, c = make()
    cache.apply("MODIFIED", thing("a", 10))  # unknown key -> add
    cache.apply("ADDED", thing("a", 11))  # known key -> update
    cache.apply("ADDED", thing("a", 11))  # same RV again -> nothing
    cache.apply("DELETED", thing("zz", 12))  # unknown key -> nothing
    cache.apply("MODIFIED", thing("a", 13, uid="uid-a2"))  # recreated -> delete + add
    cache.apply("DELETED", thing("a", 14, uid="uid-a2"))
    assert r.calls == [
        ("added", "ns/a", "10", False),
        ("updated", "ns/a", "10", "11"),
        ("deleted", "ns/a", "11"),
        ("added", "ns/a", "13", False),
        ("deleted", "ns/a", "14"),  # the event's object: RV is the deletion RV
    ]
    assert cache.store == {} and (c.added, c.modified, c.deleted) == (2, 2, 2)


def test_a_delete_under_another_uid_reports_the_cached_object() -> None:
    cache, r, _ = make()
    cache.apply("ADDED", thing("a", 1))
    cache.apply("DELETED", thing("a", 5, uid="other"))
    assert r.calls[-1] == ("deleted", "ns/a", "1")


def test_discard_reports_the_cached_last_state() -> None:
    cache, r, _ = make()
    cache.apply("ADDED", thing("a", 10))
    assert cache.discard("ns/a") and not cache.discard("ns/a")
    assert r.calls[-1] == ("deleted", "ns/a", "10") and cache.store == {}


def test_relist_diff() -> None:
    cache, r, _ = make()
    cache.replace(items(thing("a", 1), thing("b", 2), thing("c", 3)), set(), initial=True, since=0)
    assert r.calls == [("added", f"ns/{k}", str(i), True) for i, k in enumerate("abc", 1)]
    r.calls.clear()
    a = cache.store["ns/a"]
    # During a gap: a unchanged (the very same projection, reused), b modified, c deleted, d created.
    cache.replace(items(a, thing("b", 7), thing("d", 8)), set(), initial=False, since=5)
    assert r.calls == [("updated", "ns/b", "2", "7"), ("added", "ns/d", "8", False), ("deleted", "ns/c", "3")]
    r.calls.clear()
    cache.replace(
        items(thing("a", 10, uid="new-a"), thing("b", 7), thing("d", 8)), set(), initial=False, since=9
    )
    assert r.calls == [("deleted", "ns/a", "1"), ("added", "ns/a", "10", False)]
    assert list(cache.store) == ["ns/a", "ns/b", "ns/d"]


def test_relist_keeps_the_last_good_state_of_unusable_keys() -> None:
    cache, r, _ = make()
    cache.replace(items(thing("a", 1), thing("b", 2)), set(), initial=True, since=0)
    r.calls.clear()
    cache.replace(items(thing("a", 1)), {"ns/b", "ns/never-seen"}, initial=False, since=5)
    assert r.calls == [] and cache.store["ns/b"] == thing("b", 2) and "ns/never-seen" not in cache.store


def test_on_relist_brackets_the_diff_but_not_the_initial_list() -> None:
    cache, r, _ = make()
    r.on_relist = lambda since: r.calls.append(("relist", since))  # type: ignore[attr-defined]
    cache.replace(items(thing("a", 1)), set(), initial=True, since=0)
    assert r.calls == [("added", "ns/a", "1", True)]
    cache.replace(items(thing("a", 1), thing("d", 8)), set(), initial=False, since=5)
    assert r.calls[1:] == [("relist", 5), ("added", "ns/d", "8", False), ("relist", None)]


def test_on_synced_follows_the_initial_list_only_with_its_resource_version() -> None:
    cache, r, c = make()
    r.on_synced = lambda rv: r.calls.append(("synced", rv))  # type: ignore[attr-defined]
    cache.replace(items(thing("a", 1)), set(), initial=True, since=0, list_rv="40")
    assert r.calls == [("added", "ns/a", "1", True), ("synced", "40")]
    cache.replace(items(thing("a", 1), thing("d", 8)), set(), initial=False, since=40, list_rv="50")
    assert ("synced", "50") not in r.calls

    def broken(rv: str) -> None:
        raise RuntimeError(rv)

    cache, r, c = make()
    r.on_synced = broken  # type: ignore[attr-defined]
    cache.replace(items(thing("a", 1)), set(), initial=True, since=0, list_rv="40")
    assert c.skipped["handler_error"] == 1 and "ns/a" in cache.store


def test_handler_exceptions_are_counted_not_raised() -> None:
    cache, r, c = make()
    r.fail_on.add("ns/a")
    cache.apply("ADDED", thing("a", 1))
    cache.apply("MODIFIED", thing("a", 2))
    cache.replace(items(thing("a", 3)), set(), initial=False, since=2)
    assert c.skipped["handler_error"] == 3 and cache.store["ns/a"] == thing("a", 3)
