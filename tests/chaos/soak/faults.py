"""The fault episodes: what each kind injects, in shuffled rounds so that every kind occurs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from tests.chaos.soak.config import (
    FAULT_KINDS,
    HOST_SLACK,
    INJECTED_RETRY_AFTER,
    MAX_INJECTED_FAILURES,
    waits,
)

if TYPE_CHECKING:
    from tests.chaos.soak.runner import Soak

log = logging.getLogger("soak")


async def episode(soak: Soak, kind: str) -> dict[str, Any]:
    f = soak.sim.faults
    rng = soak.rng
    info: dict[str, Any] = {"kind": kind, "t": soak.t()}
    watched = ("trainjobs", "trainingruntimes", "clustertrainingruntimes", "pods", None)
    if kind == "stall_watches":
        # Start from a calm state, so the stall alone decides staleness. Fresh activity legitimately
        # restarts the inactivity clock: a list, or a new stream after a reset (not after a silent
        # one). So pending faults of earlier episodes are dropped (one could cut a stalled stream),
        # and every informer must be watching, not listing or backing off.
        f.clear()
        # An informer can sit in its backoff after a run of errors (``Waits.ready_after_faults``).
        calm = await soak.wait_for(
            lambda: soak.all_ready() and soak.all_watching(), waits(soak.cfg).ready_after_faults
        )
        # Not the pods alone: readiness does not wait for the pods watch (app/replica/pods.py), so a
        # stall of it alone is not one readiness must show; None stalls it with the others.
        resource = rng.choice(("trainjobs", None))
        duration = soak.cfg.inactivity_timeout + rng.uniform(*soak.cfg.stall_extra)
        start = soak.t()
        f.stall_watches(resource=resource)
        await asyncio.sleep(duration)  # the fault itself: a stall outlasting the inactivity timeout
        f.release_watches()
        if calm:
            soak.stalls.append((start, soak.t(), resource))
        else:
            soak.uncalm_stalls += 1
        info.update(resource=resource, seconds=round(duration, 2))
    elif kind == "reset_watches":
        info["streams"] = f.reset_watches(resource=rng.choice(watched))
    elif kind == "reset_next_watches":
        n = rng.randint(1, 4)
        f.reset_next_watches(n, resource=rng.choice(watched), after_events=rng.randint(0, 20))
        info["n"] = n
    elif kind == "compact_410":
        f.compact()
    elif kind.startswith(("throttle_", "error_")):
        status = int(kind.rsplit("_", 1)[1])
        n = rng.randint(1, MAX_INJECTED_FAILURES)
        resource = rng.choice(watched)
        watch = rng.choice((None, True, False))
        retry_after = rng.choice(INJECTED_RETRY_AFTER) if status in (429, 503, 504) else None
        f.fail_next(n, status=status, retry_after=retry_after, resource=resource, watch=watch)
        info.update(n=n, resource=resource, watch=watch, retry_after=retry_after)
    elif kind == "apiserver_restart":
        abrupt = rng.random() < 0.5
        info.update(abrupt=abrupt, dropped=f.restart(abrupt=abrupt))
    elif kind in ("leader_kill", "leader_graceful_restart"):
        info.update(await leader_episode(soak, kill=kind == "leader_kill"))
    else:  # pragma: no cover
        raise ValueError(kind)
    soak.injected[kind] += 1
    info["end"] = soak.t()
    return info


async def leader_episode(soak: Soak, *, kill: bool) -> dict[str, Any]:
    info: dict[str, Any] = {}
    # A replica must have had time to observe the events the leader counted (see journal.py limits).
    w = waits(soak.cfg)
    await soak.wait_for(lambda: soak.leader() is not None and soak.all_ready(), w.ready_after_faults)
    leader = soak.leader()
    if leader is None:
        soak.problems.append(f"{soak.t()}: no single leader before a leader fault")
        return {"skipped": "no leader"}
    demoted = 0
    while soak.live[leader].resident and demoted < soak.cfg.max_demotions:
        # A resident process is never stopped (its memory is followed for the whole run): it loses
        # the Lease instead, as a leader that cannot reach the API does, and stays as a follower.
        demoted += 1
        new = await demote(soak, leader)
        if new is None:
            info["demoted"] = demoted
            return info
        leader = new
    info["demoted"] = demoted
    if soak.live[leader].resident:
        return info
    info["leader"] = leader
    gone = soak.t()
    await soak.stop_replica(leader, kill=kill)
    # The replacement pod starts once a survivor leads: a fresh replica that wins the election could
    # not replay what happened before its initial list (journal.py, limits; see docs/reliability.md).
    if not soak.cfg.replace_after_takeover:
        info["replacement"] = await soak.start_replica(None if kill else leader)
    # A killed leader's Lease expires, then a candidate takes it (a graceful one released it already).
    took_over = await soak.wait_for(lambda: soak.leader() is not None, w.lease_expired + w.takeover)
    info["takeover_s"] = round(soak.t() - gone, 2) if took_over else None
    info["new_leader"] = soak.leader()
    if not took_over:
        soak.problems.append(
            f"{soak.t()}: no takeover within {w.lease_expired + w.takeover:g} s after {leader} went away"
        )
    if soak.cfg.replace_after_takeover:
        info["replacement"] = await soak.start_replica(None if kill else leader)
    return info


async def demote(soak: Soak, leader: str) -> str | None:
    """The leader cannot renew: every Lease update fails (503) until it has stopped leading (its renew
    deadline) and the Lease has expired for every replica (its duration after the last change each saw),
    so that the replicas race for it on equal terms (the old holder would otherwise renew at once).
    Returns the new leader, which may be the same replica. Every wait is ``Waits``' (config.py)."""
    faults = soak.sim.faults
    w = waits(soak.cfg)
    faults.fail_next(1_000_000, status=503, retry_after=None, resource="leases", method="PUT")
    failure = faults._failures[-1]
    since = time.monotonic()
    expired = since + w.lease_expired
    try:
        stepped_down = await soak.wait_for(lambda: not soak.live[leader].leading(), w.step_down)
        await soak.wait_for(lambda: time.monotonic() >= expired, w.lease_expired + HOST_SLACK)
    finally:
        with contextlib.suppress(ValueError):
            faults._failures.remove(failure)
    soak.demotions += 1
    if not stepped_down:
        soak.problems.append(
            f"{soak.t()}: {leader} still led {w.step_down:g} s after its Lease updates began to fail"
        )
        return None
    if not await soak.wait_for(lambda: soak.leader() is not None, w.takeover):
        soak.problems.append(f"{soak.t()}: no single leader {w.takeover:g} s after {leader} was demoted")
        return None
    # Every replica ready before the next fault. A replica whose list failed in an earlier episode retries
    # after a draw of up to its backoff step, which the storm has grown to the cap: not ready that long, for
    # each failure an episode injected in a row, is correct, not a fault (``Waits.ready_after_faults``).
    if not await soak.wait_for(soak.all_ready, w.ready_after_faults):
        not_ready = sorted(identity for identity, e in soak.live.items() if not e.ready())
        soak.problems.append(
            f"{soak.t()}: {w.ready_after_faults:g} s after {leader} was demoted and {soak.leader()} led: "
            f"not ready {not_ready}"
        )
        return None
    return soak.leader()


