"""Informer against a scripted HTTP API server: exact wire cases from
docs/design/k8s-protocol.md §2 and §6.

The stub keeps a global resourceVersion, an event history (compactable) and live watch streams, and
lets each test inject a fault into the next LIST or WATCH request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from app.kube.client import KubeClient
from app.kube.informer import Informer, InformerOptions
from tests.support.informer_fakes import THINGS, Projector, Recorder, obj
from tests.support.informer_sim_env import options
from tests.support.kubeconfig import write_kubeconfig
from tests.support.waiting import eventually

# The simulated-cluster tests' options, with a shorter inactivity timeout and backoff cap.
FAST = options(inactivity_timeout=1.0, backoff_cap=0.2)

Fault = Callable[[web.Request], Any]


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class StubApiServer:
    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, bytes]] = []
        self.compacted = 0
        self.watchers: set[asyncio.Queue[bytes | None]] = set()
        self.transports: set[Any] = set()
        self.list_faults: list[Fault] = []
        self.watch_faults: list[Fault | str | bytes] = []
        self.requests: list[dict[str, str]] = []
        self.watch_duration = 3600.0
        self.runner: web.AppRunner | None = None
        self.port = 0

    # --- data --------------------------------------------------------------------------------------

    def _emit(self, etype: str, o: dict[str, Any]) -> None:
        data = orjson.dumps({"type": etype, "object": o}) + b"\n"
        self.history.append((self.rv, data))
        for q in self.watchers:
            q.put_nowait(data)

    def put(self, name: str, value: Any = 1, *, uid: str | None = None, etype: str | None = None) -> None:
        self.rv += 1
        existing = self.objects.get(name)
        o = obj(name, self.rv, value=value, uid=uid or (existing["metadata"]["uid"] if existing else None))
        self.objects[name] = o
        self._emit(etype or ("MODIFIED" if existing else "ADDED"), o)

    def delete(self, name: str) -> None:
        self.rv += 1
        o = self.objects.pop(name)
        o["metadata"]["resourceVersion"] = str(self.rv)
        self._emit("DELETED", o)

    def raw_event(self, data: bytes) -> None:
        for q in self.watchers:
            q.put_nowait(data)

    def bookmark(self) -> None:
        self.raw_event(
            orjson.dumps(
                {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": "Thing",
                        "apiVersion": "example.com/v1",
                        "metadata": {"resourceVersion": str(self.rv)},
                    },
                }
            )
            + b"\n"
        )

    def compact(self) -> None:
        self.compacted = self.rv
        self.history.clear()

    def drop_watches(self) -> None:
        for q in self.watchers:
            q.put_nowait(None)

    def abort_connections(self) -> None:
        for t in list(self.transports):
            t.abort()

    # --- HTTP --------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.requests.append(q)
        if request.transport is not None:
            self.transports.add(request.transport)
        if q.get("watch") not in (None, "0", "false"):
            return await self._watch(request)
        if self.list_faults:
            resp = self.list_faults.pop(0)(request)
            if resp is not None:
                return resp  # type: ignore[no-any-return]
        items = [self.objects[k] for k in sorted(self.objects)]
        limit = int(q.get("limit", "0") or 0)
        start = int(q["continue"]) if q.get("continue") else 0
        end = start + limit if limit else len(items)
        cont = str(end) if end < len(items) else ""
        body = {
            "apiVersion": "example.com/v1",
            "kind": "ThingList",
            "metadata": {"resourceVersion": str(self.rv), "continue": cont},
            "items": items[start:end],
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        fault = self.watch_faults.pop(0) if self.watch_faults else None
        if callable(fault):
            early = fault(request)
            if early is not None:
                return early  # type: ignore[no-any-return]
            fault = None
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if fault == "stall":
            await asyncio.sleep(3600)
        if fault == "close":
            return resp
        if isinstance(fault, bytes):
            await resp.write(fault)
        rv = int(request.query.get("resourceVersion") or 0)
        if rv and rv < self.compacted:
            await resp.write(
                orjson.dumps(
                    {
                        "type": "ERROR",
                        "object": status(
                            410, "Expired", f"too old resource version: {rv} ({self.compacted})"
                        ),
                    }
                )
                + b"\n"
            )
            return resp
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.watchers.add(queue)
        try:
            replay = [data for at, data in self.history if at > rv]
            if fault == "reset":
                # Half of the next event, then the connection dies mid-chunk.
                first = replay[0] if replay else await queue.get()
                assert first is not None
                await resp.write(first[: len(first) // 2])
                assert request.transport is not None
                request.transport.abort()
                return resp
            for data in replay:
                await resp.write(data)
            deadline = time.monotonic() + min(self.watch_duration, float(request.query["timeoutSeconds"]))
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    break
                if item is None:
                    break
                await resp.write(item)
        finally:
            self.watchers.discard(queue)
        return resp

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        self.drop_watches()
        self.abort_connections()
        assert self.runner is not None
        await self.runner.cleanup()

    def lists(self) -> list[dict[str, str]]:
        return [q for q in self.requests if "watch" not in q]

    def watches(self) -> list[dict[str, str]]:
        return [q for q in self.requests if "watch" in q]


class Harness:
    def __init__(self, stub: StubApiServer, client: KubeClient) -> None:
        self.stub = stub
        self.client = client
        self.task: asyncio.Task[None] | None = None
        self.recorder = Recorder()
        self.informer: Informer[Any] | None = None

    def start(self, options: InformerOptions = FAST) -> Informer[Any]:
        self.informer = Informer(self.client, THINGS, None, Projector(), self.recorder, options=options)
        self.task = asyncio.create_task(self.informer.run())
        return self.informer

    def calls(self, kind: str | None = None) -> list[tuple[Any, ...]]:
        return [c for c in self.recorder.calls if kind is None or c[0] == kind]

    async def watching(self) -> None:
        assert self.informer is not None
        inf = self.informer
        await eventually(lambda: inf.synced and inf.watching and bool(self.stub.watchers))


@pytest.fixture
async def stub() -> AsyncIterator[StubApiServer]:
    s = StubApiServer()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def h(stub: StubApiServer, tmp_path: Path) -> AsyncIterator[Harness]:
    cfg = write_kubeconfig(tmp_path / "config", f"http://127.0.0.1:{stub.port}", token="t")
    client = await KubeClient.connect(str(cfg))
    harness = Harness(stub, client)
    yield harness
    if harness.task is not None:
        harness.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await harness.task
    await client.close()


# --- tests -------------------------------------------------------------------------------------------


async def test_initial_list_then_watch(h: Harness) -> None:
    for n in "abc":
        h.stub.put(n)
    list_rv = h.stub.rv
    inf = h.start()
    await h.watching()
    assert h.calls() == [("added", f"ns/{n}", str(101 + i), True) for i, n in enumerate("abc")]
    watch = h.stub.watches()[0]
    assert watch["resourceVersion"] == str(list_rv)
    assert watch["allowWatchBookmarks"] == "true" and watch["timeoutSeconds"] == "30"
    h.stub.put("d")
    h.stub.put("a", value=2)
    h.stub.delete("b")
    await eventually(lambda: len(h.calls()) == 6)
    assert h.calls()[3:] == [
        ("added", "ns/d", "104", False),
        ("updated", "ns/a", "101", "105"),
        ("deleted", "ns/b", "106"),
    ]
    h.stub.bookmark()
    await eventually(lambda: inf.counters.bookmark == 1)
    assert inf.resource_version == "106" and sorted(inf.keys()) == ["ns/a", "ns/c", "ns/d"]
    assert not inf.stale and len(h.stub.lists()) == 1


async def test_paginated_list(h: Harness) -> None:
    for i in range(7):
        h.stub.put(f"o{i}")
    inf = h.start(_opts(page_size=3))
    await h.watching()
    pages = h.stub.lists()
    assert [p.get("continue") for p in pages] == [None, "3", "6"]
    assert all(p["limit"] == "3" for p in pages)
    assert len(inf) == 7 and all(c[3] is True for c in h.calls())


def _opts(**kw: Any) -> InformerOptions:
    values = {f: getattr(FAST, f) for f in FAST.__dataclass_fields__}
    values.update(kw)
    return InformerOptions(**values)


async def test_expired_continue_token_restarts_from_page_one(h: Harness) -> None:
    for i in range(5):
        h.stub.put(f"o{i}")

    def expire(request: web.Request) -> web.Response | None:
        if "continue" in request.query:
            return web.json_response(
                status(410, "Expired", "The provided continue parameter is too old"), status=410
            )
        return None

    h.stub.list_faults = [lambda r: None, expire]
    inf = h.start(_opts(page_size=2))
    await h.watching()
    assert [p.get("continue") for p in h.stub.lists()] == [None, "2", None, "2", "4"]
    assert len(inf) == 5 and len(h.calls()) == 5
    assert inf.counters.relists["expired"] == 1


async def test_relist_after_410_delivers_gap_edges_once(h: Harness) -> None:
    for n in "abc":
        h.stub.put(n)
    inf = h.start()
    await h.watching()
    h.recorder.calls.clear()
    # While the watch is down (all in one tick, so the informer cannot resume in between):
    h.stub.drop_watches()
    h.stub.put("d")  # created during the gap
    h.stub.put("a", value=9)  # modified
    h.stub.delete("b")  # deleted
    h.stub.put("e")
    h.stub.delete("e")  # created and deleted: never seen
    h.stub.compact()  # resuming from our RV now fails with an ERROR 410 event
    await eventually(lambda: inf.counters.relists["expired"] == 1 and inf.watching)
    assert sorted(h.calls()) == sorted(
        [("added", "ns/d", "104", False), ("updated", "ns/a", "101", "105"), ("deleted", "ns/b", "102")]
    )
    assert inf.counters.watch_restarts["expired"] == 1 and inf.counters.error == 1
    assert h.stub.lists()[-1].get("resourceVersion") is None  # fresh consistent list after Expired
    h.stub.put("c", value=3)
    await eventually(lambda: len(h.calls()) == 4)
    assert h.calls()[-1] == ("updated", "ns/c", "103", str(h.stub.rv))  # nothing re-added


async def test_http_410_on_watch_relists(h: Harness) -> None:
    h.stub.put("a")
    h.stub.watch_faults = [lambda r: web.json_response(status(410, "Gone", "gone"), status=410)]
    inf = h.start()
    await eventually(lambda: inf.counters.relists["expired"] == 1 and inf.watching)
    assert len(h.stub.lists()) == 2 and h.calls() == [("added", "ns/a", "101", True)]


async def test_clean_close_rewatches_from_last_rv_without_relist(h: Harness) -> None:
    h.stub.put("a")
    h.stub.watch_duration = 0.3
    inf = h.start()
    await h.watching()
    h.stub.put("b")
    await eventually(lambda: inf.counters.watch_restarts["closed"] >= 2)
    h.stub.put("c")
    await eventually(lambda: len(h.calls()) == 3)
    assert len(h.stub.lists()) == 1
    rvs = [w["resourceVersion"] for w in h.stub.watches()]
    assert rvs[0] == "101" and "102" in rvs
    assert h.calls("added") == [
        ("added", "ns/a", "101", True),
        ("added", "ns/b", "102", False),
        ("added", "ns/c", "103", False),
    ]


async def test_stalled_stream_is_detected_and_recovered(h: Harness) -> None:
    h.stub.put("a")
    h.stub.watch_faults = ["stall"]
    inf = h.start(_opts(inactivity_timeout=0.5))
    await eventually(lambda: inf.synced and inf.watching)
    h.stub.put("b")  # the stalled stream never delivers it
    started = time.monotonic()
    await eventually(lambda: len(h.calls()) == 2)
    assert time.monotonic() - started >= 0.3
    assert inf.counters.watch_restarts["inactivity"] == 1
    assert len(h.stub.lists()) == 1
    assert h.stub.watches()[1]["resourceVersion"] == "101"


async def test_reset_mid_chunk_resumes_and_delivers_once(h: Harness) -> None:
    h.stub.put("a")
    inf = h.start()
    await h.watching()
    h.stub.watch_faults = ["reset"]  # the resumed watch is cut in the middle of replaying "b"
    h.stub.drop_watches()
    h.stub.put("b")
    await eventually(lambda: len(h.calls()) == 2)
    await eventually(lambda: inf.counters.watch_restarts["reset"] == 1)
    # Events arrive in order: a duplicate of "b" would come before "c".
    h.stub.put("c")
    await eventually(lambda: inf.get("ns/c") is not None)
    assert h.calls() == [
        ("added", "ns/a", "101", True),
        ("added", "ns/b", "102", False),
        ("added", "ns/c", "103", False),
    ]
    assert len(h.stub.lists()) == 1 and inf.counters.skipped["malformed"] == 0


async def test_429_text_plain_honours_retry_after_without_relist(h: Harness) -> None:
    h.stub.put("a")
    h.stub.watch_faults = [
        lambda r: web.Response(
            status=429, text="Too many requests, please try again later.\n", headers={"Retry-After": "1"}
        )
    ]
    inf = h.start()
    await eventually(lambda: inf.counters.watch_restarts["throttled"] == 1)
    t0 = time.monotonic()
    await h.watching()
    assert time.monotonic() - t0 >= 0.8
    assert len(h.stub.lists()) == 1 and len(h.stub.watches()) == 2


async def test_list_errors_back_off_and_retry(h: Harness) -> None:
    h.stub.put("a")
    h.stub.list_faults = [
        lambda r: web.Response(status=429, text="Too many requests", headers={"Retry-After": "0"}),
        lambda r: web.json_response(status(500, "InternalError", "etcd hiccup"), status=500),
        lambda r: web.Response(status=503, text="<html>no</html>", content_type="text/html"),
        lambda r: web.Response(status=200, body=b"{not json", content_type="application/json"),
    ]
    inf = h.start()
    await h.watching()
    assert len(h.stub.lists()) == 5 and h.calls() == [("added", "ns/a", "101", True)]
    assert inf.counters.skipped["malformed"] == 0


@pytest.mark.parametrize("code", [500, 503, 504])
async def test_5xx_on_watch_backs_off_and_relists(h: Harness, code: int) -> None:
    h.stub.put("a")
    h.stub.watch_faults = [lambda r: web.json_response(status(code, "InternalError", "boom"), status=code)]
    inf = h.start()
    await eventually(lambda: inf.counters.relists["watch_failed"] == 1 and inf.watching)
    lists = h.stub.lists()
    assert len(lists) == 2
    assert lists[1]["resourceVersion"] == "101" and lists[1]["resourceVersionMatch"] == "NotOlderThan"
    assert h.calls() == [("added", "ns/a", "101", True)]  # nothing re-added


async def test_504_too_large_rv_on_list_relists_consistently(h: Harness) -> None:
    h.stub.put("a")
    h.stub.watch_faults = [lambda r: web.json_response(status(503, "ServiceUnavailable", "x"), status=503)]
    h.stub.list_faults = [
        lambda r: None,
        lambda r: web.json_response(
            status(
                504,
                "Timeout",
                "Timeout: Too large resource version: 101, current: 90",
                causes=[{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                retryAfterSeconds=1,
            ),
            status=504,
            headers={"Retry-After": "1"},
        ),
    ]
    inf = h.start()
    await eventually(lambda: inf.counters.relists["too_large_rv"] == 1 and inf.watching)
    lists = h.stub.lists()
    assert [q.get("resourceVersion") for q in lists] == [None, "101", None]


async def test_watch_error_event_other_than_410_relists(h: Harness) -> None:
    h.stub.put("a")
    err = orjson.dumps({"type": "ERROR", "object": status(500, "InternalError", "storage error")}) + b"\n"
    h.stub.watch_faults = [err]
    inf = h.start()
    await eventually(lambda: inf.counters.relists["watch_error"] == 1 and inf.watching)
    assert len(h.stub.lists()) == 2 and inf.counters.error == 1


async def test_server_restart_with_lost_history(h: Harness, stub: StubApiServer) -> None:
    for n in "ab":
        stub.put(n)
    inf = h.start(_opts(inactivity_timeout=5.0))
    await h.watching()
    port = stub.port
    await stub.stop()
    await eventually(lambda: not inf.watching)
    # While down: changes happen and the new instance's watch cache starts after them.
    stub.put("c")
    stub.delete("a")
    stub.compact()
    await eventually(lambda: inf.counters.watch_restarts["refused"] >= 1)  # backoff, no relist
    await stub.start(port)
    await eventually(lambda: inf.counters.relists["expired"] == 1 and inf.watching)
    assert sorted(inf.keys()) == ["ns/b", "ns/c"]
    assert h.calls()[2:] == [("added", "ns/c", "103", False), ("deleted", "ns/a", "101")]


async def test_stale_when_disconnected_longer_than_inactivity(h: Harness, stub: StubApiServer) -> None:
    stub.put("a")
    inf = h.start(_opts(inactivity_timeout=0.3))
    await h.watching()
    assert not inf.stale
    await stub.stop()
    await eventually(lambda: inf.stale, timeout=3)
    await stub.start(stub.port)
    await eventually(lambda: inf.watching and not inf.stale, timeout=3)


async def test_short_watches_back_off(h: Harness) -> None:
    h.stub.put("a")
    h.stub.watch_faults = ["close"] * 4
    inf = h.start(_opts(short_watch=0.5, backoff_base=0.1, backoff_cap=0.1))
    t0 = time.monotonic()
    await eventually(lambda: inf.counters.watch_restarts["short"] == 4 and inf.watching)
    assert time.monotonic() - t0 > 0.1  # not a hot loop
    assert len(h.stub.lists()) == 1


async def test_malformed_and_oversized_lines_are_skipped(h: Harness) -> None:
    h.stub.put("a")
    inf = h.start()
    await h.watching()
    h.stub.raw_event(b"not json at all\n")
    h.stub.raw_event(orjson.dumps({"type": "ADDED", "object": {"metadata": {"namespace": "ns"}}}) + b"\n")
    h.stub.put("b", value="NaN-ish")  # typed decode fails, tolerant projection keeps it
    await eventually(lambda: len(h.calls()) == 2)
    assert inf.counters.skipped["malformed"] == 2
    b = inf.get("ns/b")
    assert b is not None and b.value is None
    huge = obj("huge", 999, value="x" * (80 * 1024))
    h.stub.raw_event(orjson.dumps({"type": "ADDED", "object": huge}) + b"\n")
    await eventually(lambda: inf.counters.skipped["too_large"] == 1)
    await eventually(lambda: inf.counters.relists["oversized_line"] == 1 and inf.watching)
    h.stub.put("c")
    await eventually(lambda: inf.get("ns/c") is not None)
    assert inf.get("ns/huge") is None and sorted(inf.keys()) == ["ns/a", "ns/b", "ns/c"]


async def test_events_split_across_chunks_and_batched(h: Harness) -> None:
    h.stub.put("a")
    inf = h.start()
    await h.watching()
    h.stub.rv += 1
    one = orjson.dumps({"type": "ADDED", "object": obj("b", h.stub.rv)}) + b"\n"
    h.stub.rv += 1
    two = orjson.dumps({"type": "ADDED", "object": obj("c", h.stub.rv)}) + b"\n"
    blob = one + two
    for i in range(0, len(blob), 7):  # tiny chunks, lines straddling them
        h.stub.raw_event(blob[i : i + 7])
        await asyncio.sleep(0)
    await eventually(lambda: len(inf) == 3)
    assert inf.resource_version == str(h.stub.rv) and inf.counters.skipped["malformed"] == 0


async def test_404_counts_as_synced_empty_and_keeps_retrying(h: Harness) -> None:
    h.stub.put("a")
    h.stub.list_faults = [
        lambda r: web.json_response(
            status(404, "NotFound", "the server could not find the requested resource"), status=404
        )
    ]
    inf = h.start()
    await eventually(lambda: inf.synced)
    await h.watching()
    assert h.calls() == [("added", "ns/a", "101", False)]  # arrived after an (empty) initial sync
