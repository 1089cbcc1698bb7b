"""The Trainer part's gzip, compressed part by part: a part that recurs unchanged is not compressed again.

The Trainer text is a sequence of parts (each family's header and its blocks of ~64 series, app/metrics/
series_cache.py), never joined for a gzip scrape. Between two scrapes of a busy cluster few of them
change: under P5's watch firehose the Trainer text was ~400 KB, and only the TrainJob gauge's ~70 KB
changed from one scrape to the next (the histograms and counters settle once the jobs have finished).
Compressing the whole text again cost ~1 ms in a worker thread per scrape, whose hand-backs waited on the
busy loop; compressing the changed parts cost ~0.35 ms, on the loop.

How: each part is compressed by a compressor of its own and ended with a sync flush, which ends on a byte
boundary; such pieces may follow one another in one raw deflate stream (each starts with an empty
history, which only forgoes matches across parts). Parts are bytes objects, so a part is the same text as
long as it is the same object: pieces are kept by identity, each beside its part (which keeps the part
alive, so its ``id`` cannot be reused meanwhile), and only for the parts of the latest text. The CRC-32 of
the gzip trailer is computed over the parts in sequence (~0.1 ms for 400 KB).

Cost: the kept pieces, which replace the one segment kept before; the parts of the latest text, which stay
alive until the next gzip scrape of that format even after their family replaced them (at most one more
copy of the blocks that changed between two scrapes); and a larger body on the wire: each part
starts without the history before it, so 489 KB of Trainer text in 92 parts compressed to 58 KB, against
44 KB for one compressor over the whole text (a compressor primed with the previous part's text came within
5 % of it, but took twice the time and makes a change cost its successor's piece too). Everything here runs
on the event loop, but ``deflate``, which is pure and may run in a worker thread (zlib releases the GIL while
it compresses).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

__all__ = [
    "LEVEL",
    "DeflatedPart",
    "DeflatedText",
    "Part",
    "PartDeflater",
    "crc32_after",
    "deflate",
    "join_parts",
]

# zlib level of the exposition's gzip (MetricsExposition's default) and of DeflatedPart pieces: the
# fastest, since a scrape's compression runs on the loop or beside it.
LEVEL = 1
_ZEROS = bytes(64 * 1024)


class DeflatedPart:
    """A part kept compressed only: its piece as ``deflate`` makes it, the length and CRC-32 of its text.

    For text that is served far more often than it changes and is large: a gzip scrape puts the piece in
    its body as it is, a plain scrape inflates it (``join_parts``). The pod series keep their blocks so,
    ~10 times smaller than the text (app/metrics/cached_family.py, ``compressed``)."""

    __slots__ = ("crc", "piece", "size")

    def __init__(self, text: bytes, level: int = LEVEL) -> None:
        self.piece = deflate((text,), level)[0]
        self.size = len(text)
        self.crc = zlib.crc32(text)

    def __len__(self) -> int:
        return self.size  # the text's, as for a plain part (protobuf's length prefixes count it)

    def text(self) -> bytes:
        return zlib.decompressobj(-zlib.MAX_WBITS).decompress(self.piece)


Part: TypeAlias = bytes | DeflatedPart


def join_parts(parts: Sequence[Part]) -> bytes:
    """The text of ``parts``, the compressed ones inflated."""
    return b"".join(part.text() if isinstance(part, DeflatedPart) else part for part in parts)


def crc32_after(crc: int, part: Part) -> int:
    """The CRC-32 of a text whose CRC-32 is ``crc`` followed by ``part``'s text. A compressed part's text is
    not at hand: its CRC is appended by linearity (crc(A+B) = crc(zeros(|B|), crc(A)) ^ crc(zeros(|B|)) ^
    crc(B)), at the cost of the CRC of as many zeros as it has bytes, which is what its text would cost."""
    if not isinstance(part, DeflatedPart):
        return zlib.crc32(part, crc)
    size, shifted, zero = part.size, crc, 0
    while size:
        step = _ZEROS if size >= len(_ZEROS) else memoryview(_ZEROS)[:size]
        shifted, zero = zlib.crc32(step, shifted), zlib.crc32(step, zero)
        size -= len(step)
    return shifted ^ zero ^ part.crc


class DeflatedText(NamedTuple):
    """A text as one raw deflate segment that another may follow (it ends on a sync flush, not final)."""

    source: Sequence[Part]  # the parts of the uncompressed text (the caller compares them by identity)
    deflated: bytes
    crc: int  # CRC-32 of the parts' join
    size: int  # length of the parts' join


def deflate(parts: Sequence[bytes], level: int) -> list[bytes]:
    """Each part compressed on its own, ended by a sync flush."""
    out = []
    for part in parts:
        compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        out.append(compressor.compress(part) + compressor.flush(zlib.Z_SYNC_FLUSH))
    return out


class PartDeflater:
    """The deflated segment of a text joined from parts, keeping the pieces of the latest text's parts."""

    __slots__ = ("_level", "_pieces")

    def __init__(self, level: int) -> None:
        self._level = level
        self._pieces: dict[int, tuple[bytes, bytes]] = {}  # id(part) -> (part, its piece)

    def missing(self, parts: Sequence[Part]) -> list[bytes]:
        """The parts without a kept piece (each once; empty and compressed parts need none)."""
        pieces = self._pieces
        seen: set[int] = set()
        out = []
        for part in parts:
            key = id(part)
            if part and not isinstance(part, DeflatedPart) and key not in seen and key not in pieces:
                seen.add(key)
                out.append(part)
        return out

    def segment(
        self, parts: Sequence[Part], fresh: Sequence[bytes], fresh_pieces: Sequence[bytes]
    ) -> DeflatedText:
        """The join of ``parts`` as one segment: ``fresh_pieces`` are ``deflate(fresh)`` for the parts
        ``missing(parts)`` named, the other pieces are the kept ones. Afterwards only ``parts``' pieces are
        kept. A piece dropped since ``missing`` (a concurrent scrape's text replaced the kept ones while
        ``fresh`` was compressed in a thread) is compressed here."""
        kept = self._pieces
        for text, piece in zip(fresh, fresh_pieces, strict=True):
            kept[id(text)] = (text, piece)
        current: dict[int, tuple[bytes, bytes]] = {}
        out = []
        crc = size = 0
        for part in parts:
            if not part:
                continue
            crc = crc32_after(crc, part)
            size += len(part)
            if isinstance(part, DeflatedPart):
                out.append(part.piece)  # compressed already, kept by its owner
                continue
            key = id(part)
            entry = kept.get(key)
            if entry is None:
                entry = kept[key] = (part, deflate((part,), self._level)[0])
            current[key] = entry
            out.append(entry[1])
        self._pieces = current
        return DeflatedText(parts, b"".join(out), crc, size)

    def compress(self, parts: Sequence[Part]) -> DeflatedText:
        """``segment`` with the missing pieces compressed here."""
        fresh = self.missing(parts)
        return self.segment(parts, fresh, deflate(fresh, self._level))

    def clear(self) -> None:
        self._pieces = {}
