"""``Family``: the machinery every cached family kind shares: series chunks grouped in blocks, the dirty
series to re-render, and the born-at-zero hold (see app/metrics/series.py for why each exists).

Its own module because the three family kinds (app/metrics/families.py) and app/metrics/per_job.py's
gauges build on it, while the kinds differ only in their numbers and how one series renders.
Everything here runs on the event loop thread: there is no lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from prometheus_client.metrics_core import Metric

from app.metrics.formatting import LabelValues, escape_help, escape_label_value

__all__ = ["Family"]


class _Block:
    """A run of consecutive series of one family and their joined text.

    Why blocks: joining tens of thousands of small chunks scattered over the heap is slow (cache and
    TLB misses: ~5-10 ms for 7 MB measured, against ~1 ms from a few thousand contiguous blocks).
    A change re-joins only the blocks it touched; a scrape joins the blocks."""

    __slots__ = ("body", "chunks")

    def __init__(self) -> None:
        self.chunks: dict[LabelValues, bytes] = {}
        self.body: bytes | None = None


class Family:
    """One metric family: a rendered chunk per series, grouped in blocks, and the series to re-render."""

    __slots__ = (
        "_block_of",
        "_block_series",
        "_blocks",
        "_dirty",
        "_held",
        "_holds",
        "_order",
        "_prefixes",
        "_releases",
        "_unserved",
        "changed",
        "documentation",
        "header",
        "label_names",
        "name",
        "om_header",
    )

    def __init__(
        self, name: str, documentation: str, mtype: str, label_names: Sequence[str], *, block_series: int = 64
    ) -> None:
        self.name = name  # name on the HELP/TYPE lines of the text format (counters: with _total)
        self.documentation = documentation
        self.label_names = tuple(label_names)
        self.header = f"# HELP {name} {escape_help(documentation)}\n# TYPE {name} {mtype}\n".encode()
        # OpenMetrics differs only in the family name of counters (no _total) and HELP escaping; the
        # sample lines are the same, so both formats share the series chunks.
        om_name = name.removesuffix("_total") if mtype == "counter" else name
        om_help = escape_help(documentation).replace('"', r"\"")
        self.om_header = f"# HELP {om_name} {om_help}\n# TYPE {om_name} {mtype}\n".encode()
        # The text format lists labels sorted by name; keys keep the declared order.
        self._order = sorted(range(len(self.label_names)), key=lambda i: self.label_names[i])
        # A new series always goes to the last block, and the state dicts of the subclasses insert
        # and delete keys at the same moments, so blocks (in order) list series in the same order as
        # the state dicts: the text and the Collector agree byte for byte.
        self._block_series = block_series
        self._blocks: list[_Block] = []
        self._block_of: dict[LabelValues, _Block] = {}
        self._dirty: set[LabelValues] = set()
        self._prefixes: dict[LabelValues, bytes] = {}
        self.changed = False  # anything changed since the last render (cleared by SeriesCache)
        # Born at zero (see the module docstring): series rendered as zeros, those among them no served
        # render has shown yet (their hold has not started), and (release time, series) in time order.
        self._holds = False
        self._held: set[LabelValues] = set()
        self._unserved: list[LabelValues] = []
        self._releases: deque[tuple[float, LabelValues]] = deque()

    def __len__(self) -> int:
        return len(self._block_of)

    def enable_hold(self) -> None:
        """Render every series added from now on as zeros until ``serve`` releases it."""
        self._holds = True

    def held(self, key: LabelValues) -> bool:
        """``key`` is shown as zeros (its real values are not served yet)."""
        return key in self._held

    @property
    def held_count(self) -> int:
        return len(self._held)

    def serve(self, now: float, hold: float) -> list[LabelValues]:
        """A render at ``now`` is about to be served: release the series whose hold has ended (they are
        re-rendered with their real values) and start the hold of those this render shows for the first
        time (released at the first served render at or after ``now + hold``: never this one, even with
        ``hold`` 0). Returns the released series."""
        released: list[LabelValues] = []
        releases = self._releases
        while releases and releases[0][0] <= now:
            key = releases.popleft()[1]
            self._held.discard(key)
            self._dirty.add(key)
            released.append(key)
        if released:
            self.changed = True
        if self._unserved:
            at = now + hold
            releases.extend((at, key) for key in self._unserved)
            self._unserved = []
        return released

    def _add_series(self, key: LabelValues) -> None:
        blocks = self._blocks
        if not blocks or len(blocks[-1].chunks) >= self._block_series:
            blocks.append(_Block())
        block = blocks[-1]
        block.chunks[key] = b""  # placeholder holding the key's position; rendered at the next scrape
        self._block_of[key] = block
        if self._holds:
            self._held.add(key)
            self._unserved.append(key)

    def _drop_series(self, key: LabelValues) -> None:
        self._prefixes.pop(key, None)
        block = self._block_of.pop(key)
        del block.chunks[key]
        block.body = None
        if not block.chunks:
            self._blocks.remove(block)  # O(blocks), only when a block empties
        self._dirty.discard(key)
        self.changed = True

    def _clear(self) -> None:
        self._blocks = []
        self._block_of = {}
        self._dirty = set()
        self._prefixes = {}
        self._held = set()
        self._unserved = []
        self._releases = deque()
        self.changed = True

    def touch(self, key: LabelValues) -> None:
        """Re-render ``key`` at the next flush; also for numbers its owner changed in place."""
        if key in self._held and self._block_of[key].chunks[key]:
            return  # its zero text is rendered already and stays until the release
        self._dirty.add(key)
        self.changed = True

    def _sorted_pairs(self, key: LabelValues) -> list[tuple[str, str]]:
        names = self.label_names
        return [(names[i], escape_label_value(key[i])) for i in self._order]

    def _labelstr(self, key: LabelValues) -> str:
        if not key:
            return ""
        return "{" + ",".join(f'{n}="{v}"' for n, v in self._sorted_pairs(key)) + "}"

    def _prefix(self, key: LabelValues) -> bytes:
        """``name{labels} `` of a single-sample series, escaped and sorted once per series: the hot
        path re-renders only the value (two gauge series move on every TrainJob state change)."""
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefixes[key] = f"{self.name}{self._labelstr(key)} ".encode()
        return prefix

    def _render_series(self, key: LabelValues) -> bytes:
        raise NotImplementedError

    def _render_zero(self, key: LabelValues) -> bytes:
        """The series with every value 0 (born at zero); only families with a hold use it."""
        raise NotImplementedError

    def metric(self) -> Metric:
        """The family as a prometheus_client metric family, series in the same order as the text."""
        raise NotImplementedError

    def flush(self) -> None:
        """Re-render the dirty series and re-join the blocks they are in."""
        if not self._dirty:
            return
        block_of = self._block_of
        render = self._render_series
        held = self._held
        blocks: dict[int, _Block] = {}
        for key in self._dirty:
            block = block_of[key]
            block.chunks[key] = self._render_zero(key) if key in held else render(key)
            blocks[id(block)] = block
        self._dirty.clear()
        for block in blocks.values():
            block.body = b"".join(block.chunks.values())

    def bodies(self) -> list[bytes]:
        """The joined blocks, up to date. The caller puts the header before them."""
        self.flush()
        out = []
        for block in self._blocks:
            body = block.body
            if body is None:  # a series was dropped from it
                body = block.body = b"".join(block.chunks.values())
            out.append(body)
        return out