def progress(soak: Soak) -> str:
    """One line for an unattended run's log: where the soak is."""
    truth = sum(soak.gen.truth.created.values()) - soak.created_before
    residents = [p for p in soak.processes if p.resident and p.rss]
    memory = ", ".join(f"{p.identity} {p.rss[-1][1] / 2**20:.1f} MB" for p in residents)
    return (
        f"[soak {soak.t():7.0f} s] episodes {len(soak.episodes)}, leader {soak.leader()}, "
        f"terms {len(soak.recorder.terms)}, replicas started {soak.replica_seq}, "
        f"created: truth {truth:g}, counted {soak.counted_created:g}" + (f"; RSS {memory}" if memory else "")
    )


async def faults_loop(soak: Soak, stop_at: float) -> None:
    deck: list[str] = []
    next_progress = time.monotonic() + soak.cfg.progress_every
    while time.monotonic() < stop_at:
        if soak.cfg.progress_every and time.monotonic() >= next_progress:
            next_progress += soak.cfg.progress_every
            print(progress(soak), file=sys.stderr, flush=True)
        await asyncio.sleep(soak.rng.uniform(*soak.cfg.fault_gap))  # the gap between faults (scenario)
        if time.monotonic() >= stop_at:
            break
        if not deck:
            deck = list(FAULT_KINDS)
            soak.rng.shuffle(deck)
        kind = deck.pop()
        try:
            soak.episodes.append(await episode(soak, kind))
        except Exception as exc:
            soak.problems.append(f"fault episode {kind} raised {exc!r}")
            log.exception("fault episode %s failed", kind)
