"""What a soak run is given: its fault kinds and its configuration (``SoakConfig``, the command line's), and
the waits and allowances derived from the product's own bounds (``Waits``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.handover.candidacy import warm_head_start
from app.kube.backoff import JITTER_FACTOR as BACKOFF_JITTER
from app.kube.elector_api import JITTER_FACTOR as ELECTOR_JITTER
from app.kube.informer import InformerOptions

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

# An error episode (faults.py) fails the next 1 to MAX_INJECTED_FAILURES requests in a row, each 429/503/504
# with a Retry-After drawn from INJECTED_RETRY_AFTER seconds.
MAX_INJECTED_FAILURES = 4
INJECTED_RETRY_AFTER = (1, 2)
# The harness's own allowance for a loaded host, added once to each product bound below: the event loops of
# the replicas, of the simulated cluster and of the soak are late by up to this much on two busy cores
# (status records every 0.1 s, process start-up, a LIST of a few hundred TrainJobs). The only number here
# that is not the product's.
HOST_SLACK = 10.0


@dataclass
class SoakConfig:
    fault_seconds: float = 90.0
    seed: int = 20240611
    rate: float = 120.0  # generator steps per second
    max_jobs: int = 500  # mostly finished jobs waiting out min_delete_age
    # The simulated cluster runs the TrainJobs' pods (their churn and failures: pod_failures_total, the pods
    # watch's faults); False: TrainJobs alone.
    pods: bool = True
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


@dataclass(frozen=True)
class Waits:
    """How long the soak waits for what the product bounds, each derived in ``waits``."""

    retry_delay: float  # the longest wait of an informer before it retries a failed request
    ready_after_faults: float  # every replica ready again, from the last fault that failed its requests
    step_down: float  # a leader that cannot renew has stopped leading
    lease_expired: float  # the Lease of a leader that stopped renewing has expired for every replica
    takeover: float  # a replica leads, from the moment the Lease expired or was released

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


def waits(cfg: SoakConfig, options: InformerOptions | None = None) -> Waits:
    """The soak's waits, from the replicas' own bounds (their settings in ``cfg.service_overrides``, the
    informers' backoff, the elector's jitter and the take-over deferral), plus ``HOST_SLACK`` once each.

    * An informer retries a failed request after a draw of at most its backoff step (capped at
      ``backoff_cap``, times the backoff's jitter factor: app/kube/backoff.py), or after the server's
      Retry-After if longer (app/kube/reflector.py). An error episode fails up to ``MAX_INJECTED_FAILURES``
      of its requests in a row, and a storm of episodes keeps its step at the cap (reset only after
      ``backoff_reset`` without failures): it is ready again at most that many retries after the fault.
    * A leader that cannot renew stops leading ``renew_deadline`` after the start of its last renew round,
      which began at most a retry period before the failures did.
    * Its Lease expires for a follower ``lease_duration`` after the follower last saw it change, which it
      polls every 1 to 1 + elector jitter retry periods (app/kube/elector.py).
    * A candidate takes a free Lease at its next attempt (the same poll), or, when its journal does not
      cover the floor, ``warm_head_start`` later (app/handover/coverage.py), and one attempt that fails
      (a 409 after another's write) costs one more poll.
    """
    options = options or InformerOptions()
    o = cfg.service_overrides
    lease, renew, retry = (
        float(o["lease_duration_seconds"]),
        float(o["renew_deadline_seconds"]),
        float(o["retry_period_seconds"]),
    )
    poll = retry * (1.0 + ELECTOR_JITTER)
    retry_delay = max(options.backoff_cap * BACKOFF_JITTER, float(max(INJECTED_RETRY_AFTER)))
    return Waits(
        retry_delay=retry_delay,
        ready_after_faults=MAX_INJECTED_FAILURES * retry_delay + HOST_SLACK,
        step_down=retry + renew + HOST_SLACK,
        lease_expired=lease + poll,
        takeover=2 * poll + warm_head_start(retry) + HOST_SLACK,
    )
