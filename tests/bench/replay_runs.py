"""What the tests of the bench's diagnostic tools share: a replay stream whose every watch starts at the same
line, and the pipeline from memory over it, to compare a tool's end state with."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from bench import scenarios

JOBS = 20
EVENTS = 4 * JOBS * 2  # the replay cycles 4 status variants a job: every stream starts at the same line


@contextmanager
def replay_stream(tmp_path: Path) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
    """A ``bench.replay`` of JOBS TrainJobs whose every watch sends EVENTS lines: its kubeconfig, the lines of
    one watch, and its three LIST bodies."""
    kubeconfig = str(tmp_path / "replay.kubeconfig")
    replay, info = scenarios.start_replay(tmp_path, kubeconfig, "replay", JOBS, "--events", str(EVENTS))
    try:
        lines = asyncio.run(scenarios._fetch_lines(info["url"], EVENTS))
        lists = asyncio.run(scenarios._fetch_lists(info["url"]))
        yield kubeconfig, lines, lists
    finally:
        replay.stop()


def without_rv(store: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A Cache's projections without their resourceVersions: each watch request gets fresh ones from the
    replay; everything else must match."""
    return {
        key: {f: v for f, v in msgspec.structs.asdict(p).items() if f != "resource_version"}
        for key, p in store.items()
    }


def from_memory(lists: list[bytes], lines: list[bytes]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pipeline from memory's projections after the LISTs, and after ``lines`` too (``without_rv``)."""
    cache, ingest, _ = scenarios._offline_ingest(lists)
    listed = without_rv(dict(cache.store))
    for line in lines:
        ingest.process_line(line)
    return listed, without_rv(dict(cache.store))
