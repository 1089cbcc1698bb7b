"""``bench.split_bound``: the two-process bound does the work of P1's pipeline, or its figure is void."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bench.split_bound import split_rate
from tests.bench.replay_runs import EVENTS, JOBS, from_memory, replay_stream, without_rv


def test_the_split_pipeline_ends_where_the_one_process_pipeline_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="app.trainer.state")  # the replay's few malformed jobs
    with replay_stream(tmp_path) as (kubeconfig, lines, lists):
        rate, split_cache = split_rate(kubeconfig, lists, EVENTS, batch=16)
    listed, expected = from_memory(lists, lines)
    assert rate > 0
    assert len(split_cache.store) == JOBS
    # The events moved the jobs off what the LIST held, and the split applied every one of them.
    assert expected != listed
    assert without_rv(dict(split_cache.store)) == expected
