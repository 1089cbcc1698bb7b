"""``python -m bench``'s choice of where its report goes (bench/__main__.py)."""

from __future__ import annotations

from pathlib import Path

from bench.__main__ import report_dir
from bench.common import ROOT


def test_only_a_full_run_writes_into_docs(tmp_path: Path) -> None:
    assert report_dir(None, quick=False, only=set()) == ROOT / "docs"
    for quick, only in ((True, set()), (False, {"P1"}), (True, {"P1", "P5"})):
        out = report_dir(None, quick=quick, only=only)
        assert out.is_dir() and out != ROOT / "docs" and not any(out.iterdir())
        out.rmdir()
    assert report_dir(tmp_path, quick=True, only={"P1"}) == tmp_path
