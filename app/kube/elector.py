"""Leader election over a ``coordination.k8s.io/v1`` Lease, with client-go semantics
(docs/design/k8s-protocol.md §4).

Our own implementation rather than ``kubernetes_asyncio.leaderelection``, whose flaws we must not inherit:
no per-request deadline, exceptions that escape and orphan the leader work, no release on cancel, expiry
judged with the wall clock against the *local* lease duration, broken MicroTime formatting.

Safety argument (docs/design/product.md §6 invariant 5). There is no fencing, so "at most one exporter"
rests on time:

* A follower takes over only ``leaseDurationSeconds`` after it last *saw the record change* (its own
  monotonic clock; the server's renewTime is never compared with a local clock, so clock skew is harmless).
* The leader measures each renew from the moment it *sent* the request (before the GET/PUT), and stops
  (``on_stopped_leading``) as soon as ``renew_deadline`` has passed since its last successful renew. Every
  API call of a renew round sits inside one ``asyncio.timeout``, so a hung HTTP request cannot stretch it.
* A follower's observation of our last renew happens after we sent it, and ``renew_deadline <
  lease_duration <= leaseDurationSeconds`` (we round the written duration *up* to whole seconds), so the old
  leader has stopped before anyone may take over, as long as clock *rates* agree.
* Unlike client-go, a renew attempt that finds another valid holder stops leadership at once instead of
  polling on until the deadline: that state already means someone else leads.
* Also stricter than client-go: a Lease deleted under its holder is not recreated by a follower at once
  (the holder keeps leading and recreates it on its next renew), but only a lease duration after the
  follower saw it disappear; an unreadable Lease (wrong field types, bad MicroTime) is held the same way,
  and overwritten only once it has stayed unchanged for our own lease duration.

The interface types (``ElectorConfig``, ``LeaderCallbacks``, ``ElectorStatus``) are in
app/kube/elector_api.py; what was last seen of the Lease, and whether it is still in
force, is app/kube/elector_lease.py's ``ObservedLease``, which also builds the bodies written.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from app.kube.elector_api import JITTER_FACTOR, ElectorConfig, ElectorStatus, LeaderCallbacks, safe_call
from app.kube.elector_lease import LeaseBodies, ObservedLease
from app.kube.lease import LeaseClient, LeaseRecord, loose_int
from app.kube.logthrottle import FailureLog

log = logging.getLogger(__name__)

RELEASED_LEASE_DURATION = 1  # 0 fails Lease validation (k8s#88194), so a released Lease says 1 s
_RELEASE_ATTEMPTS = 3  # a conflicting release re-reads the Lease and tries again, within the renew deadline
_LOG_REPEAT_INTERVAL = 60.0  # a repeated failure of the same kind is logged at most once a minute
_UNREPORTED: Any = object()  # no holder told to on_new_leader yet (None is a holder value: "no holder")


def _describe(exc: BaseException) -> tuple[str, str]:
    """(key for rate-limited logging, human text). ``status`` is ApiError's HTTP status (0 = connection)."""
    status = getattr(exc, "status", None)
    kind = type(exc).__name__
    key = f"{kind}:{status}" if status is not None else kind
    text = f"{kind} {status}: {exc}" if status is not None else f"{kind}: {exc}"
    return key, text


