from __future__ import annotations

from decimal import Decimal

import pytest

from app.trainer.quantity import INT64_MAX, NOT_A_COUNT, device_count, parse_quantity


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("1", 1),
        ("2", 2),
        (2, 2),  # YAML writes an int (the torchtune runtimes do)
        (2.0, 2),
        ("2.0", 2),
        ("0", 0),
        ("4e0", 4),  # the exponent form is a plain number
        ("4E1", 40),
        ("+3", 3),
        ("-1", 0),  # negatives count as nothing
        ("1e100", INT64_MAX),  # clamped like an int64
        (2**70, INT64_MAX),
        # Not a whole count: a size, a share or a fraction is never a number of devices (issue 22, finding 2;
        # #4190 rounded them up with Quantity.Value(): `gpu.intel.com/memory.max: 8G` read as 8e9 devices).
        ("8G", NOT_A_COUNT),
        ("16Gi", NOT_A_COUNT),
        ("500m", NOT_A_COUNT),
        ("1500m", NOT_A_COUNT),
        ("1k", NOT_A_COUNT),  # a unit suffix, even on a whole value
        ("1Ki", NOT_A_COUNT),
        ("2Mi", NOT_A_COUNT),
        ("1u", NOT_A_COUNT),
        ("3n", NOT_A_COUNT),
        ("9Ei", NOT_A_COUNT),
        ("1.5", NOT_A_COUNT),
        ("0.5", NOT_A_COUNT),
        (".5", NOT_A_COUNT),
        ("1e-3", NOT_A_COUNT),
        (1.5, NOT_A_COUNT),
    ],
)
def test_device_count(value: object, count: int) -> None:
    assert device_count(value) == count


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
    assert device_count(value) is None


def test_exact_values() -> None:
    assert parse_quantity("1.5k") == Decimal(1500)
    assert parse_quantity("250m") == Decimal("0.250")
    assert parse_quantity("1e-50") == 0
