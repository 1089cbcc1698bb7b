"""Exemplars: the TrainJob behind an observation (``namespace``, ``name``, ``uid``), as the OpenMetrics text
and the protobuf exposition carry it after a histogram bucket or a counter.

An exemplar is ``(event, value)``: the Trainer event that made the observation (app/trainer/events.py: its
``key`` "namespace/name", ``uid`` and ``at``, the time the event happened, which is the exemplar's
timestamp) and the value observed (1 for a counter). Keeping the event rather than rendered labels costs
one tuple per observation on the per-event path; the labels are rendered when the series is.

The label-set limit. OpenMetrics allows 128 UTF-8 characters of exemplar label names and values together,
and Prometheus rejects a longer set (``storage.ErrExemplarLabelLength``: the exemplar is dropped, the
sample kept). The names take 16 (``namespace``, ``name``, ``uid``); the values are kept by this rule
(``exemplar_labels``), in this order:

1. ``uid`` whole, or dropped if it does not fit (a truncated uid names nothing). A Kubernetes uid is a
   36-character UUID: it always fits.
2. ``namespace`` whole, or dropped (at most 63 characters in Kubernetes: with the uid, 111 at most, so
   it always fits for a real object).
3. ``name`` whole if it fits in what is left, else cut to fit with its last kept character replaced by
   ``…`` (which no Kubernetes name contains, so a cut name is never mistaken for another job's); dropped
   when not even one character and the ``…`` fit. With a UUID uid, names up to 76 - len(namespace)
   characters are kept whole (every name in a namespace of up to 13 characters: names are at most 63).

The uid comes first because it alone identifies the TrainJob for good (a namespace/name is reused by the
next job of that name), and ``kubectl get trainjobs -A -o json | jq '.items[] | select(.metadata.uid ==
"…")'`` finds it; the namespace next because it is what access is granted by.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client.samples import Exemplar as ClientExemplar

from app.metrics import protobuf as pb
from app.metrics.formatting import escape_label_value, floatToGoString

__all__ = [
    "MAX_LABEL_CHARACTERS",
    "TRUNCATED",
    "Exemplar",
    "ExemplarSource",
    "client_exemplar",
    "exemplar_labels",
    "openmetrics_suffix",
    "protobuf_message",
]

MAX_LABEL_CHARACTERS = 128  # OpenMetrics 1.0, "Exemplars"; Prometheus' exemplar.ExemplarMaxLabelSetLength
TRUNCATED = "…"  # ends a cut name (one character, as both limits count characters, not bytes)


class ExemplarSource(Protocol):
    """What an exemplar needs of an event (every countable event of app/trainer/events.py has it)."""

    @property
    def key(self) -> str: ...  # "namespace/name"

    @property
    def uid(self) -> str: ...

    @property
    def at(self) -> float | None: ...  # when it happened, epoch seconds


Exemplar = tuple[ExemplarSource, float]  # (the event, the value observed)


def exemplar_labels(source: ExemplarSource) -> tuple[tuple[str, str], ...]:
    """The exemplar's labels, sorted by name, within MAX_LABEL_CHARACTERS (the module docstring's rule)."""
    namespace, _, name = source.key.partition("/")
    room = MAX_LABEL_CHARACTERS
    kept: dict[str, str] = {}
    for label, value in (("uid", source.uid), ("namespace", namespace)):
        cost = len(label) + len(value)
        if value and cost <= room:
            kept[label] = value
            room -= cost
    if name:
        left = room - len("name")
        if len(name) <= left:
            kept["name"] = name
        elif left >= 2:
            kept["name"] = name[: left - 1] + TRUNCATED
    return tuple(sorted(kept.items()))


def openmetrics_suffix(exemplar: Exemplar | None) -> str:
    """`` # {labels} value timestamp`` after a sample value, exactly as prometheus_client writes it ("" for
    no exemplar)."""
    if exemplar is None:
        return ""
    source, value = exemplar
    labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in exemplar_labels(source))
    at = source.at
    if at is None:
        return f" # {{{labels}}} {floatToGoString(value)}"
    return f" # {{{labels}}} {floatToGoString(value)} {float(at)}"


def protobuf_message(exemplar: Exemplar) -> bytes:
    """The ``io.prometheus.client.Exemplar`` message."""
    source, value = exemplar
    at = source.at
    out = pb.label_pairs(exemplar_labels(source)) + pb.field_double(2, float(value))
    if at is not None:
        out += pb.field_bytes(3, pb.timestamp(float(at)))
    return out


def client_exemplar(exemplar: Exemplar) -> ClientExemplar:
    """The same exemplar for prometheus_client (the tests' Collector view)."""
    source, value = exemplar
    at = source.at
    return ClientExemplar(dict(exemplar_labels(source)), value, float(at) if at is not None else None)
