"""Service configuration, read from the environment (prefix ``TRAINER_METRICS_``) and CLI flags.

Every field is documented in the README's configuration table; a test keeps the two in step.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "TRAINER_METRICS_"


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
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

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

    # --- Leader election ---------------------------------------------------------------------
    leader_election: bool = Field(default=True, description="Elect one exporting replica through a Lease.")
    lease_name: str = Field(default="trainer-metrics", min_length=1, description="Name of the Lease.")
    lease_namespace: str = Field(
        default_factory=_default_lease_namespace,
        min_length=1,
        description="Namespace of the Lease (default: $POD_NAMESPACE, else the service account's, "
        "else default).",
    )
    identity: str = Field(
        default_factory=_default_identity,
        min_length=1,
        description="This replica's identity in the Lease (default: $POD_NAME, else host_pid).",
    )
    lease_duration_seconds: float = Field(default=15.0, gt=0, description="How long a Lease is valid.")
    renew_deadline_seconds: float = Field(
        default=10.0, gt=0, description="How long the leader tries to renew."
    )
    retry_period_seconds: float = Field(default=2.0, gt=0, description="Time between election attempts.")

    # --- HTTP server -------------------------------------------------------------------------
    host: str = Field(default="0.0.0.0", description="Bind address of the HTTP server.")
    port: int = Field(
        default=8080, ge=0, le=65535, description="Port of the HTTP server (0 picks a free one)."
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
    auth_cache_seconds: float = Field(default=30.0, ge=0, description="How long an auth decision is cached.")
    tls_cert_file: str | None = Field(
        default=None, description="Serve HTTPS with this certificate (PEM); reloaded when the file changes."
    )
    tls_key_file: str | None = Field(default=None, description="Private key (PEM) for tls_cert_file.")

    # --- Logging -----------------------------------------------------------------------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        default="text", description="text for people, json for machines."
    )

    # --- Informers and limits ----------------------------------------------------------------
    watch_timeout_min_seconds: int = Field(
        default=300, ge=1, description="Lower bound of the random server-side watch timeout."
    )
    watch_timeout_max_seconds: int = Field(
        default=600, ge=1, description="Upper bound of the random server-side watch timeout."
    )
    watch_inactivity_timeout_seconds: float = Field(
        default=90.0,
        gt=0,
        description="A watch that delivers no byte (event or bookmark) for this long is treated as dead and "
        "restarted from its last resourceVersion; also marks the informer stale in /readyz.",
    )
    list_page_size: int = Field(default=500, ge=1, le=10000, description="Items per LIST page.")
    max_unknown_runtime_refs: int = Field(
        default=100,
        ge=0,
        description="Distinct runtime references to runtimes not (yet) known that are kept as labels; "
        "beyond it they become `unknown`.",
    )
    max_object_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        description="Largest watch line or object accepted; a larger one is skipped and counted.",
    )
    terminal_page_max: int = Field(default=1000, ge=1, description="Largest `limit` /debug/terminal accepts.")
    handover_journal_size: int = Field(
        default=100_000,
        ge=0,
        description="Countable events a follower remembers for a gap-free takeover.",
    )

    # --- Simulated cluster -------------------------------------------------------------------
    simulate: bool = Field(default=False, description="Start the embedded simulated cluster and watch it.")
    sim_jobs: int = Field(
        default=200, ge=0, description="Simulate mode: TrainJobs the generator keeps alive."
    )
    sim_rate: float = Field(default=5.0, ge=0, description="Simulate mode: generator steps per second.")
    sim_seed: int | None = Field(default=None, description="Simulate mode: random seed (default: random).")

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
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
        return self


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
    return sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and k not in known)
