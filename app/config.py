"""Service configuration, read from the environment (prefix ``TRAINER_METRICS_``) and CLI flags.

Every field is documented in the table of docs/configuration.md; a test keeps the two in step.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.trainer.rules import (
    DEFAULT_ACCELERATOR_PATTERNS,
    MAX_ACCELERATOR_PATTERNS,
    accelerator_pattern_error,
)

ENV_PREFIX = "TRAINER_METRICS_"

# Kubernetes object names (apimachinery validation): a namespace is a DNS-1123 label, a Lease name a
# DNS-1123 subdomain. Anything else can never name an object, so watching or electing with it would run
# "ready" while seeing nothing; better to refuse it at start-up.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SIM_ENV_PREFIX = ENV_PREFIX + "SIM_"
# The zero hold (docs/metrics.md, "How counting works"): at least the scrape interval of every Prometheus.
# In simulate mode the only scraper is a person with curl, who should see counts move within seconds.
DEFAULT_ZERO_HOLD_SECONDS = 60.0
SIMULATE_ZERO_HOLD_SECONDS = 5.0
_DNS1123_LABEL_MAX = 63
_DNS1123_SUBDOMAIN_MAX = 253
# Values of probe_port that turn the separate probe listener off.
_OFF = frozenset({"", "off", "none", "false", "disabled"})


def _default_identity() -> str:
    # The pod name is unique per replica; outside a pod fall back to the host name plus pid.
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def _default_lease_namespace() -> str:
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return sa_ns.read_text().strip() or "default"
    except OSError:
        return "default"


class Settings(BaseSettings):
    # allow_inf_nan=False: "inf" or "nan" parse as floats, and an infinite lease duration or a NaN timeout
    # would start and fail later (or never); every number here must be finite.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, allow_inf_nan=False
    )

    # --- Kubernetes access -------------------------------------------------------------------
    kubeconfig: str | None = Field(
        default=None,
        description="Path of a kubeconfig file. Unset: in-cluster service account, else $KUBECONFIG, "
        "else ~/.kube/config.",
    )
    kube_context: str | None = Field(
        default=None, description="kubeconfig context to use (default: current)."
    )
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated namespaces whose TrainJobs and TrainingRuntimes are watched; "
        "empty watches all namespaces.",
    )
    watch_cluster_runtimes: bool = Field(
        default=True,
        description="Watch ClusterTrainingRuntimes (cluster-scoped: reading them needs a ClusterRole). Off: "
        "no ClusterTrainingRuntime in runtime_info, and a TrainJob of one is counted at once (no wait for "
        "its runtime) with the nodes and accelerators of its own spec only.",
    )

    # --- Leader election ---------------------------------------------------------------------
    leader_election: bool = Field(default=True, description="Elect one exporting replica through a Lease.")
    lease_name: str = Field(
        default="trainer-metrics",
        min_length=1,
        max_length=_DNS1123_SUBDOMAIN_MAX,
        description="Name of the Lease.",
    )
    lease_namespace: str = Field(
        default_factory=_default_lease_namespace,
        min_length=1,
        max_length=_DNS1123_LABEL_MAX,
        description="Namespace of the Lease (default: $POD_NAMESPACE, else the service account's, "
        "else default).",
    )
    identity: str = Field(
        default_factory=_default_identity,
        min_length=1,
        max_length=_DNS1123_SUBDOMAIN_MAX,
        description="This replica's identity in the Lease (default: $POD_NAME, else host_pid).",
    )
    # Bounds: below them the Lease is rewritten several times a second (1e-9 s would be ~1,000 writes/s);
    # above them a dead leader is not replaced for over an hour.
    lease_duration_seconds: float = Field(
        default=15.0, ge=1, le=3600, description="How long a Lease is valid."
    )
    renew_deadline_seconds: float = Field(
        default=10.0, ge=0.5, le=3600, description="How long the leader tries to renew."
    )
    retry_period_seconds: float = Field(
        default=2.0, ge=0.1, le=600, description="Time between election attempts."
    )

    # --- HTTP server -------------------------------------------------------------------------
    host: str = Field(default="0.0.0.0", description="Bind address of the HTTP server.")
    port: int = Field(
        default=8080, ge=0, le=65535, description="Port of the HTTP server (0 picks a free one)."
    )
    probe_port: int | None = Field(
        default=8081,
        ge=0,
        le=65535,
        description="Port of a second, plain-HTTP listener serving only /livez, /healthz and /readyz, with "
        "its own connection cap, so that probes are answered whatever clients do on the main port "
        "(0 picks a free one; `off` disables it).",
    )
    max_connections: int = Field(
        default=512,
        ge=16,
        le=1_000_000,
        description="Connections the main listener holds at once (also kept below the file limit). At the "
        "cap, the connection that has waited longest for a request head is closed to admit a new one; if "
        "every connection is busy with a request, the new one is refused.",
    )
    max_connections_per_client: int = Field(
        default=64,
        ge=1,
        le=1_000_000,
        description="Connections one client address (an IPv6 /64) holds at once on the main listener.",
    )
    http_header_timeout_seconds: float = Field(
        default=10.0,
        ge=0.5,
        le=300,
        description="A connection must deliver a complete request head (after the TLS handshake) within "
        "this long of opening, or of the end of its previous response; else it is closed.",
    )
    http_keep_alive_timeout_seconds: int = Field(
        default=5,
        ge=1,
        le=300,
        description="An idle keep-alive connection is closed after this long.",
    )
    debug_endpoints: bool = Field(
        default=True, description="Serve /debug/snapshot, /debug/terminal, /debug/leadership."
    )

    # --- Security ----------------------------------------------------------------------------
    auth_enabled: bool = Field(
        default=False,
        description="Require a bearer token on /metrics and /debug/*, authenticated by TokenReview and "
        "authorized by SubjectAccessReview (get on the non-resource URL). Probes stay open.",
    )
    auth_cache_seconds: float = Field(
        default=30.0, ge=0, le=3600, description="How long an auth decision is cached."
    )
    # docs/security.md, "When the API server is down": an outage must not blank Prometheus' scrapes.
    auth_outage_grace_seconds: float = Field(
        default=300.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="While the Kubernetes API cannot be reached, a bearer token it allowed on a path is "
        "still allowed there this long past auth_cache_seconds (denials are never extended; 0: none).",
    )
    auth_reviews_per_second: float = Field(
        default=20.0,
        ge=0.1,
        le=10_000,
        description="Token reviews (cache misses) sent per second at most, over all clients (bursts of as "
        "many); a request beyond it is answered 503 with Retry-After, without asking the API server.",
    )
    auth_reviews_per_client_per_second: float = Field(
        default=5.0,
        ge=0.1,
        le=10_000,
        description="Token reviews sent per second at most for one client address (bursts of as many).",
    )
    tls_cert_file: str | None = Field(
        default=None, description="Serve HTTPS with this certificate (PEM); reloaded when the file changes."
    )
    tls_key_file: str | None = Field(default=None, description="Private key (PEM) for tls_cert_file.")

    # --- Logging -----------------------------------------------------------------------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="The least severe records written: DEBUG, INFO, WARNING or ERROR."
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="`text`: one readable line per record, for people; `json`: one JSON object per line, "
        "for log collectors.",
    )

    # --- Informers and limits ----------------------------------------------------------------
    watch_timeout_min_seconds: int = Field(
        default=300, ge=1, le=3600, description="Lower bound of the random server-side watch timeout."
    )
    watch_timeout_max_seconds: int = Field(
        default=600, ge=1, le=3600, description="Upper bound of the random server-side watch timeout."
    )
    watch_inactivity_timeout_seconds: float = Field(
        default=90.0,
        ge=1,
        le=3600,
        description="A watch that delivers no byte (event or bookmark) for this long is treated as dead and "
        "restarted from its last resourceVersion; also marks the informer stale in /readyz.",
    )
    list_page_size: int = Field(default=500, ge=1, le=10000, description="Items per LIST page.")
    streaming_list: Literal["auto", "on", "off"] = Field(
        default="off",
        description="Sync informers by streaming list (a watch with sendInitialEvents) instead of the "
        "paginated LIST: `on`, `off`, or `auto` (try it, use LIST for good if the server refuses it).",
    )
    initial_events_timeout_seconds: float = Field(
        default=300.0,
        ge=1,
        le=3600,
        description="Streaming list: how long a sync may take to reach the end-of-initial-events bookmark; "
        "past it `auto` uses LIST for good and `on` retries. Above the time to stream every watched object.",
    )
    max_unknown_runtime_refs: int = Field(
        default=100,
        ge=0,
        le=100_000,
        description="Distinct runtime references to runtimes not (yet) known that are kept as labels; "
        "beyond it they become `unknown`.",
    )
    # Which resources are accelerators, and how many distinct accelerator classes and failure reasons become
    # label values (docs/metrics.md); the caps bound cardinality against odd clusters.
    accelerator_resource_patterns: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_ACCELERATOR_PATTERNS),
        max_length=MAX_ACCELERATOR_PATTERNS,
        description="Comma-separated resource names counted as accelerators (`accelerator_class` label); "
        "`*` matches any characters (e.g. `nvidia.com/mig-*`). Default: the device resources of NVIDIA "
        "GPUs (also shared, and MIG slices), AMD and Intel GPUs, Google TPUs, Habana Gaudi, AWS Neuron. A "
        "quantity that is not a whole count (`8G`, `500m`) never counts, whatever the pattern.",
    )
    max_accelerator_classes: int = Field(
        default=32,
        ge=0,
        le=10_000,
        description="Distinct `accelerator_class` values (besides `none`); further classes count as `other`.",
    )
    max_failure_reasons: int = Field(
        default=32,
        ge=0,
        le=10_000,
        description="Distinct failure `reason` values besides the upstream ones, `none` and `other`; further "
        "reasons count as `other`.",
    )
    max_object_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        le=256 * 1024 * 1024,
        description="Largest watch line or object accepted; a larger one is skipped and counted.",
    )
    terminal_page_max: int = Field(
        default=1000, ge=1, le=100_000, description="Largest `limit` /debug/terminal accepts."
    )
    handover_journal_size: int = Field(
        default=100_000,
        ge=0,
        le=10_000_000,
        description="Countable events a follower remembers for a gap-free takeover.",
    )
    # app/replica/heap_trim.py: freed heap kept after a transient goes back to the kernel this often.
    heap_trim_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        allow_inf_nan=False,
        description="Every this many seconds, and within a second of each complete list of an informer, give "
        "the heap that glibc keeps after a transient (a relist, a take-over) back to the kernel with "
        "malloc_trim(0), so RSS follows the live memory (0: never).",
    )
    # What PromQL sees (docs/metrics.md, "How counting works"): a new counter/histogram series is served as 0
    # this long before its real values, and a count is handed over as seen only this long after a scrape
    # showed it.
    zero_hold_seconds: float = Field(
        default=DEFAULT_ZERO_HOLD_SECONDS,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="A new Trainer counter or histogram series is served with value 0 for this long before "
        "its real values, so every Prometheus whose scrape interval is at most this long stores the 0 first "
        "(PromQL never counts a series' first sample). At least the scrape interval; 2x tolerates one "
        f"failed scrape. Default {DEFAULT_ZERO_HOLD_SECONDS:g}, {SIMULATE_ZERO_HOLD_SECONDS:g} in simulate "
        "mode.",
    )
    # docs/metrics.md, "From a panel to the job": the TrainJob behind each histogram bucket and counter.
    exemplars: bool = Field(
        default=True,
        description="Attach to every Trainer histogram bucket and to the created and finished counters the "
        "TrainJob (namespace, name, uid) of its last observation, as an exemplar, in the OpenMetrics and "
        "protobuf expositions.",
    )
    handover_wait_seconds: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="A leader stopping gracefully stops counting and waits at most this long for scrapes to "
        "show its last counts before it releases the Lease (default 3 x zero_hold_seconds + 5, 0 in simulate "
        "mode, whose cluster stops with it; 0: no wait).",
    )

    # --- Per-TrainJob series (opt-in; docs/metrics.md, "Per-TrainJob series") ---------------------
    per_trainjob_series: bool | None = Field(
        default=None,
        description="Export one set of gauges per TrainJob (info, state, created time and, from "
        "status.trainerStatus, progress, estimated remaining time, trainer metrics, last update). Default: "
        "off, on in simulate mode.",
    )
    per_trainjob_namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated namespaces whose TrainJobs get per-TrainJob series; empty: every "
        "namespace watched.",
    )
    per_trainjob_max_jobs: int = Field(
        default=10_000,
        ge=0,
        le=1_000_000,
        description="TrainJobs with per-TrainJob series at most; further ones are counted in "
        'trainer_metrics_per_trainjob_jobs{status="over_cap"} and logged once.',
    )
    per_trainjob_max_trainer_metrics: int = Field(
        default=16,
        ge=0,
        le=256,
        description="trainerStatus.metrics exported per TrainJob at most (the first ones written); further "
        "ones are counted as skipped.",
    )

    # --- Pod series (docs/metrics.md, "The pods behind each TrainJob") -------------------------
    pod_series: bool = Field(
        default=True,
        description="Watch the pods of JobSets (label jobset.sigs.k8s.io/jobset-name) and export, per "
        "TrainJob, its pods bound to a node (pod_info), the accelerators they hold and its JobSet restarts. "
        "Needs get/list/watch on pods; without it the pod series are off and everything else works.",
    )
    pod_series_max_pods: int = Field(
        default=50_000,
        ge=0,
        le=1_000_000,
        description="Pods with a kubeflow_trainer_trainjob_pod_info series at most; further ones are counted "
        'in trainer_metrics_pod_series_pods{status="over_cap"} and limit_hits, and logged once.',
    )

    # --- Simulated cluster -------------------------------------------------------------------
    # Its workload is configured apart, by sim/kubesim/trainer/settings.py (TRAINER_METRICS_SIM_*).
    simulate: bool = Field(default=False, description="Start the embedded simulated cluster and watch it.")

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: object) -> object:
        if isinstance(value, str):
            # Only an empty value means "all namespaces": "a,,b" or "," is a typo, not a request to watch
            # everything, so empty entries are kept here and refused below.
            if not value.strip():
                return []
            return [part.strip() for part in value.split(",")]
        return value

    @field_validator("namespaces")
    @classmethod
    def _check_namespaces(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for ns in value:
            if not ns:
                raise ValueError("empty namespace in the list (leave the whole value empty to watch all)")
            _check_name(ns, "namespace", _DNS1123_LABEL, _DNS1123_LABEL_MAX)
            if ns in seen:
                # Two informers on one namespace would count its TrainJobs twice.
                raise ValueError(f"namespace {ns!r} is listed twice")
            seen.add(ns)
        return value

    @field_validator("per_trainjob_namespaces", mode="before")
    @classmethod
    def _split_per_trainjob_namespaces(cls, value: object) -> object:
        return _split_list(value, "namespaces")

    @field_validator("per_trainjob_namespaces")
    @classmethod
    def _check_per_trainjob_namespaces(cls, value: list[str]) -> list[str]:
        for ns in value:
            if not ns:
                raise ValueError("empty namespace in the list (leave the whole value empty for all)")
            _check_name(ns, "namespace", _DNS1123_LABEL, _DNS1123_LABEL_MAX)
        if len(set(value)) != len(value):
            raise ValueError("a namespace is listed twice")
        return value

    @field_validator("accelerator_resource_patterns", mode="before")
    @classmethod
    def _split_patterns(cls, value: object) -> object:
        return _split_list(value, "patterns")

    @field_validator("accelerator_resource_patterns")
    @classmethod
    def _check_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            error = accelerator_pattern_error(pattern)
            if error is not None:
                raise ValueError(f"{pattern[:80]!r}: {error}")
        return value

    @field_validator("streaming_list", mode="before")
    @classmethod
    def _streaming_list_word(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("lease_namespace")
    @classmethod
    def _check_lease_namespace(cls, value: str) -> str:
        return _check_name(value, "namespace", _DNS1123_LABEL, _DNS1123_LABEL_MAX)

    @field_validator("lease_name")
    @classmethod
    def _check_lease_name(cls, value: str) -> str:
        return _check_name(value, "Lease name", _DNS1123_SUBDOMAIN, _DNS1123_SUBDOMAIN_MAX)

    @field_validator("identity")
    @classmethod
    def _check_identity(cls, value: str) -> str:
        # Any text is a valid holderIdentity, but a control character would end up in logs and headers.
        if not value.isprintable():
            raise ValueError("must be printable text")
        return value

    @field_validator("probe_port", mode="before")
    @classmethod
    def _probe_port_off(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in _OFF:
            return None
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> Settings:
        if self.leader_election:
            if not self.lease_duration_seconds > self.renew_deadline_seconds:
                raise ValueError("lease_duration_seconds must be greater than renew_deadline_seconds")
            if not self.renew_deadline_seconds > 1.2 * self.retry_period_seconds:
                raise ValueError("renew_deadline_seconds must be greater than 1.2 * retry_period_seconds")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if self.watch_timeout_max_seconds < self.watch_timeout_min_seconds:
            raise ValueError("watch_timeout_max_seconds must not be below watch_timeout_min_seconds")
        if self.probe_port is not None and self.probe_port != 0 and self.probe_port == self.port:
            raise ValueError("probe_port must differ from port (or be off)")
        if self.http_keep_alive_timeout_seconds > self.http_header_timeout_seconds:
            # An idle connection is cut by the header timeout anyway; a longer keep-alive would be a lie.
            raise ValueError("http_keep_alive_timeout_seconds must not exceed http_header_timeout_seconds")
        if self.namespaces and (unwatched := set(self.per_trainjob_namespaces) - set(self.namespaces)):
            # Nothing is watched there: an allow-list entry that can never match is a typo.
            raise ValueError(
                f"per_trainjob_namespaces names namespaces that are not watched: {sorted(unwatched)[:5]}"
            )
        if self.per_trainjob_series is None:
            # Unset: off, except in simulate mode, where a newcomer should see the per-TrainJob series.
            self.per_trainjob_series = self.simulate
        if self.simulate:
            # Nobody but the person trying it scrapes the demo, and no replica can take over from it (its
            # cluster stops with it): counts move within seconds, and a stop does not wait for scrapes.
            if "zero_hold_seconds" not in self.model_fields_set:
                self.zero_hold_seconds = SIMULATE_ZERO_HOLD_SECONDS
            if self.handover_wait_seconds is None:
                self.handover_wait_seconds = 0.0
        return self


def _check_name(value: str, what: str, pattern: re.Pattern[str], max_length: int) -> str:
    if len(value) <= max_length and pattern.fullmatch(value):
        return value
    rule = (
        "a DNS-1123 label: lower-case letters, digits and '-'"
        if pattern is _DNS1123_LABEL
        else "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.'"
    )
    raise ValueError(
        f"{value[:80]!r} is not a valid {what}; it must be {rule}, start and end with a letter or digit, "
        f"and have at most {max_length} characters"
    )


def _split_list(value: object, what: str) -> object:
    """Comma-separated from the environment; the Helm chart renders a list as JSON."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                raise ValueError(f"not a JSON list of {what}") from None
        return [part.strip() for part in text.split(",")] if text else []
    return value


class SettingsError(Exception):
    """A setting is invalid; the message names it and says what is wrong, in one line."""


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment plus explicit overrides (CLI flags), or raise SettingsError."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc)) from None


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:
            # A rule across several fields: its message names them.
            parts.append(f"invalid settings: {msg}")
            continue
        field = str(err["loc"][0])
        parts.append(f"invalid setting {field} ({ENV_PREFIX}{field.upper()}): {msg}")
    return "; ".join(parts)


def unknown_env_vars() -> list[str]:
    """TRAINER_METRICS_* variables that name no setting (typos, or Kubernetes service links)."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    return sorted(
        k
        for k in os.environ
        # The simulated cluster's settings (sim/kubesim/trainer/settings.py) check their own names.
        if k.startswith(ENV_PREFIX) and not k.startswith(SIM_ENV_PREFIX) and k not in known
    )
