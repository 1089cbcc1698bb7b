"""status.trainerStatus rules (app/trainer/progress.py): what parses as a number, what is a usable name,
and what is skipped and counted."""

from __future__ import annotations

import pytest

from app.trainer.progress import is_metric_name, metric_value, trainer_progress


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("0.4210", 0.421),
        ("-3", -3.0),
        ("1e-05", 1e-05),
        ("2.5E+3", 2500.0),
        (".5", 0.5),
        ("7.", 7.0),
        (3, 3.0),  # a JSON number, written around the CRD's string type
        (0.25, 0.25),
        # Not measurements: text, Go/Python float spellings of non-numbers, quantities, percentages.
        ("nan", None),
        ("Inf", None),
        ("1_000", None),
        (" 1", None),
        ("1k", None),
        ("95%", None),
        ("0.93 (best)", None),
        ("s3://checkpoints/step-300", None),
        ("", None),
        ("1" * 65, None),  # longer than the CRD allows
        ("1e999", None),  # overflows to infinity
        (True, None),
        (None, None),
    ],
)
def test_metric_value(value: object, parsed: float | None) -> None:
    assert metric_value(value) == parsed


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("loss", True),
        ("train/loss", True),
        ('eval "acc"', True),
        ("a\nb", False),
        ("", False),
        ("x" * 65, False),
    ],
)
def test_metric_name(name: str, ok: bool) -> None:
    assert is_metric_name(name) is ok


def test_out_of_range_fields_are_not_readings_and_the_cap_keeps_the_first_metrics() -> None:
    progress = trainer_progress(
        101,  # above 100: refused by the API server, not clamped here
        -1,
        "not a time",
        [("a", "1"), ("b", "x"), (None, "2"), ("a", "3"), ("c", "4"), ("d", "5")],
        max_metrics=2,
    )
    assert (progress.percent, progress.remaining_seconds, progress.updated) == (None, None, None)
    assert progress.metrics == (("a", 1.0), ("c", 4.0))
    assert (progress.skipped_unparsable, progress.skipped_invalid_name, progress.skipped_over_cap) == (
        1,
        2,
        1,
    )


def test_a_hostile_list_is_read_up_to_a_bound() -> None:
    progress = trainer_progress(50, 10, None, [(f"m{i}", "1") for i in range(10_000)], max_metrics=16)
    assert len(progress.metrics) == 16
    assert progress.skipped_over_cap == 10_000 - 16


def test_a_repeated_name_is_skipped_even_when_its_first_value_was_not_a_number() -> None:
    # docs/metrics.md: a repeated name is skipped. The first "loss" (NaN) is no reading; the second must not
    # stand in for it, or the series would show a value the trainer wrote second.
    progress = trainer_progress(50, 10, None, [("loss", "NaN"), ("loss", "0.5"), ("acc", "0.9")])
    assert progress.metrics == (("acc", 0.9),)
    assert (progress.skipped_unparsable, progress.skipped_invalid_name) == (1, 1)
