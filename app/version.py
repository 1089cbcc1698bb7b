"""The version, and the source revision (git commit) this code was built from.

Where the revision comes from, first found wins:

1. the git checkout the package runs from (``app/`` inside a work tree: running from the source tree or an
   editable install): ``git rev-parse HEAD``, ``-dirty`` when tracked files have changed;
2. ``app/REVISION``, written into the wheel when it is built (app/_build.py, the setuptools build hook):
   ``$BUILD_REVISION`` if set, else the commit of the source tree being built; so an installed wheel or an
   image built from a checkout knows its commit without a ``.git``;
3. ``unknown``.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from app import __version__

PACKAGE = Path(__file__).resolve().parent
REVISION_FILE = PACKAGE / "REVISION"
UNKNOWN = "unknown"


def git_revision(source: Path) -> str | None:
    """The commit of the work tree at ``source`` (``-dirty`` with uncommitted changes to tracked files), or
    None when it is not one or git is not at hand."""
    if not (source / ".git").exists():
        return None
    try:
        head = _git(source, "rev-parse", "HEAD")
        dirty = _git(source, "status", "--porcelain", "--untracked-files=no") if head else ""
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + "-dirty" if dirty else head) or None


def _git(source: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(source), *args], capture_output=True, text=True, timeout=5, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


@functools.cache
def revision() -> str:
    found = git_revision(PACKAGE.parent)
    if found:
        return found
    try:
        written = REVISION_FILE.read_text().strip()
    except OSError:
        written = ""
    return written or UNKNOWN


def version_line() -> str:
    """What ``trainer-metrics --version`` prints."""
    return f"trainer-metrics {__version__} (revision {revision()})"
