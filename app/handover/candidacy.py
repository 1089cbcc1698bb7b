"""When a replica that has just started may run for leadership (docs/leadership.md,
"A replica that started after the events").

A replica that has just started saw nothing before its first list: its journal does not cover what
happened before. If the holder died, a warm follower (whose journal covers the gap) must take over
rather than this one, so the new replica holds back its first candidacy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.kube.lease import KubeLeaseClient, LeaseRecord, parse_lease

__all__ = ["defer_to_warm_followers", "read_record", "warm_head_start"]

log = logging.getLogger("app.replica.service")


async def read_record(leases: KubeLeaseClient, namespace: str, name: str) -> LeaseRecord | None:
    """The Lease's record; None when it does not exist, cannot be read or parsed (logged at debug: the
    elector reads it again and reports what persists)."""
    try:
        lease = await leases.get(namespace, name)
        return parse_lease(lease) if lease is not None else None
    except Exception as exc:
        log.debug("could not read the Lease %s/%s: %s", namespace, name, exc)
        return None


def warm_head_start(retry_period: float) -> float:
    """How long after a Lease became free a replica holds back so that a warm one takes it first: warm
    candidates retry every 1 to 2.2 retry periods (jittered), so three of those give them an attempt."""
    return 3 * retry_period


async def defer_to_warm_followers(
    leases: KubeLeaseClient,
    on_record: Callable[[LeaseRecord], None],
    *,
    namespace: str,
    name: str,
    identity: str,
    lease_duration: float,
    retry_period: float,
) -> LeaseRecord | None:
    """Wait before the first candidacy while another replica holds the Lease (one lease duration) or
    right after a graceful release (three retry periods). ``on_record`` sees the record read. Returns the
    record waited on (None when there was no wait)."""
    record = await read_record(leases, namespace, name)
    if record is None:
        return None
    on_record(record)
    if record.holder_identity and record.holder_identity != identity:
        # The Lease can only expire a lease duration after its last renew; the head start on top lets the
        # warm candidates win a dead holder's Lease.
        wait = max(record.lease_duration_seconds, lease_duration) + warm_head_start(retry_period)
        log.info(
            "%s holds the Lease: waiting %.1f s before running for leadership, so that a warm "
            "replica takes over first if it has gone",
            record.holder_identity,
            wait,
        )
        await asyncio.sleep(wait)
        return record
    if not record.holder_identity and record.renew_time is not None:
        # Released by a leader that stopped gracefully. It stopped counting when its hand-over began
        # and handed over only what was scraped: what came after is in the warm followers' journals,
        # not in this replica's (it came before our first list). They take a free Lease on their next
        # retry; let them.
        wait = warm_head_start(retry_period)
        log.info(
            "the Lease was released: waiting %.1f s before running for leadership, so that a warm "
            "replica takes over first",
            wait,
        )
        await asyncio.sleep(wait)
        return record
    return None
