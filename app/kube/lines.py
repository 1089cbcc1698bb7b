"""A watch body (chunked JSON lines, docs/design/k8s-protocol.md §2) split into bounded lines.

Pure: bytes in, lines out, no I/O. The informer reads the body with ``readany()`` (one await per chunk,
not per event) and hands each chunk to ``LineSplitter.feed``; lines come back as zero-copy views into
the chunk where possible. A line longer than ``max_bytes`` is never assembled: the splitter stops there
and reports it, so a hostile server cannot make us buffer an unbounded object.

``feed_blocks`` is the reflector's variant: the complete lines come back joined, as they arrived, in
blocks of at most ``block_lines`` lines and about ``block_bytes`` bytes, so there is no per-line Python
work at all between the socket and msgspec (``Ingest.process_block`` decodes a block in one call).
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

    def feed_blocks(self, chunk: bytes, block_bytes: int, block_lines: int) -> tuple[list[bytes], bool]:
        """The lines ``chunk`` completes as blocks (``b"\n"``-separated lines, no trailing newline, empty
        lines possibly included), and whether a line above ``max_bytes`` follows them (as ``feed``).

        A block holds at most ``block_lines`` lines and ``block_bytes`` bytes plus one line. Splitting a
        block on ``b"\n"`` and dropping empty lines gives exactly the lines ``feed`` would give.
        """
        blocks: list[bytes] = []
        max_bytes = self.max_bytes
        start = 0
        pending = self._pending
        if pending:
            nl = chunk.find(b"\n")
            if nl < 0:
                pending += chunk
                return blocks, len(pending) > max_bytes
            pending += memoryview(chunk)[:nl]
            if len(pending) > max_bytes:
                return blocks, True
            blocks.append(bytes(pending))
            self._pending = pending = bytearray()
            start = nl + 1
        end = chunk.rfind(b"\n")  # complete lines: chunk[start:end]
        if end >= start:
            find = chunk.find
            if end - start > max_bytes:
                # A line in there may be above the cap (only a chunk larger than the cap): measure each.
                pos = start
                while pos < end:
                    nl = find(b"\n", pos)
                    if nl - pos > max_bytes:
                        return blocks, True
                    if nl > pos:
                        blocks.append(chunk[pos:nl])
                    pos = nl + 1
            else:
                count = chunk.count
                pos = start
                while pos < end:
                    cut = end if end - pos <= block_bytes else find(b"\n", pos + block_bytes)
                    if count(b"\n", pos, cut) >= block_lines:
                        cut = pos - 1
                        for _ in range(block_lines):
                            cut = find(b"\n", cut + 1)
                    blocks.append(chunk[pos:cut])
                    pos = cut + 1
            start = end + 1
        if start < len(chunk):
            pending += memoryview(chunk)[start:]
            if len(pending) > max_bytes:
                return blocks, True
        return blocks, False
