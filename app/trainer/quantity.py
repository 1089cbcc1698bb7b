"""Kubernetes resource quantities ("2", "500m", "1k", "1Ki", "4e0") as whole accelerator counts.

Pure and tolerant: anything that is not a valid quantity yields ``None`` instead of raising, so a
malformed TrainJob can never break an informer handler.

Rounding: a fractional count is rounded UP, as Kubernetes' ``Quantity.Value()`` does (upstream
#4190 observes ``quantity.Value()``), so "500m" GPUs counts as 1. Extended resources such as
``nvidia.com/gpu`` must be whole numbers in a pod anyway; rounding up never hides a request.
Negative quantities count as 0. Values are clamped to int64, like Kubernetes' own representation.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Final

INT64_MAX: Final = 2**63 - 1

# <signedNumber><suffix>, suffix ∈ binarySI | decimalSI | decimalExponent (apimachinery quantity.go).
_QUANTITY_RE: Final = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_EXP: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_TEXT: Final = 64  # a quantity is short; refuse to parse megabytes of junk
_MAX_EXPONENT: Final = 40  # beyond this every value clamps anyway; avoids huge Decimal -> int work


def parse_quantity(value: object) -> Decimal | None:
    """The exact value of a quantity given as a JSON string or number; ``None`` when invalid."""
    if isinstance(value, bool):  # bool is an int subclass; true is not a quantity
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return Decimal(repr(value))
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        return None
    m = _QUANTITY_RE.match(value.strip())
    if m is None:
        return None
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:  # pragma: no cover - the regex only admits valid decimals
        return None
    suffix = m.group(2)
    if not suffix:
        return number
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    exponent = _DECIMAL_EXP[suffix] if suffix in _DECIMAL_EXP else int(suffix[1:])
    if exponent > _MAX_EXPONENT:
        return Decimal(INT64_MAX) if number > 0 else Decimal(0)
    if exponent < -_MAX_EXPONENT:
        return Decimal(0)
    return number.scaleb(exponent)


def accelerator_count(value: object) -> int | None:
    """Whole accelerators for a quantity: rounded up, negatives → 0, clamped to int64; ``None`` if invalid."""
    q = parse_quantity(value)
    if q is None:
        return None
    if q <= 0:
        return 0
    if q >= INT64_MAX:
        return INT64_MAX
    return int(q.to_integral_value(rounding=ROUND_CEILING))
