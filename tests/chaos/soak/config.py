"""What a soak run is given: its fault kinds and its configuration (``SoakConfig``, the command line's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FAULT_KINDS = (
    "stall_watches",
    "reset_watches",
    "reset_next_watches",
    "compact_410",
    "throttle_429",
    "error_500",
    "error_503",
    "error_504",
    "apiserver_restart",
    "leader_kill",
    "leader_graceful_restart",
)


@dataclass
class SoakConfig:
    fault_seconds: float = 90.0
    seed: int = 20240611
    rate: float = 120.0  # generator steps per second
    max_jobs: int = 500  # mostly finished jobs waiting out min_delete_age
    # A finished TrainJob is deleted no sooner than this (and an unfinished one cancelled no sooner after its
    # creation): real clusters keep finished jobs for minutes to days. With 0 (the generator's default) a
    # job could finish and be deleted within one informer relist gap (docs/reliability.md).
    min_delete_age: float = 15.0
    namespaces: int = 4
    replicas: int = 3
    fault_gap: tuple[float, float] = (1.0, 3.0)  # seconds between fault episodes
    inactivity_timeout: float = 2.0
    stall_extra: tuple[float, float] = (1.5, 3.0)  # a stall lasts inactivity_timeout + this
    warmup_seconds: float = 25.0
    settle_timeout: float = 60.0
    journal_size: int = 2000  # fills during warm-up, so it does not show up as RSS growth
    history_window: int = 4000
    sample_interval: float = 0.1  # /readyz sampling
    # Start a killed leader's replacement only once a survivor leads (False: at once, racing the takeover).
    replace_after_takeover: bool = True
    # tracemalloc (1 frame) from the start: the report splits the traced memory by part of the process
    # (``memory_part``) at the warm-up point and at the end. About 3x the CPU time; off in CI.
    trace_memory: bool = False
    # Every replica is served over HTTP and a real Prometheus (Debian's `prometheus`, when on PATH) scrapes
    # each one every second; at the end, the increments PromQL can see over the whole run are
    # checked against the truth (tests/support/promql_visible.py). Without the binary an in-process scraper
    # reads every /metrics as often (a hand-over needs scrapes) and the PromQL check is skipped.
    prometheus: bool = True
    # Each replica in a process of its own, as in production (tests/support/replica_process.py), its memory
    # measured in that process (tests/chaos/memory.py); False: every replica on this process's event loop.
    processes: bool = False
    # Process mode: the first ``residents`` replicas are never killed or restarted, so that their memory
    # is followed for the whole run. A leader fault that finds one leading makes it lose the Lease first
    # (its Lease updates fail until it steps down, as a leader cut off from the API), at most
    # ``max_demotions`` times, until another replica leads.
    residents: int = 2
    max_demotions: int = 4
    # Process mode: set in each replica process's environment after the image's malloc settings ("" unsets).
    replica_env: dict[str, str] = field(default_factory=dict)
    memory_interval: float = 2.0  # seconds between RSS readings of each replica process
    structures_every: int = 5  # /debug/snapshot (sizes of the bounded structures) every this many readings
    slope_window: float = 1800.0  # RSS slope over at most the last 30 minutes (and the last half of the run)
    memory_growth_limit: float = 0.10  # a resident's RSS may grow at most this much after the warm-up
    slope_limit: float = 0.05  # MB per minute, checked once the window after the structures were full ...
    slope_min_window: float = 1200.0  # ... spans at least this many seconds
    progress_every: float = 0.0  # seconds between progress lines on stderr (0: none; the command line: 60)
    service_overrides: dict[str, Any] = field(
        default_factory=lambda: {
            "lease_duration_seconds": 3.0,
            "renew_deadline_seconds": 2.0,
            "retry_period_seconds": 0.4,
            "watch_timeout_min_seconds": 20,
            "watch_timeout_max_seconds": 40,
            # The chart's setting for a 1 s scrape interval: born at zero for 2 s (tolerates a failed scrape).
            "zero_hold_seconds": 2.0,
        }
    )


def long_run_config(minutes: float, *, seed: int = SoakConfig.seed, processes: bool = True) -> SoakConfig:
    """The command line's configuration: in process mode four replicas, two of them residents."""
    return SoakConfig(
        fault_seconds=minutes * 60,
        seed=seed,
        warmup_seconds=min(60.0, max(25.0, minutes * 6)),
        processes=processes,
        replicas=4 if processes else 3,
    )
