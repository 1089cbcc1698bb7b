"""Kubernetes resource quantities ("2", "500m", "1k", "1Ki", "4e0") and the device counts they can be.

Pure and tolerant: anything that is not a valid quantity yields ``None`` instead of raising, so a
malformed TrainJob can never break an informer handler.

A device count is a whole number written as a plain number ("8", 8, "4e0"): a quantity with a unit suffix
("8G", "16Gi", "500m") is a size or a share, never a number of devices, and neither is a fraction ("1.5").
Device plugins advertise such quantities beside their devices (Intel's ``gpu.intel.com/memory.max: 8G``,
``gpu.intel.com/millicores``), and the API server accepts only integers for extended resources in a pod
(kubernetes ``pkg/apis/core/validation`` validateResourceQuantityValue: "must be an integer"), so no
real accelerator request is lost by refusing them; #4190 rounded them up with ``Quantity.Value()``, which
read ``memory.max: 8G`` as 8e9 accelerators. Negative counts are 0; counts are clamped to int64, like
Kubernetes' own representation.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
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


# What device_count returns for a valid quantity that is not a whole count: never a number of devices
# (every rule that counts reads only counts above 0).
NOT_A_COUNT: Final = -1
# The suffixes of sizes and shares (binary and decimal SI); the exponent form ("4e0") is a plain number.
_UNIT_SUFFIXES: Final = frozenset(_BINARY) | frozenset(_DECIMAL_EXP)


def device_count(value: object) -> int | None:
    """The number of devices a quantity asks for: a whole number written without a unit, negatives → 0,
    clamped to int64; ``NOT_A_COUNT`` for a valid quantity that is a size, a share or a fraction ("8G",
    "500m", "1.5"); ``None`` if it is not a quantity at all."""
    if isinstance(value, str) and len(value) <= _MAX_TEXT:
        m = _QUANTITY_RE.match(value.strip())
        if m is not None and m.group(2) in _UNIT_SUFFIXES:
            return NOT_A_COUNT
    q = parse_quantity(value)
    if q is None:
        return None
    if q != q.to_integral_value():
        return NOT_A_COUNT
    if q <= 0:
        return 0
    if q >= INT64_MAX:
        return INT64_MAX
    return int(q)
