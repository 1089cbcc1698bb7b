"""CEL values for the rule compiler (:mod:`kubesim.apiserver.schema.cel`): its error types, the environment
and evaluator types, and CEL's value semantics (equality, ordering, bool checks, RE2-like regexes), kept apart
so the lexer, parser and evaluators share one definition of what a CEL value is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Env = dict[str, Any]
Evaluator = Callable[[Env], Any]


class CelCompileError(ValueError):
    """The rule is not valid CEL or uses something outside the supported subset."""


class CelEvalError(Exception):
    """A runtime error of a rule (no such key, no matching overload, ...); the rule then fails."""


def type_name(value: Any) -> str:
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def cel_equal(a: Any, b: Any) -> bool:
    """CEL equality: bools are not numbers, ints and doubles compare by value, lists and maps deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(cel_equal(v, b[k]) for k, v in a.items())
    if type(a) is not type(b):
        return False
    return bool(a == b)


def ordered(op: str, a: Any, b: Any) -> bool:
    num = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        ok = isinstance(a, bool) and isinstance(b, bool)
    else:
        ok = (isinstance(a, num) and isinstance(b, num)) or (type(a) is type(b) and isinstance(a, str))
    if not ok:
        raise CelEvalError(f"no such overload: {type_name(a)} {op} {type_name(b)}")
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelEvalError(f"no such overload: expected bool, got {type_name(value)}")
    return value


def re2_pattern(pattern: str) -> re.Pattern[str]:
    """A Python regex that matches like RE2 for the patterns CRDs use (see
    :mod:`kubesim.apiserver.schema.cel`)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    try:
        return re.compile("".join(out))
    except re.error as exc:
        raise CelEvalError(f"invalid regex {pattern!r}: {exc}") from None
