"""How the text formats spell label values, HELP text and numbers, as prometheus_client spells them.

Its own module because every family kind, and app/metrics/per_job.py's, render with these, and the
byte-for-byte agreement with prometheus_client rests on them alone.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string

__all__ = ["LabelValues", "escape_help", "escape_label_value", "floatToGoString", "fmt_int"]

LabelValues = tuple[str, ...]

# prometheus_client ships it untyped; pin its type once here for mypy --strict.
floatToGoString: Callable[[float], str] = _untyped_float_to_go_string


def escape_label_value(value: str) -> str:
    r"""Escape a label value for the text formats: ``\`` → ``\\``, newline → ``\n``, ``"`` → ``\"``."""
    # Same order as prometheus_client (backslash first, so the escapes added after are not doubled).
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def fmt_int(n: int) -> str:
    # floatToGoString(float(n)) without the float round trip for the common case; from 1e6 on, Go (and
    # so prometheus_client) switches to exponent notation ("1.234567e+06"), so defer to it there.
    if 0 <= n < 1_000_000:
        return f"{n}.0"
    return floatToGoString(float(n))
