"""A watch body (chunked JSON lines, docs/design/k8s-protocol.md §2) split into bounded lines.

Pure: bytes in, lines out, no I/O. The informer reads the body with ``readany()`` (one await per chunk,
not per event) and hands each chunk to ``LineSplitter.feed``; lines come back as zero-copy views into
the chunk where possible. A line longer than ``max_bytes`` is never assembled: the splitter stops there
and reports it, so a hostile server cannot make us buffer an unbounded object.
"""

from __future__ import annotations

from typing import TypeAlias

Line: TypeAlias = bytes | bytearray | memoryview


class LineSplitter:
    """Stateful across chunks (a line may straddle several). Empty lines are dropped."""

    __slots__ = ("_pending", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> tuple[list[Line], bool]:
        """The lines ``chunk`` completes, in order, and whether a line above ``max_bytes`` follows them.

        After a True the stream is unusable (the oversized line's end is unknown): stop feeding it.
        """
        lines: list[Line] = []
        max_bytes = self.max_bytes
        start = 0
        pending = self._pending
        if pending:
            nl = chunk.find(b"\n")
            if nl < 0:
                pending += chunk
                return lines, len(pending) > max_bytes
            pending += memoryview(chunk)[:nl]
            if len(pending) > max_bytes:
                return lines, True
            lines.append(pending)
            self._pending = pending = bytearray()
            start = nl + 1
        view = memoryview(chunk)
        find = chunk.find
        append = lines.append
        while (nl := find(b"\n", start)) >= 0:
            if nl > start:
                if nl - start > max_bytes:
                    return lines, True
                append(view[start:nl])
            start = nl + 1
        if start < len(chunk):
            pending += view[start:]
            if len(pending) > max_bytes:
                return lines, True
        return lines, False