class LeaseElector:
    """Acquire the Lease, lead while renewing it, re-candidate after losing it; forever (see module doc)."""

    def __init__(
        self,
        client: LeaseClient,
        config: ElectorConfig,
        callbacks: LeaderCallbacks,
        *,
        annotations: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_transition: Callable[[bool], None] | None = None,
        on_observed: Callable[[LeaseRecord], None] | None = None,
        takeover_delay: Callable[[LeaseRecord], float] | None = None,
    ) -> None:
        """``takeover_delay(record)``: how long after ``record`` became free (released, or expired by our
        clock) to wait before taking it from its holder; 0 by default. Lets better-placed candidates win the
        race (app/handover/coverage.py); it delays a takeover, never stops one."""
        self._client = client
        self._config = config
        self._callbacks = callbacks
        self._bodies = LeaseBodies(config.lease_name, config.lease_namespace, annotations)
        self._clock = clock
        self._on_transition = on_transition
        self._on_observed = on_observed  # every readable record seen (the hand-over watermark lives there)
        self._takeover_delay = takeover_delay
        self._deferral_logged_for = -1.0  # the observation (ObservedLease.time) a deferral was logged for
        self._limiter = FailureLog(
            log, "lease API requests succeed again", interval=_LOG_REPEAT_INTERVAL, clock=clock
        )

        self._seen = ObservedLease()
        self._reported_leader: Any = _UNREPORTED
        self._taken_over_from: LeaseRecord | None = None

        self._leading = False
        self.transitions_seen = 0  # for telemetry: leadership changes of this replica
        self._last_change: datetime | None = None

    # ---- public -----------------------------------------------------------------------------------

    @property
    def config(self) -> ElectorConfig:
        return self._config

    @property
    def is_leader(self) -> bool:
        return self._leading

    def status(self) -> ElectorStatus:
        rec = self._seen.record
        return ElectorStatus(
            identity=self._config.identity,
            is_leader=self._leading,
            holder=(rec.holder_identity or None) if rec is not None else None,
            lease_name=self._config.lease_name,
            lease_namespace=self._config.lease_namespace,
            acquire_time=rec.acquire_time if rec else None,
            renew_time=rec.renew_time if rec else None,
            lease_transitions=rec.lease_transitions if rec else None,
            annotations=dict(rec.annotations) if rec else {},
            transitions_seen=self.transitions_seen,
            last_change=self._last_change,
        )

    def abandon_on_cancel(self) -> None:
        """Make the next cancellation skip the release, as a crashed process would (chaos tests)."""
        self._config = replace(self._config, release_on_cancel=False)

    async def run(self) -> None:
        """Run until cancelled. On cancellation while leading: stop, then release (if configured)."""
        try:
            while True:
                try:
                    renewed_at = await self._acquire()
                    self._start_leading()
                    await self._lead(renewed_at)
                    # Lost it: pause like any candidate between attempts, so a replica that just gave the
                    # Lease up (or failed to renew) does not grab it back before the others had a chance.
                    await asyncio.sleep(self._jittered_retry())
                except Exception:
                    # Only a bug of ours can get here (every API failure is handled inside); never let it
                    # leave us exporting without renewing.
                    log.exception("lease %s: unexpected elector error", self._config.lease_name)
                    if self._leading:
                        self._stop_leading("internal error")
                    await asyncio.sleep(self._config.retry_period)
        except asyncio.CancelledError:
            if self._leading:
                self._stop_leading("shutting down")
                if self._config.release_on_cancel:
                    await self._release()
            raise

    # ---- phases -----------------------------------------------------------------------------------

    async def _acquire(self) -> float:
        """JitterUntil(tryAcquireOrRenew, retry_period, 1.2); returns when the winning attempt began."""
        cfg = self._config
        log.info("lease %s/%s: %s is a candidate", cfg.lease_namespace, cfg.lease_name, cfg.identity)
        while True:
            started = self._clock()
            try:
                # Bound the attempt too: a hung GET must not keep us from ever becoming a candidate again.
                async with asyncio.timeout(cfg.renew_deadline):
                    acquired = await self._try_acquire_or_renew()
            except TimeoutError:
                self._limiter.failure("timeout", "lease %s: acquire attempt timed out", cfg.lease_name)
                acquired = False
            if acquired:
                return started
            await asyncio.sleep(self._jittered_retry())

    def _jittered_retry(self) -> float:
        # wait.Jitter(retry_period, 1.2): uniformly in [retry, 2.2 x retry], so candidates spread out.
        return self._config.retry_period * (1.0 + random.random() * JITTER_FACTOR)

    async def _lead(self, renewed_at: float) -> None:
        """Renew every retry_period; return (after on_stopped_leading) once a renew round fails."""
        cfg = self._config
        while True:
            await asyncio.sleep(cfg.retry_period)
            # Deadline counted from the last successful renew, not from the round start (client-go's is
            # round start + renew_deadline, i.e. up to retry_period later): this is what keeps us within
            # renew_deadline < lease_duration of the renew a follower last saw.
            outcome = await self._renew_round(renewed_at + cfg.renew_deadline)
            if isinstance(outcome, float):
                renewed_at = outcome
                continue
            self._stop_leading(outcome)
            if cfg.release_on_cancel:
                await self._release()  # no-op unless the Lease still names us (e.g. renew timed out)
            return

    async def _renew_round(self, deadline: float) -> float | str:
        """Poll tryAcquireOrRenew until success (→ the attempt's start time) or failure (→ reason)."""
        cfg = self._config
        remaining = deadline - self._clock()
        if remaining <= 0:
            return "renew deadline passed before the renew round started"
        try:
            async with asyncio.timeout(remaining):
                while True:
                    started = self._clock()
                    if await self._try_acquire_or_renew():
                        return started
                    rec = self._seen.record
                    if rec is not None and rec.holder_identity not in ("", cfg.identity):
                        return f"lease taken by {rec.holder_identity}"
                    # The deadline is checked by our clock too, not only by the timeout's cancellation:
                    # an attempt swallows every failure, and a cancellation lost inside a library's
                    # own timeout handling must not keep a leader renewing past its deadline.
                    if self._clock() >= deadline:
                        raise TimeoutError
                    await asyncio.sleep(cfg.retry_period)
        except TimeoutError:
            return f"no successful renew within renew_deadline ({cfg.renew_deadline:g} s)"

    # ---- tryAcquireOrRenew ------------------------------------------------------------------------

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt (client-go tryAcquireOrRenew). Every failure, of any kind, is a plain False."""
        cfg = self._config
        now_wall = datetime.now(UTC)
        try:
            # (1) Fast path: we hold it and it is valid by our clock → PUT over the cached object.
            rec = self._seen.record
            if (
                self._seen.lease is not None
                and rec is not None
                and rec.holder_identity == cfg.identity
                and self._valid_at(self._clock())
            ):
                body = self._bodies.body(
                    self._seen.lease,
                    holder=cfg.identity,
                    duration=cfg.lease_duration_seconds,
                    acquire=rec.acquire_time or now_wall,
                    renew=now_wall,
                    transitions=rec.lease_transitions,
                )
                try:
                    self._observe(await self._client.replace(cfg.lease_namespace, cfg.lease_name, body))
                except Exception as exc:
                    key, text = _describe(exc)
                    self._limiter.failure(
                        key,
                        "lease %s: renew failed (%s), falling back to GET",
                        cfg.lease_name,
                        text,
                    )
                else:
                    self._limiter.success()
                    return True

            # (2) GET; create on 404.
            lease = await self._client.get(cfg.lease_namespace, cfg.lease_name)
            if lease is None:
                return await self._create(now_wall)

            # (3) Record what we saw; a changed record restarts its expiry clock.
            self._observe(lease)
            rec = self._seen.record
            expired = not self._valid_at(self._clock())
            if rec is None:
                # Unreadable (malformed) record: nobody can judge it, so it is held until it has stayed
                # unchanged for a whole lease duration; then it is overwritten (the PUT carries its RV).
                if not expired:
                    return False
                previous: LeaseRecord | None = None
                acquire, transitions = now_wall, loose_int(lease, "leaseTransitions") + 1
            else:
                # (4) Held by someone else and still valid → not ours.
                if rec.holder_identity and not expired and rec.holder_identity != cfg.identity:
                    return False
                # (5) Ours: keep acquireTime and transitions. Someone else's (or free): a transition.
                previous = rec
                if rec.holder_identity == cfg.identity:
                    acquire, transitions = rec.acquire_time or now_wall, rec.lease_transitions
                else:
                    if self._defers(rec):
                        return False
                    acquire, transitions = now_wall, rec.lease_transitions + 1

            # (6) PUT with the resourceVersion from our GET; a 409 means somebody was faster.
            body = self._bodies.body(
                lease,
                holder=cfg.identity,
                duration=cfg.lease_duration_seconds,
                acquire=acquire,
                renew=now_wall,
                transitions=transitions,
            )
            self._observe(await self._client.replace(cfg.lease_namespace, cfg.lease_name, body))
            self._taken_over_from = previous
            self._limiter.success()
            return True
        except Exception as exc:  # CancelledError is a BaseException and passes through, as it must
            key, text = _describe(exc)
            self._limiter.failure(key, "lease %s: election attempt failed: %s", cfg.lease_name, text)
            return False

    async def _create(self, now_wall: datetime) -> bool:
        """The Lease does not exist (404): create it, unless someone else's record may still be in force."""
        cfg = self._config
        rec = self._seen.record
        held_by_other = (rec is None and self._seen.malformed) or (
            rec is not None and rec.holder_identity not in ("", cfg.identity)
        )
        if held_by_other:
            # Stricter than client-go, which creates at once: a deleted Lease (kubectl delete) does not stop
            # its holder, which keeps exporting until its next renew recreates the Lease, and may have renewed
            # after our last look. So the disappearance counts as a change seen now: the last record stays in
            # force for a whole lease duration from this first 404, as if the holder had just renewed.
            self._seen.see_deletion(self._clock)
            if self._valid_at(self._clock()):
                return False
        # A leader whose Lease was deleted recreates it (client-go does); keep its term's acquireTime and
        # transition count so the Lease does not claim a leadership change that did not happen.
        if self._leading and rec is not None and rec.holder_identity == cfg.identity:
            acquire, transitions = rec.acquire_time or now_wall, rec.lease_transitions
        else:
            acquire, transitions = now_wall, 0
        previous = rec if rec is not None and rec.holder_identity != cfg.identity else None
        self._observe(None)
        body = self._bodies.body(
            None,
            holder=cfg.identity,
            duration=cfg.lease_duration_seconds,
            acquire=acquire,
            renew=now_wall,
            transitions=transitions,
        )
        self._observe(await self._client.create(cfg.lease_namespace, body))  # 409 AlreadyExists → False
        self._taken_over_from = previous  # the last record seen before the deletion carries the watermark
        self._limiter.success()
        return True

    async def _release(self) -> None:
        """Give the Lease up (holder "", 1 s) so a follower takes over on its next retry; bounded."""
        cfg = self._config
        try:
            async with asyncio.timeout(cfg.renew_deadline):
                for _ in range(_RELEASE_ATTEMPTS):
                    rec = self._seen.record
                    if self._seen.lease is None or rec is None or rec.holder_identity != cfg.identity:
                        return  # not ours (any more): nothing to release
                    now_wall = datetime.now(UTC)
                    body = self._bodies.body(
                        self._seen.lease,
                        holder="",
                        duration=RELEASED_LEASE_DURATION,
                        acquire=now_wall,
                        renew=now_wall,
                        transitions=rec.lease_transitions,
                    )
                    try:
                        self._observe(await self._client.replace(cfg.lease_namespace, cfg.lease_name, body))
                    except Exception as exc:
                        if getattr(exc, "status", None) != 409:
                            raise
                        # Our cached copy is stale: typically a renew cut short by the shutdown reached the
                        # server but its answer did not reach us. Read it again; release it if still ours.
                        self._observe(await self._client.get(cfg.lease_namespace, cfg.lease_name))
                        continue
                    log.info("lease %s: released by %s", cfg.lease_name, cfg.identity)
                    return
                raise RuntimeError(f"still conflicting after {_RELEASE_ATTEMPTS} attempts")
        except Exception as exc:  # TimeoutError included
            _, text = _describe(exc)
            log.warning(
                "lease %s: release failed (%s); followers wait for it to expire", cfg.lease_name, text
            )

    # ---- observation ------------------------------------------------------------------------------

    def _observe(self, lease: dict[str, Any] | None) -> None:
        """Remember the Lease as seen now (ObservedLease.update), then tell who holds it."""
        error = self._seen.update(lease, self._clock)
        if error is not None:
            log.warning("lease %s: unreadable Lease (%s)", self._config.lease_name, error)
        rec = self._seen.record
        if rec is not None and self._on_observed is not None:
            safe_call("on_observed", self._on_observed, rec)
        self._report_leader((rec.holder_identity or None) if rec is not None else None)

    def _defers(self, rec: LeaseRecord) -> bool:
        """Hold back from taking ``rec`` until ``takeover_delay(rec)`` after it became free."""
        if self._takeover_delay is None:
            return False
        try:
            delay = self._takeover_delay(rec)
        except Exception:
            log.exception("lease %s: takeover_delay failed; not deferring", self._config.lease_name)
            return False
        if delay <= 0:
            return False
        seen = self._seen.time
        free_since = seen + (rec.lease_duration_seconds if rec.holder_identity else 0.0)
        if self._clock() >= free_since + delay:
            return False
        if self._deferral_logged_for != seen:
            self._deferral_logged_for = seen
            log.info(
                "lease %s: free, but taking it over only %.1f s after it became free, so that a replica "
                "better placed to take over wins first",
                self._config.lease_name,
                delay,
            )
        return True

    def _valid_at(self, now: float) -> bool:
        """The last record seen is still in force at ``now`` (an unreadable one: for our own duration)."""
        return self._seen.valid_at(now, self._config.lease_duration_seconds)

    def _report_leader(self, holder: str | None) -> None:
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        self._last_change = datetime.now(UTC)
        log.info("lease %s: leader is now %s", self._config.lease_name, holder or "(none)")
        safe_call("on_new_leader", self._callbacks.on_new_leader, holder)

    def _start_leading(self) -> None:
        self._leading = True
        self.transitions_seen += 1
        self._last_change = datetime.now(UTC)
        log.info("lease %s: %s started leading", self._config.lease_name, self._config.identity)
        if self._on_transition is not None:
            safe_call("on_transition", self._on_transition, True)
        safe_call("on_started_leading", self._callbacks.on_started_leading, self._taken_over_from)

    def _stop_leading(self, reason: str) -> None:
        self._leading = False
        self.transitions_seen += 1
        self._last_change = datetime.now(UTC)
        # Giving the Lease up on shutdown is routine; losing it otherwise is worth a warning.
        level = logging.INFO if reason == "shutting down" else logging.WARNING
        log.log(
            level, "lease %s: %s stopped leading: %s", self._config.lease_name, self._config.identity, reason
        )
        if self._on_transition is not None:
            safe_call("on_transition", self._on_transition, False)
        safe_call("on_stopped_leading", self._callbacks.on_stopped_leading)
