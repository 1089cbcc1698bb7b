"""The watch streams the hand-over keeps a watermark for, and the floor of each (docs/leadership.md, "The
hand-over watermark").

resourceVersions are ordered within one watch only, so the journal, the served ledger and the Lease keep
one watermark per watch stream a countable event can come from:

* the TrainJob watch: "" for one watch over all namespaces, else the namespace's name (one watch each);
* the pods watch (a pod's failure, app/trainer/events.py ``PodFailed``): ``pods/`` for one watch over all
  namespaces, else ``pods/<namespace>``. A namespace name has no ``/``, so no pods stream is ever taken for
  a TrainJob stream.

The floor of a stream the previous leader's watermarks do not name:

* a TrainJob stream: the single stream's (""), if any (a Lease written before the watches were split by
  namespace), else none (the journal counts what it remembers);
* a pods stream: the all-namespaces pods stream's, else the lowest of the pods streams named, else 0: no
  leader counted a pod failure. Every leader that counts one publishes its pods stream, and every later
  leader republishes every stream it saw in the Lease (app/handover/watermarks.py), so a Lease without
  any pods stream was written by leaders that counted no pod failure (an older version, the pods watch off
  or refused): what this replica remembers of them is counted. Never the TrainJob stream's: it says
  nothing of what was counted of the pods, and would skip failures nobody counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from app.trainer.events import CountableEvent, PodFailed

__all__ = [
    "POD_STREAM_PREFIX",
    "floor_of",
    "is_pod_stream",
    "pod_stream",
    "stream_namespace",
    "stream_of",
]

POD_STREAM_PREFIX: Final = "pods/"


def pod_stream(namespace: str | None) -> str:
    """The pods watch's stream: over all namespaces (None or ""), or of one namespace."""
    return POD_STREAM_PREFIX + (namespace or "")


def is_pod_stream(stream: str) -> bool:
    return stream.startswith(POD_STREAM_PREFIX)


def stream_namespace(stream: str) -> str | None:
    """The namespace a stream's watch lists (None: all namespaces)."""
    namespace = stream[len(POD_STREAM_PREFIX) :] if is_pod_stream(stream) else stream
    return namespace or None


def stream_of(per_namespace: bool) -> Callable[[CountableEvent], str]:
    """The stream of an event, when the watches are one per configured namespace (``per_namespace``) or one
    over all namespaces."""
    if per_namespace:

        def per_watch(event: CountableEvent) -> str:
            if type(event) is PodFailed:
                return POD_STREAM_PREFIX + event.namespace
            return event.namespace

        return per_watch

    def single(event: CountableEvent) -> str:
        return POD_STREAM_PREFIX if type(event) is PodFailed else ""

    return single


def floor_of(floors: Mapping[str, int], stream: str) -> int | None:
    """The floor of ``stream`` in the previous leader's watermarks (the module docstring's rule); None:
    nothing known of the stream (count what is remembered)."""
    floor = floors.get(stream)
    if floor is not None:
        return floor
    if not is_pod_stream(stream):
        return floors.get("")
    floor = floors.get(POD_STREAM_PREFIX)
    if floor is not None:
        return floor
    named = [rv for name, rv in floors.items() if is_pod_stream(name)]
    return min(named) if named else 0
