"""Paged LISTs: continue tokens and the list snapshots they pin (docs/design/k8s-protocol.md §1).

Every page of a paged LIST is served at the revision of its first page. etcd does that from its MVCC
history; the store keeps the first page's rows instead (a list of shared, immutable entries), bounded by
count and age like etcd's compaction bounds a token's life.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import time
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.status import StoreError, bad_request, expired
from kubesim.apiserver.storage.table import Entries, Key

# A token handed out with a 410 after compaction: continue at the latest state, not at a revision.
INCONSISTENT_RV = -1


@dataclass(slots=True)
class ListPage:
    items: Entries
    resource_version: int
    continue_token: str
    remaining: int | None  # remainingItemCount, only when a limit cut an unfiltered list


def encode_continue(resource: ResourceKind, namespace: str | None, rv: int, start: Key) -> str:
    # Same shape as the apiserver's etcd3 token: the start key relative to the listed prefix.
    rel = start[1] if (namespace is not None or not resource.namespaced) else f"{start[0]}/{start[1]}"
    token = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": rel})
    return base64.urlsafe_b64encode(token).rstrip(b"=").decode()


def decode_continue(resource: ResourceKind, namespace: str | None, token: str) -> tuple[int, Key]:
    """(revision, start key) of a token; 400 with the apiserver's messages if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
    except (binascii.Error, ValueError, orjson.JSONDecodeError) as exc:
        raise bad_request(f"invalid continue token: continue key is not valid: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        raise bad_request(
            "invalid continue token: continue key is not valid: "
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        )
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or rv == 0 or rv < INCONSISTENT_RV or not isinstance(start, str) or not start:
        raise bad_request(
            "invalid continue token: continue key is not valid: invalid start or resourceVersion"
        )
    if namespace is not None or not resource.namespaced:
        key = (namespace or "", start)
    else:
        ns, sep, name = start.partition("/")
        key = (ns, name) if sep else ("", start)
    return rv, key


def continue_expired(
    resource: ResourceKind, namespace: str | None, latest: Entries, start: Key
) -> StoreError:
    """410 for a token whose snapshot is gone. Like etcd after compaction, it carries an inconsistent token
    that continues at the latest state, when anything is left to continue with."""
    message = "The provided continue parameter is too old to display a consistent list result. "
    message += "You can start a new list without the continue parameter"
    lo = bisect.bisect_left(latest, start, key=lambda e: e.key)
    if lo < len(latest):
        message += (
            ", or use the continue token in this response to retrieve the remainder of the results. "
            "Continuing with the provided token results in an inconsistent list - objects that were "
            "created, modified, or deleted between the time the first chunk was returned and now may "
            "show up in the list."
        )
        return expired(message, encode_continue(resource, namespace, INCONSISTENT_RV, start))
    return expired(message + ".")


SnapshotKey = tuple[ResourceKind, str | None, int]  # (kind, namespace or all, revision)


@dataclass(slots=True)
class _Snapshot:
    rows: Entries
    created: float


class ListSnapshots:
    """The rows of paged LISTs still being continued: the newest ``max_size``, each for ``ttl`` seconds."""

    __slots__ = ("_snapshots", "max_size", "ttl")

    def __init__(self, *, ttl: float, max_size: int) -> None:
        self.ttl = ttl
        self.max_size = max_size
        self._snapshots: OrderedDict[SnapshotKey, _Snapshot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._snapshots)

    def remember(self, key: SnapshotKey, rows: Entries) -> None:
        self._snapshots[key] = _Snapshot(rows, time.monotonic())
        self._snapshots.move_to_end(key)
        while len(self._snapshots) > self.max_size:
            self._snapshots.popitem(last=False)

    def get(self, key: SnapshotKey) -> Entries | None:
        """The rows pinned at ``key``, or None once evicted or past their ttl."""
        snap = self._snapshots.get(key)
        if snap is not None and time.monotonic() - snap.created > self.ttl:
            del self._snapshots[key]
            return None
        return None if snap is None else snap.rows

    def clear(self) -> None:
        self._snapshots.clear()
