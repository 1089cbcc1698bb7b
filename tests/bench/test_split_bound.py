"""``bench.split_bound``: the two-process bound does the work of P1's pipeline, or its figure is void."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench import scenarios
from bench.split_bound import split_rate

JOBS = 20
EVENTS = 4 * JOBS * 2  # the replay cycles 4 status variants a job: every stream starts at the same line


def _without_rv(store: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # Each watch request gets fresh resourceVersions from the replay; everything else must match.
    return {
        key: {f: v for f, v in msgspec.structs.asdict(p).items() if f != "resource_version"}
        for key, p in store.items()
    }


def test_the_split_pipeline_ends_where_the_one_process_pipeline_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="app.trainer.state")  # the replay's few malformed jobs
    kubeconfig = str(tmp_path / "replay.kubeconfig")
    replay, info = scenarios.start_replay(tmp_path, kubeconfig, "replay", JOBS, "--events", str(EVENTS))
    try:
        lines = asyncio.run(scenarios._fetch_lines(info["url"], EVENTS))
        lists = asyncio.run(scenarios._fetch_lists(info["url"]))
        rate, split_cache = split_rate(kubeconfig, lists, EVENTS, batch=16)
    finally:
        replay.stop()
    one_cache, ingest, _ = scenarios._offline_ingest(lists)
    listed = _without_rv(dict(one_cache.store))
    for line in lines:
        ingest.process_line(line)
    assert rate > 0
    assert len(split_cache.store) == JOBS
    # The events moved the jobs off what the LIST held, and the split applied every one of them.
    assert _without_rv(dict(one_cache.store)) != listed
    assert _without_rv(dict(split_cache.store)) == _without_rv(dict(one_cache.store))
