"""``bench.report``: P1 is judged against its limit measured in the same run, and every report carries the
hand-written part of docs/benchmarks.md unchanged below its generated table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report
from bench.scenarios import Results

META: dict[str, Any] = {
    "command": "python -m bench --only P1",
    "date": "2026-12-06 07:00 UTC",
    "machine": {
        "cpu": "test",
        "cores": 2,
        "memory": "1 GiB",
        "python": "3.11",
        "loadavg_at_start": [0, 0, 0],
    },
    "quick": False,
    "reps": 1,
    "wall_seconds": 1.0,
    "clusters": "",
}


def p1_results(live: float, limit: float, orjson_rate: float, baseline: float) -> Results:
    res = Results()
    res.fig("p1_informer_rate").add(live)
    res.fig("p1_socket_orjson_rate").add(limit)
    res.fig("p1_vs_read_limit").add(live / limit)
    res.fig("p1_vs_orjson").add(live / orjson_rate)
    res.fig("p1_vs_baseline").add(live / baseline)
    return res


def test_p1_is_judged_against_its_limit_not_against_bare_orjson(tmp_path: Path) -> None:
    # 0.8 of the limit passes although it is only 0.5 of a bare parse: that ratio has no target any more.
    _, js, misses = report.write(p1_results(40_000, 50_000, 80_000, 5_000), tmp_path, META)
    targets = json.loads(js.read_text())["targets"]
    assert targets["p1_vs_read_limit"] == {
        "op": ">=",
        "target": 0.75,
        "unit": "x",
        "scale": 1.0,
        "result": "pass",
    }
    assert targets["p1_vs_baseline"]["result"] == "pass"
    assert "p1_vs_orjson" not in targets
    assert misses == []

    _, _, misses = report.write(p1_results(35_000, 50_000, 40_000, 5_000), tmp_path, META)
    assert misses == ["P1 live ingest ÷ (read path + `orjson.loads`)"]


def test_every_report_carries_the_written_part_of_docs_benchmarks(tmp_path: Path) -> None:
    written = report.written_part(report.DOCS_REPORT.read_text(encoding="utf-8"))
    assert written.startswith("## How to reproduce\n")
    md, _, _ = report.write(p1_results(40_000, 50_000, 80_000, 5_000), tmp_path, META)
    text = md.read_text(encoding="utf-8")
    table_end = text.index("Run details: ")
    assert text.endswith(written)
    assert text.index(written) > table_end
    assert report.written_part(text) == written  # a full run writing into docs/ keeps it as it was


def test_the_written_part_starts_at_the_first_second_level_heading() -> None:
    assert report.written_part("# Benchmarks\n\n| table |\n\n## How\n\ntext\n\n## Scale\nmore\n") == (
        "## How\n\ntext\n\n## Scale\nmore\n"
    )
    assert report.written_part("# Benchmarks\n\n| table |\n") == ""


def test_plots_are_linked_by_their_path_from_the_report(tmp_path: Path) -> None:
    """``--plot`` draws under img/, as docs/ keeps its images, so the links of a report written into docs/
    point at docs/img/."""
    plot = tmp_path / "img" / "bench-memory.png"
    md, _, _ = report.write(p1_results(40_000, 50_000, 80_000, 5_000), tmp_path, META, [plot])
    assert "\n![bench-memory](img/bench-memory.png)\n" in md.read_text(encoding="utf-8")


def test_the_pods_rows_are_in_the_table_and_the_json_with_their_targets(tmp_path: Path) -> None:
    res = Results()
    res.fig("p1_pods_vs_baseline").add(7.5)
    res.fig("p3_bytes_per_pod").add(420.0)  # above 400 B: a miss
    res.fig("p4_pods_p99").add(0.004)  # seconds, shown in ms
    res.fig("p4_pods_om_p99").add(0.003)
    md, js, misses = report.write(res, tmp_path, META)
    table = md.read_text(encoding="utf-8")
    assert "| P1 | pods watch ingest ÷ kubernetes-asyncio Watch, same pods stream | 7.50 |" in table
    assert "| P3 | pods present: (RSS with pods - RSS big) per watched pod | 420 |" in table
    assert (
        "| P4 | pods present, pods watch on: `/metrics` p99, text 0.0.4 + gzip, big cluster | 4.00 |" in table
    )
    targets = json.loads(js.read_text())["targets"]
    assert {k: (t["op"], t["target"], t["result"]) for k, t in targets.items()} == {
        "p1_pods_vs_baseline": (">=", 6.0, "pass"),
        "p3_bytes_per_pod": ("<=", 400, "miss"),
        "p4_pods_p99": ("<=", 10.0, "pass"),
        "p4_pods_om_p99": ("<=", 10.0, "pass"),
    }
    assert misses == ["P3 pods present: (RSS with pods - RSS big) per watched pod"]
