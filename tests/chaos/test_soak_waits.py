"""The chaos soak's waits are the product's own bounds (tests/chaos/soak/config.py ``waits``), not guesses:
a correct replica is never reported late by them, and they follow the settings they come from."""

from __future__ import annotations

import dataclasses

from app.handover.candidacy import warm_head_start
from app.kube.backoff import Backoff
from app.kube.elector_api import JITTER_FACTOR
from app.kube.informer import InformerOptions
from tests.chaos.soak.config import (
    HOST_SLACK,
    INJECTED_RETRY_AFTER,
    MAX_INJECTED_FAILURES,
    SoakConfig,
    long_run_config,
    waits,
)


def test_a_replica_retrying_at_the_backoff_cap_after_each_injected_failure_is_ready_within_the_wait() -> None:
    """The 20-minute soak's false alarm: a replica's runtimes list failed in an error episode and was retried
    35 s later (two draws of the capped backoff), while the soak allowed the cap + 15 s. The wait now covers
    the longest draw of the informer's backoff (cap x jitter factor) for every failure one episode injects
    in a row, the storm having grown the step to the cap."""
    options = InformerOptions()
    backoff = Backoff(options.backoff_base, options.backoff_cap, rng=lambda: 1.0)  # the longest draw
    for _ in range(10):
        backoff.next_delay()  # a storm of failures: the step is at the cap
    delays = [backoff.next_delay() for _ in range(MAX_INJECTED_FAILURES)]
    assert max(delays) == options.backoff_cap
    w = waits(long_run_config(20))
    assert sum(delays) + HOST_SLACK <= w.ready_after_faults
    assert w.ready_after_faults > 35.0  # the case of the 20-minute soak


def test_the_retry_delay_is_the_longer_of_the_backoff_cap_and_the_injected_retry_after() -> None:
    short = dataclasses.replace(InformerOptions(), backoff_base=0.1, backoff_cap=0.5)
    w = waits(SoakConfig(), short)
    assert w.retry_delay == max(INJECTED_RETRY_AFTER)
    assert w.ready_after_faults == MAX_INJECTED_FAILURES * max(INJECTED_RETRY_AFTER) + HOST_SLACK
    assert waits(SoakConfig()).retry_delay == InformerOptions().backoff_cap


def test_the_lease_waits_follow_the_replicas_lease_settings() -> None:
    cfg = SoakConfig()
    base = waits(cfg)
    overrides = {
        **cfg.service_overrides,
        "lease_duration_seconds": 15.0,
        "renew_deadline_seconds": 10.0,
        "retry_period_seconds": 2.0,
    }
    slow = waits(dataclasses.replace(cfg, service_overrides=overrides))
    poll = 2.0 * (1 + JITTER_FACTOR)
    assert slow.lease_expired == 15.0 + poll
    assert slow.step_down == 2.0 + 10.0 + HOST_SLACK
    # A candidate whose journal does not cover the floor defers by the warm head start (coverage.py).
    assert slow.takeover == 2 * poll + warm_head_start(2.0) + HOST_SLACK
    assert slow.takeover > base.takeover and slow.lease_expired > base.lease_expired
