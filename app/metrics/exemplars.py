"""Exemplars: the TrainJob behind an observation (``namespace``, ``name``, ``uid``), as the OpenMetrics text
and the protobuf exposition carry it after a histogram bucket or a counter.

An exemplar is ``(source, value)``: what the exemplar needs of the Trainer event that made the observation
(``ExemplarRef``, built once per event by ``exemplar_ref``: its ``key`` "namespace/name", its uid, and
``at``, the time the event happened, which is the exemplar's timestamp) and the value observed (1 for a
counter). Not the event itself: a histogram series keeps one exemplar per bucket for as long as the series
lives (a leader's term: weeks), and an event is about 200 bytes with a fresh 85-byte uid string, where an
``ExemplarRef`` is 64 bytes with the uid as its 16 bytes (49-byte ``bytes``, app/trainer/projection_types.py)
and the key shared with the projection while the job lives. The labels are rendered when the series is.
Worst case per series: one exemplar per bucket (+Inf included) of a histogram, a tuple, an ``ExemplarRef``
and its uid and key, about 250 bytes each.

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

import msgspec
from prometheus_client.samples import Exemplar as ClientExemplar

from app.metrics import protobuf as pb
from app.metrics.formatting import escape_label_value, floatToGoString
from app.trainer.projection_types import compact_uid, uid_text

__all__ = [
    "MAX_LABEL_CHARACTERS",
    "TRUNCATED",
    "Exemplar",
    "ExemplarRef",
    "ExemplarSource",
    "client_exemplar",
    "exemplar_labels",
    "exemplar_ref",
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


class ExemplarRef(msgspec.Struct, frozen=True, gc=False):
    """What an exemplar keeps of its event (an ``ExemplarSource``): the key, the uid stored compactly, the
    time. Untracked by the cyclic GC, like the events: it holds only strings, bytes and a number."""

    key: str
    uid_key: bytes | str  # compact_uid(uid)
    at: float | None

    @property
    def uid(self) -> str:
        return uid_text(self.uid_key)


def exemplar_ref(source: ExemplarSource) -> ExemplarRef:
    """The exemplar source of an event, without the event (see the module docstring)."""
    return ExemplarRef(source.key, compact_uid(source.uid), source.at)


Exemplar = tuple[ExemplarSource, float]  # (its source, normally an ExemplarRef; the value observed)


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
