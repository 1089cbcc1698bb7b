"""What the chaos soak records of one replica, as plain records, wherever the replica runs.

``install_tap(service, emit)`` wraps a few methods of one ``Service`` (the same wrappers the soak has always
used) and calls ``emit`` with a small dict for each thing the soak's checks need; it keeps nothing itself.
In the soak's own process ``emit`` is the soak's handler; in a replica process of its own (``--tap-fd``,
tests/support/replica_instruments.py) it writes one JSON line per record to a pipe the soak reads. Records:

* ``term_start`` (``floor``: the watermark the term counts from, None if nothing known) before the journal
  starts leading, so that the replays of the take-over come after it; ``term_stop`` once it stopped;
* ``count``: every countable event the journal counted (``journal._count``: live, replayed at a take-over,
  or settled), with its kind, uid, rv and what it adds to each counter and histogram sample
  (``promql_visible.event_increments``): the counts of a term are the sum of its ``count`` records;
* ``settle``: a held edge settled by the leader (counted, or found already counted);
* ``shown``: a served render (a scrape's body) showed counts for the first time, as the served ledger
  (app/handover/served.py) recorded them: ``rvs``, each [stream, the lowest rv its edge may have happened
  at] (``rv``, or ``since`` + 1 for an edge a relist found);
* ``initial`` / ``relist`` of the TrainJob informer and of the pods informer (``stream``: ``""`` or
  ``"pods/"``, the hand-over's stream names, app/handover/streams.py): its initial list's rv; the rv it held
  before a relist and the rv of the list (which edges it could not have seen);
* ``pod_seen``: a pod first seen Failed after the pods informer's first list (app/trainer/pod_failures.py),
  ``joined`` when its TrainJob was cached (an edge sent to the journal), else not counted (``unjoined``);
  with ``listed``, one already Failed in that first list, ``joined`` as its TrainJob was cached or not;
* ``status`` (``status_record``, sent by a replica process every 0.1 s): leading, ready, watching, the
  TrainJob informers' rvs and the pods informers', pending creations, held series, whether every count
  was seen, liveness.

A ``count`` record names its stream (``""`` or ``"pods/"``) and, for a pod's failure, the pod (``subject``);
``term_start`` gives the floor of each stream (``floors``) beside the TrainJob stream's (``floor``).

Every record has ``k`` (its kind) and ``t`` (``time.monotonic()``: one clock for every process of the host).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from app.handover.streams import POD_STREAM_PREFIX
from app.metrics.counted import edge_of
from app.replica.service import Service
from app.trainer.events import CountableEvent, PodFailed
from app.trainer.projection_types import uid_text
from tests.support.promql_visible import event_increments

Record = dict[str, Any]
Emit = Callable[[Record], None]


def _floor(previous: int | Mapping[str, int] | None) -> int | None:
    """The floor a term counts from, for the single TrainJob stream of a watch over all namespaces."""
    if previous is None or isinstance(previous, int):
        return previous
    return previous.get("", max(previous.values(), default=None)) if previous else None


def _floors(previous: int | Mapping[str, int] | None) -> dict[str, int]:
    """The floor of each stream the previous leader published (none: nothing known)."""
    if previous is None:
        return {}
    if isinstance(previous, int):
        return {"": previous}
    return dict(previous)


def stream_of(event: CountableEvent) -> str:
    """The stream an edge's rv belongs to, for one watch over all namespaces (app/handover/streams.py)."""
    return POD_STREAM_PREFIX if type(event) is PodFailed else ""


def install_tap(service: Service, emit: Emit) -> None:
    """Wrap ``service``'s journal (before ``start``); ``attach_informers`` after ``start`` returns."""
    journal = service.journal
    start_leading, stop_leading = journal.start_leading, journal.stop_leading
    orig_count, orig_settle = journal._count, journal.settle

    def start(previous_watermark: int | Mapping[str, int] | None) -> int:
        floor = _floor(previous_watermark)
        emit(
            {
                "k": "term_start",
                "t": time.monotonic(),
                "wall": time.time(),
                "floor": floor,
                "floors": _floors(previous_watermark),
            }
        )
        return start_leading(previous_watermark)

    def stop(seen: Mapping[str, int] | None = None) -> int | None:
        was_leading = journal.leading
        result = stop_leading(seen)
        if was_leading:
            emit({"k": "term_stop", "t": time.monotonic(), "wall": time.time()})
        return result

    def counted(event: CountableEvent) -> None:
        orig_count(event)
        emit(
            {
                "k": "count",
                "t": time.monotonic(),
                "kind": edge_of(event).name,
                "uid": str(event.uid),
                "rv": event.rv,
                "since": event.since,  # a relist found it: the rv its informer held before the gap
                "stream": stream_of(event),
                "subject": uid_text(event.pod_uid) if type(event) is PodFailed else "",
                "inc": [
                    [name, list(key), amount]
                    for name, key, amount in event_increments(event)
                    if math.isfinite(amount)
                ],
            }
        )

    def settled(event: CountableEvent, count: bool) -> None:
        if journal.leading and not journal.paused:
            emit({"k": "settle", "t": time.monotonic(), "count": count})
        orig_settle(event, count)

    ledger = service.ledger

    def served(now: float, released: list[Any]) -> None:
        # Called after the ledger's own listener (registered when the service was built): the render at
        # ``now`` appended what it showed first, if anything, as the newest entry of ``_rendered``.
        rendered = ledger._rendered
        if journal.leading and rendered and rendered[-1][0] == now:
            emit(
                {"k": "shown", "t": time.monotonic(), "rvs": [[stream, rv] for stream, rv in rendered[-1][1]]}
            )

    service.metric_state.add_served_listener(served)
    journal.start_leading = start  # type: ignore[method-assign]
    journal.stop_leading = stop  # type: ignore[method-assign]
    journal._count = counted  # type: ignore[method-assign]
    journal.settle = settled  # type: ignore[method-assign]


