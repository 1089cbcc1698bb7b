from __future__ import annotations

from decimal import Decimal

import pytest

from app.trainer.quantity import INT64_MAX, accelerator_count, parse_quantity


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("1", 1),
        ("2", 2),
        (2, 2),  # YAML writes an int (the torchtune runtimes do)
        (2.0, 2),
        ("0", 0),
        ("500m", 1),  # fractional: rounded up, as Quantity.Value()
        ("1500m", 2),
        ("0.5", 1),
        (".5", 1),
        ("1k", 1000),
        ("1Ki", 1024),
        ("2Mi", 2 * 2**20),
        ("4e0", 4),
        ("4E1", 40),
        ("1e-3", 1),
        ("+3", 3),
        ("-1", 0),  # negatives count as nothing
        ("1u", 1),
        ("3n", 1),
        ("1e100", INT64_MAX),  # clamped like an int64
        ("9Ei", INT64_MAX),
        (1.5, 2),
    ],
)
def test_accelerator_count(value: object, count: int) -> None:
    assert accelerator_count(value) == count


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        "",
        "abc",
        "1.2.3",
        "1KiB",
        "e3",
        "1 Gi",
        "m",
        float("nan"),
        float("inf"),
        [],
        {},
        "9" * 100,
    ],
)
def test_invalid_quantities(value: object) -> None:
    assert parse_quantity(value) is None
    assert accelerator_count(value) is None


def test_exact_values() -> None:
    assert parse_quantity("1.5k") == Decimal(1500)
    assert parse_quantity("250m") == Decimal("0.250")
    assert parse_quantity("1e-50") == 0
