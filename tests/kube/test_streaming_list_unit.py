"""The streaming list line by line over the fake client (tests/support/informer_fakes.py): what is collected
before the initial-events-end bookmark, the resourceVersion held meanwhile, unusable objects, an ERROR
inside the initial events, the default (paginated LIST) left as it was."""

from __future__ import annotations

from typing import Any

import orjson

from app.kube.informer import Informer, InformerOptions
from tests.support.informer_fakes import THINGS, FakeClient, Projector, Recorder, Thing, obj, running


def line(etype: str, o: Any) -> bytes:
    return orjson.dumps({"type": etype, "object": o}) + b"\n"


def bookmark(rv: int, *, end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return line("BOOKMARK", {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": meta})


EXPIRED = line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
STREAMING = InformerOptions(backoff_base=0.001, backoff_cap=0.001, streaming_list=True)


class RelistRecorder(Recorder):
    def on_relist(self, since: int | None) -> None:
        self.calls.append(("relist", since))


def informer(client: FakeClient, recorder: Recorder, opts: InformerOptions = STREAMING) -> Informer[Thing]:
    return Informer(client, THINGS, None, Projector(), recorder, options=opts)


async def test_collected_until_the_end_bookmark_then_live() -> None:
    client, rec = FakeClient(), RelistRecorder()
    inf = informer(client, rec)
    async with running(inf):
        stream = client.add_watch(line("ADDED", obj("a", 3)), bookmark(4), line("ADDED", obj("b", 2)))
        await client.idle()
        # Initial events are a list being read: nothing applied, no resume point taken from them.
        assert rec.calls == [] and not inf.synced and len(inf) == 0 and inf.resource_version == ""
        stream.push(bookmark(9, end=True))
        await client.idle()
        assert sorted(rec.calls) == [("added", "ns/a", "3", True), ("added", "ns/b", "2", True)]
        assert inf.synced and inf.resource_version == "9"
        stream.push(line("MODIFIED", obj("a", 10, value=2)), bookmark(11))
        await client.idle()
        assert rec.calls[-1] == ("updated", "ns/a", "3", "10") and inf.resource_version == "11"
    (query,) = client.requests
    assert query["sendInitialEvents"] == "true" and query["resourceVersionMatch"] == "NotOlderThan"
    assert client.list_queries() == []


async def test_relist_diff_with_unusable_object_keeps_its_last_state() -> None:
    client, rec = FakeClient(), RelistRecorder()
    inf = informer(client, rec)
    async with running(inf):
        first = client.add_watch(
            line("ADDED", obj("a", 3)), line("ADDED", obj("b", 4)), line("ADDED", obj("gone", 5))
        )
        first.push(bookmark(6, end=True))
        await client.idle()
        rec.calls.clear()
        first.push(EXPIRED)  # 410: relist from a consistent read
        unusable_b = {**obj("b", 8), "metadata": {**obj("b", 8)["metadata"], "uid": 5}}
        client.add_watch(
            line("ADDED", obj("a", 3)),
            line("ADDED", unusable_b),
            line("ADDED", obj("c", 7)),
            bookmark(9, end=True),
        )
        await client.idle()
        assert rec.calls[0] == ("relist", 6) and rec.calls[-1] == ("relist", None)
        assert sorted(rec.calls[1:-1]) == [("added", "ns/c", "7", False), ("deleted", "ns/gone", "5")]
        got = inf.get("ns/b")
        assert got is not None and got.resource_version == "4"  # the last good state, not deleted
        assert inf.counters.skipped["malformed"] == 1 and inf.resource_version == "9"
    relist = client.watch_queries()[1]
    assert relist["sendInitialEvents"] == "true" and "resourceVersion" not in relist


async def test_error_inside_the_initial_events_drops_what_was_collected() -> None:
    client, rec = FakeClient(), RelistRecorder()
    inf = informer(client, rec)
    async with running(inf):
        client.add_watch(line("ADDED", obj("a", 3)), EXPIRED)
        client.add_watch(line("ADDED", obj("b", 4)), bookmark(5, end=True))
        await client.idle()
        assert rec.calls == [("added", "ns/b", "4", True)] and inf.keys() == ["ns/b"]
        assert inf.synced and inf.resource_version == "5"


async def test_default_is_the_paginated_list() -> None:
    client, rec = FakeClient(), Recorder()
    inf = informer(client, rec, InformerOptions())
    client.add_list(
        orjson.dumps({"metadata": {"resourceVersion": "3"}, "items": [obj("a", 2)], "kind": "ThingList"})
    )
    client.add_watch()
    async with running(inf):
        await client.idle()
        assert inf.synced and not inf.streaming_list
    assert all("sendInitialEvents" not in q for q in client.requests)
