"""The setuptools build hook (pyproject.toml, [tool.setuptools.cmdclass]): a built wheel carries
``app/REVISION``, the commit it was built from, which app/version.py reads where there is no ``.git``.

The revision is ``$BUILD_REVISION`` when set (a build from a copy of the sources, as the image build makes),
else the commit of the source tree being built, as app/version.py's ``git_revision`` reads it; nothing is
written when neither is known, nor for an editable install (app/version.py asks git there). Imported by
setuptools alone, by path (``app`` itself may not be importable while it is being built): it imports nothing
of the project.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from setuptools.command.build_py import build_py


def source_revision(source: Path) -> str | None:
    """``git rev-parse HEAD`` of ``source``, ``-dirty`` with uncommitted changes to tracked files."""
    if not (source / ".git").exists():
        return None

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, timeout=5, check=False
        )
        return result.stdout.strip() if result.returncode == 0 else ""

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no") if head else ""
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + "-dirty" if dirty else head) or None


class BuildPyWithRevision(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        revision = os.environ.get("BUILD_REVISION", "").strip() or source_revision(Path.cwd())
        if revision:
            target = Path(self.build_lib) / "app" / "REVISION"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(revision + "\n")
