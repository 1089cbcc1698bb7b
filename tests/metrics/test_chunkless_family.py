"""A family without chunks (``keep_chunks=False``, app/metrics/cached_family.py), its blocks kept as text or
compressed (``compressed=True``): the same bytes as with chunks in every format, after any sequence of
changes, drops, flushes and scrapes; no text kept per series; no hold nor exemplars."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.metrics import protobuf as pb
from app.metrics.cached_family import Format
from app.metrics.deflate_parts import DeflatedPart, join_parts
from app.metrics.per_job import ValueGaugeFamily

LABELS = ("namespace", "pod", "node")
VALUES = (0.0, 1.0, 2.5, -3.0, 1e21, float("inf"), float("nan"))


def key(i: int) -> tuple[str, str, str]:
    # One label value to escape, and labels not declared in sorted order.
    return (f"ns-{i % 7}", f'pod-{i}"\n\\', f"node-{i % 3}")


def pair(block_series: int = 64, *, compressed: bool = False) -> tuple[ValueGaugeFamily, ValueGaugeFamily]:
    families = (
        ValueGaugeFamily("kubeflow_trainer_trainjob_pod_info", "Pods.", LABELS),
        ValueGaugeFamily(
            "kubeflow_trainer_trainjob_pod_info", "Pods.", LABELS, keep_chunks=False, compressed=compressed
        ),
    )
    for family in families:
        family._block_series = block_series  # small blocks: they fill, empty and merge within a few ops
    return families[0], families[1]


def rendered(family: ValueGaugeFamily, fmt: Format) -> bytes:
    bodies = family.bodies(fmt)
    if fmt is Format.PROTOBUF:  # the length prefix counts a compressed block's text (its len())
        return join_parts(pb.delimited(family.pb_header, bodies))
    header = family.om_header if fmt is Format.OPENMETRICS else family.header
    return header + join_parts(bodies)


def fresh(family: ValueGaugeFamily, fmt: Format) -> bytes:
    """``fmt`` rendered from scratch from ``family``'s values: catches stale bodies both modes would share."""
    new = ValueGaugeFamily(family.name, family.documentation, family.label_names)
    for k, value in family.values.items():
        new.set(k, value)
    return rendered(new, fmt)


def assert_renders(chunked: ValueGaugeFamily, chunkless: ValueGaugeFamily, fmt: Format) -> None:
    text = rendered(chunkless, fmt)
    assert text == rendered(chunked, fmt)
    assert text == fresh(chunkless, fmt)


def assert_same(chunked: ValueGaugeFamily, chunkless: ValueGaugeFamily) -> None:
    """Same series in the same blocks (merges included), whatever has been rendered."""
    assert [list(b.keys) for b in chunkless._blocks] == [list(b.keys) for b in chunked._blocks]
    assert list(chunkless.values) == list(chunked.values)
    assert all(chunkless._block_of[k] is b for b in chunkless._blocks for k in b.keys)


def apply(family: ValueGaugeFamily, op: tuple[str, int, int]) -> None:
    kind, i, v = op
    if kind == "set":
        family.set(key(i), VALUES[v])
    elif kind == "drop":
        family.drop(key(i))
    elif kind == "flush":
        family.flush()


OPS = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 39), st.integers(0, len(VALUES) - 1)),
    st.tuples(st.just("drop"), st.integers(0, 39), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("scrape"), st.integers(0, len(Format) - 1), st.just(0)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 3, 8, 64]), st.lists(OPS, max_size=120), st.booleans())
def test_without_chunks_every_format_renders_the_same_bytes(
    block_series: int, ops: list[tuple[str, int, int]], compressed: bool
) -> None:
    chunked, chunkless = pair(block_series, compressed=compressed)
    for op in ops:
        for family in (chunked, chunkless):
            apply(family, op)
        if op[0] == "scrape":  # formats activate at any point, with changes and drops pending
            assert_renders(chunked, chunkless, Format(op[1]))
        assert_same(chunked, chunkless)
    for fmt in Format:
        assert_renders(chunked, chunkless, fmt)


@pytest.mark.parametrize("compressed", [False, True])
def test_without_chunks_the_default_blocks_grow_empty_and_merge_the_same(compressed: bool) -> None:
    rng = random.Random(7)
    chunked, chunkless = pair(compressed=compressed)
    for step in range(6000):
        r = rng.random()
        i = rng.randrange(400)
        if r < (0.7 if step < 3000 else 0.3):  # grow to a few hundred series, then shrink
            op = ("set", i, rng.randrange(len(VALUES)))
        elif r < 0.97:
            op = ("drop", i, 0)
        else:
            op = ("flush", 0, 0)
        for family in (chunked, chunkless):
            apply(family, op)
        if step % 97 == 0:
            assert_renders(chunked, chunkless, Format(rng.randrange(len(Format))))
    assert_same(chunked, chunkless)
    for fmt in Format:
        assert_renders(chunked, chunkless, fmt)


def test_without_chunks_no_series_text_is_kept() -> None:
    _, family = pair()
    for i in range(300):
        family.set(key(i), float(i))
    for fmt in Format:
        family.bodies(fmt)
    for i in range(0, 300, 3):
        family.set(key(i), -1.0)
    for i in range(1, 300, 3):
        family.drop(key(i))
    for fmt in Format:
        assert family.bodies(fmt)
    assert len(family._blocks) > 1
    assert not any(block.chunks for block in family._blocks)  # no chunk, not even b""
    assert sum(len(block.keys) for block in family._blocks) == len(family)  # only each series' key
    assert all(body for block in family._blocks for body in block.bodies)  # the joins are all it keeps


def test_without_chunks_no_hold_nor_exemplars() -> None:
    _, family = pair()
    with pytest.raises(RuntimeError, match="keep_chunks=False"):
        family.enable_hold()
    with pytest.raises(RuntimeError, match="keep_chunks=False"):
        family.enable_exemplars()
    assert not family._holds and not family._exemplars_on


def test_compressed_blocks_keep_no_text_and_are_a_tenth_of_it() -> None:
    _, family = pair(compressed=True)
    for i in range(640):
        family.set(key(i), 1.0)
    bodies = family.bodies(Format.TEXT)
    assert bodies and all(isinstance(body, DeflatedPart) for body in bodies)
    text = sum(len(body) for body in bodies)
    kept = sum(len(body.piece) for body in bodies if isinstance(body, DeflatedPart))
    assert kept * 5 < text  # label-heavy lines compress ~10 times


def test_compressed_needs_no_chunks() -> None:
    with pytest.raises(ValueError, match="keep_chunks=False"):
        ValueGaugeFamily("f", "F.", LABELS, compressed=True)
