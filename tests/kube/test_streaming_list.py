"""Streaming list (watch with sendInitialEvents, docs/design/k8s-protocol.md §2) against the simulated API.

The sync and every relist may come from one watch: initial ADDEDs, then the BOOKMARK annotated
``k8s.io/initial-events-end``, then live events on the same stream. What handlers are told must be what the
paginated LIST would have told them, and a server that refuses it or never ends the initial events must
leave the informer on the paginated LIST.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from app.kube.client import KubeClient
from app.kube.informer import Informer, InformerOptions
from app.kube.informer_telemetry import InformerTelemetry
from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.informer_fakes import Projector, Recorder
from tests.support.informer_sim_env import Env, informer_env, job, options
from tests.support.waiting import eventually


class RelistRecorder(Recorder):
    """Also records the relist framing (``on_relist(since)`` ... ``on_relist(None)``)."""

    def on_relist(self, since: int | None) -> None:
        self.calls.append(("relist", since))


class RecordingClient:
    """``KubeClient.stream`` with every query recorded; optionally an older or stricter server.

    ``ignore_initial_events``: the parameters a server before sendInitialEvents does not know are dropped
    (it then serves a plain watch: synthetic ADDEDs for RV "", no end bookmark). ``refuse``: the watch-list
    parameters reach the simulated server half-formed, so it answers the real 422 Invalid Status, as a
    server with the WatchList feature off does.
    """

    def __init__(
        self, client: KubeClient, *, ignore_initial_events: bool = False, refuse: bool = False
    ) -> None:
        self.client = client
        self.ignore_initial_events = ignore_initial_events
        self.refuse = refuse
        self.queries: list[dict[str, str]] = []

    def stream(
        self, path: str, *, query: Mapping[str, str], timeout: aiohttp.ClientTimeout
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        q = dict(query)
        self.queries.append(dict(q))
        if "sendInitialEvents" in q:
            if self.ignore_initial_events:
                del q["sendInitialEvents"], q["resourceVersionMatch"]
            elif self.refuse:
                del q["resourceVersionMatch"]
        return self.client.stream(path, query=q, timeout=timeout)

    def streaming(self) -> list[dict[str, str]]:
        return [q for q in self.queries if q.get("sendInitialEvents") == "true"]

    def lists(self) -> list[dict[str, str]]:
        return [q for q in self.queries if q.get("watch") != "true"]


class StreamEnv(Env):
    def __init__(self, sim: SimulatedCluster, client: KubeClient) -> None:
        super().__init__(sim, client)
        self.recorder = RelistRecorder()
        self.wire = RecordingClient(client)

    def start(
        self, opts: InformerOptions | None = None, telemetry: InformerTelemetry | None = None
    ) -> Informer[Any]:
        self.informer = Informer(
            self.wire,
            TRAINJOBS,
            None,
            Projector(),
            self.recorder,
            options=opts or options(streaming_list=True),
            telemetry=telemetry,
        )
        self.task = asyncio.create_task(self.informer.run())
        return self.informer


def stream_env(tmp_path: Path) -> contextlib.AbstractAsyncContextManager[StreamEnv]:
    return informer_env(tmp_path, StreamEnv)


@pytest.fixture
async def senv(tmp_path: Path) -> AsyncIterator[StreamEnv]:
    async with stream_env(tmp_path) as e:
        yield e


def rv(doc: dict[str, Any]) -> str:
    return str(doc["metadata"]["resourceVersion"])


async def expire_watch(e: StreamEnv) -> None:
    """A write the watch misses, then compaction and an apiserver restart: the resumed watch gets 410."""
    e.sim.faults.stall_watches()
    e.create("gap")
    e.sim.faults.compact()
    e.sim.faults.restart(abrupt=True)
    e.sim.faults.release_watches()


async def test_streaming_sync_then_live_events_on_the_same_watch(senv: StreamEnv) -> None:
    a, b = senv.create("a"), senv.create("b", ns="team2")
    inf = senv.start()
    await senv.watching()
    snapshot = str(senv.sim.store.resource_version)
    assert sorted(senv.calls()) == [("added", "team1/a", rv(a), True), ("added", "team2/b", rv(b), True)]
    # One request, no LIST: the watch-list from a consistent read (RV "") with bookmarks.
    first = senv.wire.queries[0]
    assert senv.wire.lists() == [] and len(senv.wire.queries) == 1
    assert first["sendInitialEvents"] == "true" and first["resourceVersionMatch"] == "NotOlderThan"
    assert first["allowWatchBookmarks"] == "true" and "resourceVersion" not in first
    # The informer resumes from the end bookmark's RV (the snapshot), not from an object's.
    assert inf.resource_version == snapshot and inf.streaming_list
    c = senv.create("c")
    m = senv.modify("a", suspend=True)
    d = senv.delete("b", ns="team2")
    await eventually(lambda: len(senv.calls()) == 5)
    assert senv.calls()[2:] == [
        ("added", "team1/c", rv(c), False),
        ("updated", "team1/a", rv(a), rv(m)),
        ("deleted", "team2/b", rv(d)),
    ]
    assert len(senv.wire.queries) == 1  # still the stream that synced
    senv.assert_matches_store()


async def test_empty_collection_syncs(senv: StreamEnv) -> None:
    inf = senv.start()
    await senv.watching()
    assert len(inf) == 0 and senv.calls() == [] and senv.wire.lists() == []


async def _gap_scenario(e: StreamEnv, opts: InformerOptions) -> tuple[list[tuple[Any, ...]], dict[str, str]]:
    """The compaction gap of test_informer_sim: what a relist after it tells the handler."""
    a, b = e.create("a"), e.create("b")
    c = e.create("c")
    telemetry = InformerTelemetry()
    inf = e.start(opts, telemetry=telemetry)
    await e.watching()
    e.calls().clear()
    e.sim.faults.stall_watches()
    d = e.create("d")
    m = e.modify("a", suspend=True)
    e.delete("b")
    e.create("e")
    e.delete("e")
    e.sim.faults.compact()
    e.sim.faults.restart(abrupt=True)
    e.sim.faults.release_watches()
    await eventually(lambda: inf.counters.relists["expired"] >= 1 and inf.watching and e.calls())
    await eventually(lambda: e.calls()[-1] == ("relist", None))
    gap = list(e.calls())
    e.assert_matches_store()
    before = len(e.calls())
    e.modify("c", suspend=True)
    await eventually(lambda: len(e.calls()) == before + 1)
    assert e.calls()[-1][0] == "updated"  # nothing re-added after the relist
    return gap, {"a": rv(a), "b": rv(b), "c": rv(c), "d": rv(d), "m": rv(m)}


async def test_relist_after_gap_tells_the_same_as_the_paginated_list(tmp_path: Path) -> None:
    results = {}
    for mode in (False, True):
        async with stream_env(tmp_path / str(mode)) as e:
            results[mode] = await _gap_scenario(e, options(streaming_list=mode, page_size=2))
            if mode:
                assert e.wire.lists() == [] and len(e.wire.streaming()) == 2
            else:
                assert e.wire.streaming() == [] and len(e.wire.lists()) >= 2
    (listed, rvs), (streamed, rvs_streamed) = results[False], results[True]
    assert rvs == rvs_streamed  # the same scenario, revision for revision
    expected = [
        ("relist", int(rvs["c"])),  # the RV held before the gap
        ("added", "team1/d", rvs["d"], False),
        ("updated", "team1/a", rvs["a"], rvs["m"]),
        ("deleted", "team1/b", rvs["b"]),
        ("relist", None),
    ]
    for calls in (listed, streamed):
        assert calls[0] == expected[0] and calls[-1] == expected[-1]
        assert sorted(calls[1:-1]) == sorted(expected[1:-1])


async def test_relist_streams_from_the_resource_version_held(senv: StreamEnv) -> None:
    senv.create("a")
    inf = senv.start()
    await senv.watching()
    held = inf.resource_version
    # The resumed watch fails with a 5xx: a relist that may use the RV held (NotOlderThan it).
    senv.sim.faults.fail_next(1, status=500, retry_after=0, watch=True)
    assert senv.sim.faults.reset_watches() >= 1
    b = senv.create("b")
    await eventually(lambda: inf.counters.relists["watch_failed"] == 1 and inf.watching)
    await eventually(lambda: len(senv.calls()) == 4)
    relist = senv.wire.streaming()[-1]
    assert len(senv.wire.streaming()) == 2 and relist["resourceVersion"] == held
    assert senv.calls()[1:] == [("relist", int(held)), ("added", "team1/b", rv(b), False), ("relist", None)]
    assert senv.wire.lists() == []
    senv.assert_matches_store()


Exported = tuple[float | None, float | None, float | None]


def telemetry_of(registry: CollectorRegistry) -> Callable[[], Exported]:
    """The informer's streaming-list gauge and its failed syncs (LIST, streaming), as exported."""
    labels = {"informer": "trainjobs"}

    def read() -> Exported:
        failures = "trainer_metrics_informer_sync_failures_total"
        return (
            registry.get_sample_value("trainer_metrics_informer_streaming_list", labels),
            registry.get_sample_value(failures, {**labels, "method": "list"}),
            registry.get_sample_value(failures, {**labels, "method": "streaming"}),
        )

    return read


