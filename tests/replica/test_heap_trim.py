"""Freed heap goes back to the kernel periodically (app/replica/heap_trim.py), in a replica that owns its
process only, and each trim's duration reaches the self-telemetry histogram."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.replica.heap_trim import HeapTrimmer, load_malloc_trim
from app.replica.service import Service
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def test_glibc_has_malloc_trim() -> None:
    trim = load_malloc_trim()
    assert trim is not None, "this machine's C library is glibc: malloc_trim must load"
    assert trim(0) in (0, 1)


def test_a_trim_gives_freed_heap_back_under_the_image_settings() -> None:
    # The image keeps up to 128 MB of freed heap (MALLOC_TRIM_THRESHOLD_): free many 64 KB blocks, each
    # between two kept small ones, so the freed pages sit inside the heap where glibc's own trimming never
    # reaches; one trim must give most of them back.
    script = textwrap.dedent(
        """
        import json
        from app.replica.heap_trim import HeapTrimmer, load_malloc_trim, resident_bytes
        kept, freed = [], []
        for _ in range(2_000):
            freed.append(bytearray(65536))
            kept.append(bytearray(1024))
        del freed
        before = resident_bytes()
        trimmer = HeapTrimmer(1.0, load_malloc_trim(), lambda _: None)
        took = trimmer.trim_once()
        print(json.dumps({"before": before, "returned": trimmer.returned_bytes, "took": took}))
        """
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "134217728"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    figures = json.loads(out.stdout)
    # 2,000 freed 64 KB blocks are 125 MB; at least half of it must come back.
    assert figures["returned"] > 60 * 2**20, figures


def test_the_trimmer_trims_every_interval_off_the_loop_and_reports_each_duration() -> None:
    threads: list[int] = []
    observed: list[float] = []

    def trim(pad: int) -> int:
        assert pad == 0
        threads.append(threading.get_ident())
        return 1

    async def run() -> None:
        task = asyncio.create_task(HeapTrimmer(0.01, trim, observed.append).run())
        try:
            await eventually(lambda: len(observed) >= 3, 10, what="three trims")
        finally:
            task.cancel()

    asyncio.run(run())
    assert all(t >= 0 for t in observed)
    assert threading.get_ident() not in threads, "malloc_trim must not run on the event loop's thread"


def test_a_completed_list_trims_at_the_next_poll_without_waiting_for_the_interval() -> None:
    # An informer's complete list ends a transient peak (its MB-sized pages): its freed heap goes back then.
    lists = [0]
    polls = [0]
    observed: list[float] = []

    def transients() -> int:
        polls[0] += 1
        return lists[0]

    async def polled(times: int) -> None:
        start = polls[0]
        await eventually(lambda: polls[0] >= start + times, 10, what=f"{times} polls")

    async def run() -> None:
        trimmer = HeapTrimmer(3600, lambda _: 1, observed.append, transients=transients, poll=0.01)
        task = asyncio.create_task(trimmer.run())
        try:
            await polled(5)
            assert observed == [], "no list: no trim before the interval (an hour)"
            lists[0] += 1
            await eventually(lambda: len(observed) == 1, 10, what="a trim after the list")
            lists[0] += 2
            await eventually(lambda: len(observed) == 2, 10, what="a trim after the next lists")
            await polled(5)
            assert len(observed) == 2, "no further list: no further trim"
        finally:
            task.cancel()

    asyncio.run(run())


def test_lists_applied_counts_every_complete_list_of_every_informer() -> None:
    from app.kube.informer_telemetry import InformerTelemetry

    class View:
        def __init__(self, name: str) -> None:
            self.name = name

    telemetry = InformerTelemetry()
    a, b = telemetry.register(View("a")), telemetry.register(View("b"))  # type: ignore[arg-type]
    assert telemetry.lists_applied() == 0
    a.lists += 1
    b.lists += 2
    assert telemetry.lists_applied() == 3


def test_interval_and_poll_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        HeapTrimmer(0, lambda _: 0, lambda _: None)
    with pytest.raises(ValueError, match="poll"):
        HeapTrimmer(1, lambda _: 0, lambda _: None, poll=0)


@pytest.fixture
def frequent_trims(kubeconfig: Path) -> Iterator[Settings]:
    yield Settings(
        kubeconfig=str(kubeconfig),
        leader_election=False,
        host="127.0.0.1",
        port=0,
        heap_trim_interval_seconds=0.05,
    )


def _trim_count(service: Service) -> float:
    value = service.registry.get_sample_value("trainer_metrics_heap_trim_duration_seconds_count")
    return value or 0.0


@pytest.mark.parametrize("owns_process", [True, False], ids=["owns-process", "shares-process"])
async def test_only_a_replica_that_owns_the_process_trims(
    frequent_trims: Settings, owns_process: bool
) -> None:
    service = Service(frequent_trims, owns_process=owns_process)
    await service.start()
    try:
        await eventually(lambda: service.journal.leading, 20, what="replica exporting")
        if owns_process:
            await eventually(lambda: _trim_count(service) >= 2, 20, what="two trims observed")
        else:
            # Several replicas share a test process: none trims it.
            names = {t.get_name() for t in service._tasks}
            assert "heap trim" not in names
            assert _trim_count(service) == 0
    finally:
        await service.stop()
        gc.unfreeze()  # owns_process also freezes the synced caches: later tests check for leaks
