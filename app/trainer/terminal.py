"""The terminal-dedup set: one entry per TrainJob uid whose terminal edge was recorded.

TrainerState counts a JobFinished only for a uid not in the set, so duplicate terminal updates,
relists and re-adds never recount (docs/design/product.md §6 invariant 2); the entry is dropped
when the job is deleted. /debug/terminal pages through the set with opaque continue tokens.
"""

from __future__ import annotations

import base64
import heapq
import json
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from app.trainer import rules
from app.trainer.projection_types import TrainJobProjection, compact_uid, uid_text


class _TerminalFields(msgspec.Struct, frozen=True, gc=False):
    key: str  # "namespace/name"
    uid: bytes | str  # as TrainJobProjection.uid_key stores it (shared with the projection)
    result: str  # succeeded | failed: what was (or would have been) counted
    raw_reason: str  # the terminal condition's reason as written (capped)
    terminal_time: float | None  # lastTransitionTime of the terminal condition, epoch seconds
    recorded_time: float  # wall clock when this replica recorded it, epoch seconds

    def __post_init__(self) -> None:
        uid = _TERMINAL_UID_SLOT.__get__(self)
        if type(uid) is str:
            _TERMINAL_UID_SLOT.__set__(self, compact_uid(uid))


_TERMINAL_UID_SLOT: Final[Any] = _TerminalFields.__dict__["uid"]


class TerminalEntry(_TerminalFields, frozen=True, gc=False):
    """One entry of the terminal-dedup set (shares its strings with the job's projection)."""

    @property  # type: ignore[misc]
    def uid(self) -> str:
        return uid_text(_TERMINAL_UID_SLOT.__get__(self))

    @property
    def namespace(self) -> str:
        # Derived, not stored (memory): namespaces and names never contain "/".
        ns, sep, _ = self.key.partition("/")
        return ns if sep else ""

    @property
    def name(self) -> str:
        return self.key.partition("/")[2] or self.key

    @property
    def reason(self) -> str:
        """The reason label (rules.reason_bucket): "none", the reason by name when well-formed, or
        "other". Before TrainerState's cap on distinct names, which a debug view need not apply."""
        return rules.reason_bucket(self.result, self.raw_reason)


class TerminalSet(dict[bytes | str, TerminalEntry]):
    """Entries by TrainJobProjection.uid_key (16 bytes for a UUID, shared with the projection).

    A dict subclass rather than a wrapper: TrainerState tests membership on every watch event, and
    this keeps that a plain dict lookup.
    """

    __slots__ = ()

    def record(self, job: TrainJobProjection, recorded_time: float) -> None:
        uid = job.uid_key
        self[uid] = TerminalEntry(
            key=job.key,
            uid=uid,
            result=job.result,
            raw_reason=job.reason,
            terminal_time=job.terminal_time,
            recorded_time=recorded_time,
        )

    def page(self, limit: int, continue_token: str | None = None) -> tuple[list[TerminalEntry], str | None]:
        """A page of entries in (namespace, name, uid) order, and the token of the next page (``None``
        on the last page). Raises ``ValueError`` for a token this did not produce.

        O(n log limit) per page: a debug endpoint, not a hot path; no index is kept for it.
        """
        limit = max(1, limit)
        after = _decode_token(continue_token) if continue_token else None

        def sort_key(e: TerminalEntry) -> tuple[str, str, str]:
            return (e.namespace, e.name, e.uid)

        candidates: Iterable[TerminalEntry] = self.values()
        if after is not None:
            candidates = (e for e in candidates if sort_key(e) > after)
        page = heapq.nsmallest(limit + 1, candidates, key=sort_key)
        if len(page) <= limit:
            return page, None
        page = page[:limit]
        return page, _encode_token(sort_key(page[-1]))


def _encode_token(key: tuple[str, str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode()


def _decode_token(token: str) -> tuple[str, str, str]:
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (ValueError, UnicodeError) as exc:
        raise ValueError("invalid continue token") from exc
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
        raise ValueError("invalid continue token")
    return (value[0], value[1], value[2])
