"""``bench.interleave``: its direct and two-phase runs do the work of P1's pipeline, or their figures are
void."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bench.interleave import direct_rate, two_phase_rate
from tests.bench.replay_runs import EVENTS, from_memory, replay_stream, without_rv


def test_direct_and_two_phase_end_where_the_pipeline_from_memory_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="app.trainer.state")  # the replay's few malformed jobs
    with replay_stream(tmp_path) as (kubeconfig, lines, lists):
        direct, direct_cache = direct_rate(kubeconfig, lists, EVENTS, read_bytes=4096)
        two_phase, two_phase_cache = two_phase_rate(kubeconfig, lists, EVENTS, read_bytes=4096)
    listed, expected = from_memory(lists, lines)
    assert direct > 0 and two_phase > 0
    assert expected != listed  # the events moved the jobs off what the LIST held
    assert without_rv(dict(direct_cache.store)) == expected
    assert without_rv(dict(two_phase_cache.store)) == expected


def test_a_stream_shorter_than_asked_is_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="app.trainer.state")
    short = pytest.raises(RuntimeError, match=f"after {EVENTS} of {EVENTS + 1} lines")
    with replay_stream(tmp_path) as (kubeconfig, _, lists), short:
        direct_rate(kubeconfig, lists, EVENTS + 1, read_bytes=4096)