async def test_refused_streaming_list_falls_back_to_list_for_good(senv: StreamEnv) -> None:
    a = senv.create("a")
    senv.wire.refuse = True
    registry = CollectorRegistry()
    exported = telemetry_of(registry)
    inf = senv.start(options(streaming_list=None), telemetry=InformerTelemetry(registry))
    await senv.watching()
    assert senv.calls() == [("added", "team1/a", rv(a), True)]
    assert not inf.streaming_list and len(senv.wire.streaming()) == 1 and len(senv.wire.lists()) == 1
    assert exported() == (0, 0, 1)  # the fallback shows in the metrics, not only in a log line
    # A later relist does not try again.
    await expire_watch(senv)
    await eventually(lambda: inf.counters.relists["expired"] >= 1 and inf.watching)
    await eventually(lambda: len(senv.wire.lists()) == 2)
    assert len(senv.wire.streaming()) == 1
    senv.assert_matches_store()


async def test_missing_end_bookmark_falls_back_to_list_for_good(
    senv: StreamEnv, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = senv.create("a"), senv.create("b")
    senv.wire.ignore_initial_events = True  # a plain watch: synthetic ADDEDs, never the end bookmark
    inf = senv.start(options(streaming_list=None, initial_events_timeout=0.5))
    await eventually(lambda: inf.synced and inf.watching)
    # What the abandoned stream delivered was collected, never applied: each object told once.
    assert sorted(senv.calls()) == [("added", "team1/a", rv(a), True), ("added", "team1/b", rv(b), True)]
    assert not inf.streaming_list and len(senv.wire.streaming()) == 1 and len(senv.wire.lists()) == 1
    assert sum("streaming list unavailable" in r.getMessage() for r in caplog.records) == 1
    await expire_watch(senv)
    await eventually(lambda: inf.counters.relists["expired"] >= 1 and len(senv.wire.lists()) == 2)
    assert len(senv.wire.streaming()) == 1
    assert sum("streaming list unavailable" in r.getMessage() for r in caplog.records) == 1


async def test_streaming_on_does_not_fall_back(senv: StreamEnv) -> None:
    senv.create("a")
    senv.wire.ignore_initial_events = True
    registry = CollectorRegistry()
    exported = telemetry_of(registry)
    inf = senv.start(
        options(streaming_list=True, initial_events_timeout=0.2), telemetry=InformerTelemetry(registry)
    )
    await eventually(lambda: len(senv.wire.streaming()) >= 3, timeout=10)
    assert not inf.synced and senv.calls() == [] and senv.wire.lists() == [] and inf.streaming_list
    gauge, listed, streamed = exported()
    assert (gauge, listed) == (1, 0) and streamed is not None and streamed >= 2
    senv.wire.ignore_initial_events = False  # the server learns it: the next attempt syncs
    await eventually(lambda: inf.synced and inf.watching, timeout=10)
    senv.assert_matches_store()
    gauge, _, streamed_at_sync = exported()
    assert gauge == 1 and streamed_at_sync == len(senv.wire.streaming()) - 1  # every attempt but the last


async def test_oversized_object_in_initial_events_uses_list_for_that_sync(senv: StreamEnv) -> None:
    senv.create("a")
    big = {"name": "big", "annotations": {"x": "y" * (80 * 1024)}}  # above the 64 KiB limit of OPTS
    senv.sim.store.create(TRAINJOBS, "team1", {**job("big"), "metadata": big})
    inf = senv.start()
    await senv.watching()
    assert [c[1] for c in senv.calls()] == ["team1/a"]
    assert inf.counters.skipped["too_large"] >= 1
    assert len(senv.wire.streaming()) == 1 and len(senv.wire.lists()) == 1
    assert inf.streaming_list  # only that sync: the next one streams again
