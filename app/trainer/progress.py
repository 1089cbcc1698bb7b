"""``status.trainerStatus`` of a TrainJob (KEP-2779, alpha, feature gate ``TrainJobStatus``): pure rules.

What the training runtime reports about itself: ``progressPercentage`` (int32, 0-100),
``estimatedRemainingSeconds`` (int32 >= 0), ``metrics[{name, value}]`` (at most 256, both strings of 1 to 64
characters, "Values must be serialized as a string") and ``lastUpdatedTime`` (kubeflow/trainer v2.3.0 CRD,
``trainer.kubeflow.org_trainjobs.yaml``). Only the opt-in per-TrainJob series read it
(app/metrics/per_job.py), so it is projected only when they are on (app/trainer/informer_projectors.py).

A trainer metric becomes a series only when its value parses as a finite decimal number and its name is a
usable label value (``is_metric_name``); the rest is skipped and counted, never guessed at: a value such as
``"0.93 (best)"`` or ``"s3://bucket/ckpt-300"`` is text, not a number. At most ``max_metrics`` metrics are
kept per job, in the order written (the runtime lists the ones it cares about first).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from app.trainer.rules import parse_time

__all__ = [
    "DEFAULT_MAX_TRAINER_METRICS",
    "MAX_METRIC_NAME",
    "TrainerProgress",
    "is_metric_name",
    "json_metrics",
    "metric_value",
    "trainer_progress",
]

# The CRD's limits: a name or value of at most 64 characters, at most 256 metrics.
MAX_METRIC_NAME: Final = 64
MAX_METRIC_VALUE: Final = 64
MAX_METRICS_READ: Final = 256  # entries looked at per object; the rest is counted as over the cap
DEFAULT_MAX_TRAINER_METRICS: Final = 16
MAX_PERCENT: Final = 100.0
MAX_INT32: Final = 2**31 - 1

# A decimal number as runtimes print one ("0.1234", "-3", "1e-05", "2.5E+3"). Stricter than float(), which
# also takes "nan", "inf", "1_000" and surrounding whitespace: none of those is a measurement to plot.
_NUMBER: Final = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class TrainerProgress(msgspec.Struct, frozen=True, gc=False):
    """What the per-TrainJob series show of ``status.trainerStatus`` (immutable, shared by equal reads).

    The ``skipped_*`` counts say what was left out and why (self-telemetry of the per-job series)."""

    percent: float | None  # progressPercentage, 0-100
    remaining_seconds: float | None  # estimatedRemainingSeconds
    updated: float | None  # lastUpdatedTime, epoch seconds
    metrics: tuple[tuple[str, float], ...] = ()  # (name, value), first-written first, names distinct
    skipped_unparsable: int = 0  # values that are not a finite decimal number
    skipped_invalid_name: int = 0  # names that are not usable label values, or repeated
    skipped_over_cap: int = 0  # valid metrics beyond the per-job cap


def is_metric_name(name: str) -> bool:
    """A trainer metric name usable as a label value: 1 to 64 printable characters (no newline, tab or other
    control character; quotes and backslashes are escaped by the exposition)."""
    return 0 < len(name) <= MAX_METRIC_NAME and name.isprintable()


def metric_value(value: object) -> float | None:
    """A trainer metric's value as a finite float, or None when it is not a number.

    The CRD makes it a string; a JSON number (an object written around the schema) is taken as well."""
    if isinstance(value, str):
        if len(value) > MAX_METRIC_VALUE or _NUMBER.fullmatch(value) is None:
            return None
        number = float(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        return None
    return number if math.isfinite(number) else None


def _bounded(value: object, upper: float) -> float | None:
    """An integer field of the CRD (int32, >= 0, at most ``upper``) as a float; None when absent or out of
    its range (nothing is clamped: a value the API server would refuse is not a reading)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > upper:
        return None
    return number


def trainer_progress(
    percent: object,
    remaining: object,
    updated: object,
    metrics: Iterable[tuple[object, object]],
    max_metrics: int = DEFAULT_MAX_TRAINER_METRICS,
) -> TrainerProgress:
    """The projection of one ``trainerStatus``, from its fields as found (of any JSON type): both decoding
    paths end here (app/trainer/informer_projectors.py)."""
    kept: dict[str, float] = {}
    named: set[str] = set()  # every name listed so far, kept or not: a repeated name is skipped
    unparsable = invalid = over = 0
    for index, (name, value) in enumerate(metrics):
        if index >= MAX_METRICS_READ:
            over += 1
            continue
        if not isinstance(name, str) or not is_metric_name(name) or name in named:
            invalid += 1
            continue
        named.add(name)
        number = metric_value(value)
        if number is None:
            unparsable += 1
        elif len(kept) >= max_metrics:
            over += 1
        else:
            kept[sys.intern(name)] = number  # a handful of names repeat across every job
    return TrainerProgress(
        _bounded(percent, MAX_PERCENT),
        _bounded(remaining, MAX_INT32),
        parse_time(updated),
        tuple(kept.items()),
        unparsable,
        invalid,
        over,
    )


def json_metrics(value: object) -> list[tuple[object, object]]:
    """``trainerStatus.metrics`` of a generic JSON value as (name, value) pairs; an entry that is not an
    object reads as a pair of None (counted as an invalid name)."""
    if not isinstance(value, list):
        return []
    return [
        (item.get("name"), item.get("value")) if isinstance(item, Mapping) else (None, None) for item in value
    ]
