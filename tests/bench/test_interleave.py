"""``bench.interleave``: its direct and two-phase runs do the work of P1's pipeline, or their figures are
void."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench import scenarios
from bench.interleave import direct_rate, two_phase_rate

JOBS = 20
EVENTS = 4 * JOBS * 2  # the replay cycles 4 status variants a job: every stream starts at the same line


def _without_rv(store: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # Each watch request gets fresh resourceVersions from the replay; everything else must match.
    return {
        key: {f: v for f, v in msgspec.structs.asdict(p).items() if f != "resource_version"}
        for key, p in store.items()
    }


def test_direct_and_two_phase_end_where_the_pipeline_from_memory_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="app.trainer.state")  # the replay's few malformed jobs
    kubeconfig = str(tmp_path / "replay.kubeconfig")
    replay, info = scenarios.start_replay(tmp_path, kubeconfig, "replay", JOBS, "--events", str(EVENTS))
    try:
        lines = asyncio.run(scenarios._fetch_lines(info["url"], EVENTS))
        lists = asyncio.run(scenarios._fetch_lists(info["url"]))
        direct, direct_cache = direct_rate(kubeconfig, lists, EVENTS, read_bytes=4096)
        two_phase, two_phase_cache = two_phase_rate(kubeconfig, lists, EVENTS, read_bytes=4096)
    finally:
        replay.stop()
    memory_cache, ingest, _ = scenarios._offline_ingest(lists)
    listed = _without_rv(dict(memory_cache.store))
    for line in lines:
        ingest.process_line(line)
    expected = _without_rv(dict(memory_cache.store))
    assert direct > 0 and two_phase > 0
    assert expected != listed  # the events moved the jobs off what the LIST held
    assert _without_rv(dict(direct_cache.store)) == expected
    assert _without_rv(dict(two_phase_cache.store)) == expected


def test_a_stream_shorter_than_asked_is_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="app.trainer.state")
    kubeconfig = str(tmp_path / "replay.kubeconfig")
    replay, info = scenarios.start_replay(tmp_path, kubeconfig, "replay", JOBS, "--events", str(EVENTS))
    try:
        lists = asyncio.run(scenarios._fetch_lists(info["url"]))
        with pytest.raises(RuntimeError, match=f"after {EVENTS} of {EVENTS + 1} lines"):
            direct_rate(kubeconfig, lists, EVENTS + 1, read_bytes=4096)
    finally:
        replay.stop()
