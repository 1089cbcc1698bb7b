"""The wait of a graceful stop (docs/leadership.md, "A graceful stop waits for the scrapes"): the leader has
stopped counting and keeps serving /metrics until every scraper has seen what it counted, so that the
Lease it releases hands over exactly what PromQL has.
"""

from __future__ import annotations

import time

from app.handover.journal import CountJournal
from app.handover.served import ServedLedger

__all__ = ["NO_SCRAPE_GRACE", "wait_until_scraped"]

# A graceful stop gives up waiting for scrapes once none came for the zero hold plus this: every scraper
# the hold is set for (interval <= hold) would have come by then, so nobody is scraping this replica.
NO_SCRAPE_GRACE = 1.0


async def wait_until_scraped(
    ledger: ServedLedger, journal: CountJournal, wait: float
) -> tuple[bool, str | None, float]:
    """Wait until the ledger says every count was seen, at most ``wait`` seconds, and not beyond the zero
    hold + ``NO_SCRAPE_GRACE`` without a scrape. Returns (all seen, why it gave up, seconds waited);
    the reason is None when the journal stopped leading meanwhile (the Lease was lost)."""
    hold = ledger.hold
    started = time.monotonic()
    deadline = started + wait
    while journal.leading:
        if ledger.all_seen():
            return True, None, round(time.monotonic() - started, 3)
        now = time.monotonic()
        last = ledger.last_render
        quiet_until = (last if last is not None else started) + hold + NO_SCRAPE_GRACE
        if wait <= 0:
            return False, "handover_wait_seconds is 0", 0.0
        if now >= deadline:
            return False, f"handover_wait_seconds ({wait:g} s) passed", now - started
        if now >= quiet_until:
            return (
                False,
                f"no scrape for {now - (last if last is not None else started):.1f} s",
                now - started,
            )
        wake = min(deadline, quiet_until)
        seen_at = ledger.next_seen_at()
        if seen_at is not None:
            wake = min(wake, seen_at)
        await ledger.wait_change(wake - now + 0.001)
    return False, None, time.monotonic() - started
