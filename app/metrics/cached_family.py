"""``Family``: the machinery every cached family kind shares: series chunks grouped in blocks, the dirty
series to re-render, and the born-at-zero hold (see app/metrics/series_cache.py for why each exists).

Formats. A series has one chunk per exposition format it renders differently in (``Format``): the text
format 0.0.4, OpenMetrics, and protobuf. OpenMetrics shares the text chunk unless the family carries
exemplars (``enable_exemplars``: the text format has none). A format's chunks are rendered only once a
scrape asked for that format (``bodies(fmt)``: then every series at once, and from then on each touched
series at every flush), so a format nobody scrapes costs nothing; all formats share the blocks, the dirty
set and the hold.

Without chunks (``keep_chunks=False``): for series that change rarely (the pod series: a pod binds, ends,
goes), so that their text is kept once (in the block's join), not twice (also as each series' chunk).
A block keeps only its series' keys, in order, in a list, and a flush re-renders whole blocks of
``block_series`` series for the few that changed. No hold nor exemplars: both live in per-series chunks.

Its own module because the three family kinds (app/metrics/family_kinds.py) and app/metrics/per_job.py's
gauges build on it, while the kinds differ only in their numbers and how one series renders.
Everything here runs on the event loop thread: there is no lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from enum import IntEnum
from typing import Generic, TypeVar

from prometheus_client.metrics_core import Metric

from app.metrics import protobuf as pb
from app.metrics.deflate_parts import DeflatedPart, Part
from app.metrics.formatting import LabelValues, escape_help, escape_label_value

__all__ = ["Family", "Format", "Key"]

# What a family's entries are keyed by: a series' label values, or (app/metrics/record_family.py) its
# owner's key of the record its series are rendered from.
Key = TypeVar("Key", bound=Hashable)


class Format(IntEnum):
    """The exposition formats a family renders."""

    TEXT = 0  # text format 0.0.4
    OPENMETRICS = 1  # OpenMetrics 1.0 (without the final # EOF)
    PROTOBUF = 2  # delimited io.prometheus.client.MetricFamily


_PB_TYPES = {
    "counter": pb.MetricType.COUNTER,
    "gauge": pb.MetricType.GAUGE,
    "histogram": pb.MetricType.HISTOGRAM,
}


# Prefixes of dropped series kept per family for a series that comes back (``Family._prefix``).
_GONE_PREFIXES = 512


class _Block(Generic[Key]):
    """A run of consecutive series of one family and their joined chunks, per slot (a slot per format the
    family renders differently in).

    Why blocks: joining tens of thousands of small chunks scattered over the heap is slow (cache and
    TLB misses: ~5-10 ms for 7 MB measured, against ~1 ms from a few thousand contiguous blocks).
    A change re-joins only the blocks it touched; a scrape joins the blocks.

    Size: with chunks a block holds each of its series' chunks once per slot and their join once per
    slot, so a family costs about twice its rendered bodies in every slot a scrape asked for, and ~200
    bytes of dict entry per series and slot; without (``keep_chunks=False``) only the joins, once, and
    its series in a list (8 B each, a dict entry is ~40), which every slot shares. Sparse blocks are
    merged (``Family._merge_sparse``), so a family of ``n`` series has at most ``2 n / block_series + 1``
    blocks whatever the order its series ended in."""

    __slots__ = ("bodies", "chunks", "keys")

    def __init__(self, slots: int, keep_chunks: bool) -> None:
        # With chunks, every slot's dict holds every series of the block, in the same order (b"" until
        # rendered); without, none.
        self.chunks: list[dict[Key, bytes]] = [{} for _ in range(slots)] if keep_chunks else []
        # The block's series in order: the first slot's dict, or without chunks a list of their keys.
        self.keys: dict[Key, bytes] | list[Key] = self.chunks[0] if keep_chunks else []
        self.bodies: list[Part | None] = [None] * slots


class Family(Generic[Key]):
    """One metric family: a rendered chunk per series (unless ``keep_chunks`` is off), grouped in blocks,
    and the series to re-render."""

    __slots__ = (
        "_active",
        "_block_of",
        "_block_series",
        "_blocks",
        "_compressed",
        "_dirty",
        "_exemplars_on",
        "_gone_prefixes",
        "_held",
        "_holds",
        "_keep_chunks",
        "_order",
        "_pb_labels_cache",
        "_prefixes",
        "_releases",
        "_renderers",
        "_slot_of",
        "_unserved",
        "changed",
        "documentation",
        "header",
        "label_names",
        "name",
        "om_header",
        "pb_header",
    )

    def __init__(
        self,
        name: str,
        documentation: str,
        mtype: str,
        label_names: Sequence[str],
        *,
        block_series: int = 64,
        keep_chunks: bool = True,
        compressed: bool = False,
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
        # Protobuf: the family name is the text format's (counters with _total), the help unescaped.
        self.pb_header = pb.family_header(name, documentation, _PB_TYPES[mtype])
        # Format -> slot of the chunks it is rendered from, and per slot (render, render zero). OpenMetrics
        # reads the text chunks until enable_exemplars gives it a slot of its own.
        self._slot_of = [0, 0, 1]
        self._renderers: list[tuple[Callable[[Key], bytes], Callable[[Key], bytes]]] = [
            (self._render_series, self._render_zero),
            (self._render_protobuf, self._render_zero_protobuf),
        ]
        self._active: list[int] = []  # slots a scrape asked for: kept rendered
        self._exemplars_on = False
        self._pb_labels_cache: dict[Hashable, bytes] | None = {}
        # The text format lists labels sorted by name; keys keep the declared order.
        self._order = sorted(range(len(self.label_names)), key=lambda i: self.label_names[i])
        # A new series always goes to the last block, and the state dicts of the subclasses insert
        # and delete keys at the same moments, so blocks (in order) list series in the same order as
        # the state dicts: the text and the Collector agree byte for byte.
        self._block_series = block_series
        self._keep_chunks = keep_chunks  # see the module docstring, "Without chunks"
        if compressed and keep_chunks:
            raise ValueError(f"{name}: compressed blocks keep no chunks (keep_chunks=False)")
        self._compressed = compressed
        self._blocks: list[_Block[Key]] = []
        self._block_of: dict[Key, _Block[Key]] = {}
        self._dirty: set[Key] = set()
        self._prefixes: dict[Hashable, bytes] = {}
        # The prefixes of the latest dropped series, oldest first (see ``_prefix``).
        self._gone_prefixes: dict[Hashable, bytes] = {}
        self.changed = False  # anything changed since the last render (cleared by SeriesCache)
        # Born at zero (see the module docstring): series rendered as zeros, those among them no served
        # render has shown yet (their hold has not started), and (release time, series) in time order.
        self._holds = False
        self._held: set[Key] = set()
        self._unserved: list[Key] = []
        self._releases: deque[tuple[float, Key]] = deque()

    def __len__(self) -> int:
        return len(self._block_of)

    def enable_exemplars(self) -> None:
        """Render OpenMetrics from chunks of its own (``_render_openmetrics``: the text with exemplars).
        Before the first series is added."""
        if not self._keep_chunks:
            raise RuntimeError(f"{self.name}: exemplars need the series chunks (keep_chunks=False)")
        if self._blocks or len(self._renderers) > 2:
            raise RuntimeError("enable_exemplars before any series, once")
        self._slot_of = [0, 1, 2]
        self._renderers.insert(1, (self._render_openmetrics, self._render_zero_openmetrics))
        self._exemplars_on = True

    def enable_hold(self) -> None:
        """Render every series added from now on as zeros until ``serve`` releases it."""
        if not self._keep_chunks:
            raise RuntimeError(f"{self.name}: a hold needs the series chunks (keep_chunks=False)")
        self._holds = True

    def held(self, key: Key) -> bool:
        """``key`` is shown as zeros (its real values are not served yet)."""
        return key in self._held

    @property
    def held_count(self) -> int:
        return len(self._held)

    def serve(self, now: float, hold: float) -> list[Key]:
        """A render at ``now`` is about to be served: release the series whose hold has ended (they are
        re-rendered with their real values) and start the hold of those this render shows for the first
        time (released at the first served render at or after ``now + hold``: never this one, even with
        ``hold`` 0). Returns the released series."""
        released: list[Key] = []
        releases = self._releases
        while releases and releases[0][0] <= now:
            key = releases.popleft()[1]
            self._held.discard(key)
            self._dirty.add(key)
            self._released(key)
            released.append(key)
        if released:
            self.changed = True
        if self._unserved:
            at = now + hold
            releases.extend((at, key) for key in self._unserved)
            self._unserved = []
        return released

    def _released(self, key: Key) -> None:
        """``key``'s hold ended (kinds that keep something for held series drop it here)."""

    def _add_series(self, key: Key) -> None:
        blocks = self._blocks
        if not blocks or len(blocks[-1].keys) >= self._block_series:
            blocks.append(_Block(len(self._renderers), self._keep_chunks))
        block = blocks[-1]
        keys = block.keys
        if isinstance(keys, list):
            keys.append(key)
        for chunks in block.chunks:
            chunks[key] = b""  # placeholder holding the key's position; rendered at the next flush
        self._block_of[key] = block
        if self._holds:
            self._held.add(key)
            self._unserved.append(key)

    def _drop_series(self, key: Key) -> None:
        prefix = self._prefixes.pop(key, None)
        if prefix is not None:
            gone = self._gone_prefixes
            if len(gone) >= _GONE_PREFIXES:
                del gone[next(iter(gone))]
            gone[key] = prefix
        if self._pb_labels_cache is not None:
            self._pb_labels_cache.pop(key, None)
        block = self._block_of.pop(key)
        keys = block.keys
        if isinstance(keys, list):
            keys.remove(key)  # O(block_series)
        for chunks in block.chunks:
            chunks.pop(key, None)
        block.bodies = [None] * len(block.bodies)
        if not keys:
            self._blocks.remove(block)  # O(blocks), only when a block empties
        elif 2 * len(keys) <= self._block_series:
            self._merge_sparse(block)
        self._dirty.discard(key)
        self.changed = True

    def _merge_sparse(self, block: _Block[Key]) -> None:
        """``block`` is at most half full: merge it with a neighbour if both fit in one block.

        Series come and go in any order (a label set ends when its last TrainJob does), so without this a
        family whose series turned over keeps a block per surviving straggler: 22 blocks for 200 gauge
        series were seen after an hour. With it no two neighbouring blocks fit in one, so a family of
        ``n`` series has at most ``2 n / block_series + 1`` blocks. Order is kept (the earlier block takes
        the later one's series at its end), so the text still lists series in the state dicts' order.
        O(blocks) to find the neighbour, only when a drop leaves a block half empty."""
        blocks = self._blocks
        i = blocks.index(block)
        size = len(block.keys)
        if i + 1 < len(blocks) and size + len(blocks[i + 1].keys) <= self._block_series:
            first, second = block, blocks[i + 1]
        elif i > 0 and size + len(blocks[i - 1].keys) <= self._block_series:
            first, second = blocks[i - 1], block
        else:
            return
        block_of = self._block_of
        keys = first.keys
        if isinstance(keys, list):
            keys.extend(second.keys)
        for slot, chunks in enumerate(first.chunks):
            chunks.update(second.chunks[slot])
        first.bodies = [None] * len(first.bodies)
        for key in second.keys:
            block_of[key] = first
        blocks.remove(second)

    def _clear(self) -> None:
        self._blocks = []
        self._block_of = {}
        self._dirty = set()
        self._prefixes = {}
        self._gone_prefixes = {}
        if self._pb_labels_cache is not None:
            self._pb_labels_cache = {}
        self._held = set()
        self._unserved = []
        self._releases = deque()
        self.changed = True

    def touch(self, key: Key) -> None:
        """Re-render ``key`` at the next flush; also for numbers its owner changed in place."""
        if key in self._held and self._active and self._block_of[key].chunks[self._active[0]][key]:
            return  # its zero chunks are rendered already and stay until the release (never without chunks)
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
        path re-renders only the value (two gauge series move on every TrainJob state change).

        A series that comes back soon after it went (a gauge whose count fell to 0 and rose again: under a
        watch firehose, rendering such prefixes again was a quarter of a publish's work) takes its
        prefix from the last ``_GONE_PREFIXES`` dropped ones."""
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._gone_prefixes.pop(key, None)
            if prefix is None:
                prefix = f"{self.name}{self._labelstr(key)} ".encode()
            self._prefixes[key] = prefix
        return prefix

    def _pb_labels(self, key: LabelValues) -> bytes:
        """The series' label pairs as protobuf fields, sorted by name; cached per series unless the family
        turns the cache off (the per-TrainJob gauges: thousands of series, most rendered once)."""
        cache = self._pb_labels_cache
        if cache is not None:
            labels = cache.get(key)
            if labels is None:
                labels = cache[key] = self._pb_label_pairs(key)
            return labels
        return self._pb_label_pairs(key)

    def _pb_label_pairs(self, key: LabelValues) -> bytes:
        names = self.label_names
        return pb.label_pairs((names[i], key[i]) for i in self._order)

    def _render_series(self, key: Key) -> bytes:
        raise NotImplementedError

    def _render_zero(self, key: Key) -> bytes:
        """The series with every value 0 (born at zero); only families with a hold use it."""
        raise NotImplementedError

    def _render_openmetrics(self, key: Key) -> bytes:
        """The series in OpenMetrics with its exemplars (families that ``enable_exemplars``)."""
        raise NotImplementedError

    def _render_zero_openmetrics(self, key: Key) -> bytes:
        raise NotImplementedError

    def _render_protobuf(self, key: Key) -> bytes:
        """The series as one Metric field of its MetricFamily (``pb.metric_field``)."""
        raise NotImplementedError

    def _render_zero_protobuf(self, key: Key) -> bytes:
        raise NotImplementedError

    def metric(self) -> Metric:
        """The family as a prometheus_client metric family, series in the same order as the text."""
        raise NotImplementedError

    def flush(self) -> None:
        """Re-render the dirty series in every active slot and re-join the blocks they are in (without
        chunks: re-render those blocks)."""
        if not self._dirty:
            return
        active = self._active
        if not active:
            return  # nothing rendered yet: the first scrape renders every series of its format
        block_of = self._block_of
        blocks: dict[int, _Block[Key]] = {}
        if self._keep_chunks:
            held = self._held
            renderers = [(slot, *self._renderers[slot]) for slot in active]
            for key in self._dirty:
                block = block_of[key]
                zero = key in held
                for slot, render, render_zero in renderers:
                    block.chunks[slot][key] = render_zero(key) if zero else render(key)
                blocks[id(block)] = block
        else:
            for key in self._dirty:
                block = block_of[key]
                blocks[id(block)] = block
        self._dirty.clear()
        for block in blocks.values():
            for slot in active:
                block.bodies[slot] = self._join(block, slot)

    def _join(self, block: _Block[Key], slot: int) -> Part:
        """``block``'s body in ``slot``: its chunks joined, or without chunks its series rendered (and
        compressed, when so built)."""
        if self._keep_chunks:
            return b"".join(block.chunks[slot].values())
        text = b"".join(map(self._renderers[slot][0], block.keys))
        return DeflatedPart(text) if self._compressed else text

    def bodies(self, fmt: Format = Format.TEXT) -> list[Part]:
        """The joined blocks of ``fmt``, up to date. The caller puts the header before them."""
        slot = self._slot_of[fmt]
        if slot not in self._active:
            self._activate(slot)
        self.flush()
        out = []
        for block in self._blocks:
            body = block.bodies[slot]
            if body is None:  # a series was dropped from it, or (without chunks) its slot just activated
                body = block.bodies[slot] = self._join(block, slot)
            out.append(body)
        return out

    def _activate(self, slot: int) -> None:
        """A scrape asks for a format for the first time: render every series in its slot (flush renders
        the dirty ones in it from now on). Without chunks there is nothing per series: ``bodies`` renders
        each block, after the flush that re-renders those holding a dirty series (each block once)."""
        render, render_zero = self._renderers[slot]
        held = self._held
        dirty = self._dirty
        keep = self._keep_chunks
        for block in self._blocks:
            if keep:
                chunks = block.chunks[slot]
                for key in chunks:
                    # A dirty series is rendered by the flush that follows, in every active slot.
                    if key not in dirty:
                        chunks[key] = render_zero(key) if key in held else render(key)
            block.bodies[slot] = None
        self._active.append(slot)