def _tap_lists(informer: Any, emit: Emit, stream: str) -> None:
    """``informer``'s initial list and relists, as records of ``stream``."""
    if informer.synced:  # listed already (the caller yielded to the loop after start)
        rv = int(informer.resource_version or 0)
        emit({"k": "initial", "t": time.monotonic(), "rv": rv, "stream": stream})

    def relisted(
        items: Any, list_rv: str, unusable: Any, inf: Any = informer, orig: Any = informer._ingest.replace
    ) -> None:
        before = int(inf.resource_version or 0)
        listed = int(list_rv) if list_rv.isdigit() else before
        if not inf.synced:
            emit({"k": "initial", "t": time.monotonic(), "rv": listed, "stream": stream})
        else:
            emit({"k": "relist", "t": time.monotonic(), "before": before, "listed": listed, "stream": stream})
        orig(items, list_rv, unusable)

    informer._ingest.replace = relisted


def attach_informers(service: Service, emit: Emit) -> None:
    """The TrainJob informer's and the pods informer's initial list and relists (one watch over all
    namespaces each; a pods informer is built once its access check passes), and every pod first seen
    Failed."""
    for informer in service._trainjob_informers[:1]:
        _tap_lists(informer, emit, "")
    for watch in service.pods.pod_watches[:1]:
        if watch.informer is not None:
            _tap_lists(watch.informer, emit, POD_STREAM_PREFIX)
        else:

            def make(namespace: str | None, orig: Any = watch._make_informer) -> Any:
                informer = orig(namespace)
                _tap_lists(informer, emit, POD_STREAM_PREFIX)
                return informer

            watch._make_informer = make
    failures = service.pods.failures

    def record(pod: Any, *, joined: bool, listed: bool) -> None:
        rv = int(pod.resource_version) if str(pod.resource_version).isdigit() else 0
        out = {"k": "pod_seen", "t": time.monotonic(), "pod": pod.uid, "rv": rv, "joined": joined}
        emit({**out, "listed": True} if listed else out)

    def seen(pod: Any, orig: Any = failures._failure) -> None:
        new = pod.uid_key not in failures._failed and pod.uid_key not in failures._tomb_set
        unjoined = failures.unjoined
        orig(pod)
        if new:
            record(pod, joined=failures.unjoined == unjoined, listed=False)

    failures._failure = seen  # type: ignore[method-assign]

    def first_listed(pod: Any, *, listed: bool, orig: Any = failures._emit) -> None:
        # A pod already Failed in the first list: not an edge this replica counts as it comes, and none it
        # can count at a take-over either while its TrainJob is not cached (app/trainer/pod_failures.py).
        if listed:
            record(pod, joined=failures.trainjob_of(pod) is not None, listed=True)
        orig(pod, listed=listed)

    failures._emit = first_listed  # type: ignore[method-assign]


def _rvs(informers: Any) -> list[int]:
    return [int(i.resource_version or 0) for i in informers if i is not None]


def status_record(service: Service) -> Record:
    """What the soak polls of a replica: its leadership, readiness (what /readyz answers), the state of its
    watches and of its counts, liveness."""
    return {
        "k": "status",
        "t": time.monotonic(),
        "leading": service.journal.leading,
        "ready": not service.readiness_problems(),
        "watching": all(i.watching for i in service.informers),
        "rvs": _rvs(service._trainjob_informers),
        "pod_rvs": _rvs(w.informer for w in service.pods.pod_watches),
        "pending": service.state.pending_count,
        "held": service.metric_state.held_series,
        "all_seen": service.ledger.all_seen(),
        "liveness": service.liveness_problems(),
        "dead": [task.get_name() for task in service._tasks if task.done()],
    }
