"""Whether this replica's journal covers the hand-over watermark, i.e. whether it could replay what a dead
leader counted and no scrape showed (docs/leadership.md, "A replica that started after the events").

A new leader replays the remembered events above the watermark it takes over from. It remembers only
what its watches delivered: nothing before its first list (those jobs arrive as objects, not edges), and
nothing the journal has dropped since (it keeps the last ``HANDOVER_JOURNAL_SIZE`` events). A replica
whose remembered history starts above the watermark cannot replay the events in between; one that
started earlier can. Such a replica still takes the Lease, only later than the others (the elector's
``takeover_delay``), so that a replica that saw those events wins the race when there is one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.handover.streams import floor_of, is_pod_stream

__all__ = ["uncovered_streams"]


def uncovered_streams(
    remembered_from: Mapping[str, int],
    floor: Mapping[str, int] | int | None,
    unlisted: Iterable[str] = (),
) -> dict[str, tuple[int | None, int]]:
    """The streams whose remembered events start above the takeover floor: {stream: (from, floor)}, from
    None for a stream not listed yet.

    ``remembered_from``: per watch stream, the rv after which the journal holds every countable event
    (``CountJournal.remembered_from``). ``unlisted``: the streams this replica watches whose first list has
    not come (``CountJournal.unlisted``): it remembers nothing of them, so any floor of theirs is uncovered.
    ``floor``: what ``LeaseWatermarks.takeover_floor`` gives, per stream (a stream it does not name:
    app/handover/streams.py ``floor_of``) or one int for all; None (unknown: nothing is replayed), the int 0
    (nobody counted anything) and the 0 of a pods stream no leader published leave nothing uncovered. A
    published 0 is a floor like any other (``_no_pod_failure_counted``). Empty: this replica covers the floor.
    """
    if floor is None or isinstance(floor, int):
        return {}
    gaps: dict[str, tuple[int | None, int]] = {}
    for stream, start in remembered_from.items():
        limit = floor_of(floor, stream)
        if limit is not None and start > limit and not _no_pod_failure_counted(floor, stream):
            gaps[stream] = (start, limit)
    for stream in unlisted:
        limit = floor_of(floor, stream)
        if limit is not None and not _no_pod_failure_counted(floor, stream):
            gaps[stream] = (None, limit)
    return gaps


def _no_pod_failure_counted(floor: Mapping[str, int], stream: str) -> bool:
    """``stream`` is a pods stream and the floor names none: no leader counted a pod failure, so there is
    nothing to replay (its floor is 0 by app/handover/streams.py ``floor_of``). A published 0 is not that:
    a leader whose counts no scrape showed yet publishes 0, and what it counted above is to be replayed."""
    return is_pod_stream(stream) and not any(is_pod_stream(name) for name in floor)
