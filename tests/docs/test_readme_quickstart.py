"""The README's quick start, as written: ``trainer-metrics --simulate`` (on free ports), then its curls. They
print a readable summary (the aggregates, a few dozen lines, not the hundreds of per-TrainJob series; the
debug JSON pretty), counts move within seconds (simulate mode's short zero hold), and Ctrl-C stops it at
once, saying what it waits for."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

from tests.support.waiting import wait_for

from .readme import argv_of, commands, exporter_as_written, run, section, shell_blocks


def _quick_start() -> tuple[list[str], list[str]]:
    """(the command that starts the exporter, the curls of the next block)."""
    blocks = shell_blocks(section("Quick start"))
    start = next(b for b in blocks if "--simulate" in b)
    curls = blocks[blocks.index(start) + 1]
    return commands(start), commands(curls)


def _created_total(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "_created_total{" in line)


def test_the_quick_start_as_written(tmp_path: Path) -> None:
    start, curls = _quick_start()
    assert len(start) == 1
    assert start[0].startswith("python3 -m venv .venv && .venv/bin/pip install . ./sim && "), start
    argv = argv_of(start[0], "trainer-metrics")
    assert argv == ["--simulate", "--host", "127.0.0.1"], argv
    counters, states, progress, debug = curls
    with exporter_as_written(argv, tmp_path / "exporter.log") as ex:
        wait_for(lambda: run(states, port=ex.port).strip() != "", timeout=60, what="TrainJobs by state")
        # Counts move within seconds: each new series is held at 0 for 5 s from the scrape that showed it.
        wait_for(
            lambda: "kubeflow_trainer_trainjob_created_total{" in run(counters, port=ex.port),
            timeout=60,
            what="a created series",
        )
        shown = time.monotonic()
        wait_for(lambda: _created_total(run(counters, port=ex.port)) > 0, timeout=30, what="a created count")
        assert time.monotonic() - shown < 30

        summary = run(counters, port=ex.port)
        assert 0 < len(summary.splitlines()) <= 60, summary  # not the hundreds of lines of everything
        aggregate = re.compile(r"kubeflow_trainer_trainjob_(created|finished)_total\{")
        assert all(aggregate.match(x) for x in summary.splitlines()), summary
        by_state = dict(line.split() for line in run(states, port=ex.port).splitlines())
        assert set(by_state) <= {"pending", "running", "suspended", "succeeded", "failed"}, by_state
        assert sum(float(n) for n in by_state.values()) > 0
        assert "kubeflow_trainer_trainjob_status_progress_percent{" in run(progress, port=ex.port)

        pretty = run(debug, port=ex.port)
        assert len(pretty.splitlines()) > 20  # one field a line, not 10 KB on one line
        snapshot_part, leadership_part = pretty.split("\n{\n", 1) if "\n{\n" in pretty else (pretty, "")
        assert '"informers"' in snapshot_part or '"runtimes"' in snapshot_part, pretty[:500]
        assert json.loads("{\n" + leadership_part)["is_leader"] is True

        ex.proc.send_signal(signal.SIGINT)  # Ctrl-C
        stopped = time.monotonic()
        ex.proc.wait(timeout=30)
        took = time.monotonic() - stopped
        log = ex.log()
    assert took < 10, f"Ctrl-C took {took:.1f} s"
    # Ends as a Ctrl-C ends a process, after an orderly stop: no traceback.
    assert ex.proc.returncode == -signal.SIGINT, ex.proc.returncode
    assert "Traceback" not in log, log[-2000:]
    assert re.search(r"INFO +app\.serving\.graceful: stopping: ", log), log[-2000:]
    # A newcomer meets no warning: the demo's jobs are all well-formed.
    assert " WARNING " not in log, [line for line in log.splitlines() if " WARNING " in line][:5]
