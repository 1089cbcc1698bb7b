"""Settings of the embedded simulated cluster (``trainer-metrics --simulate``), apart from the service's.

The service's own ``Settings`` describe how it watches a cluster; these describe the demo workload the
simulated cluster runs. Same environment prefix as the service, so a user's ``TRAINER_METRICS_SIM_*``
variables keep working.
"""

from __future__ import annotations

import os

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

# The service (app/config.py) leaves variables with this prefix to the simulated cluster.
SIM_ENV_PREFIX = "TRAINER_METRICS_SIM_"


class SimSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=SIM_ENV_PREFIX, extra="forbid")

    jobs: int = Field(default=200, ge=0, le=1_000_000, description="TrainJobs the generator keeps alive.")
    rate: float = Field(
        default=5.0, ge=0, le=10_000, allow_inf_nan=False, description="Generator steps per second."
    )
    seed: int | None = Field(default=None, description="Random seed (default: random).")


class SimSettingsError(Exception):
    """A simulate-mode setting is invalid; the message names it, in one line."""


def load_sim_settings(**overrides: object) -> SimSettings:
    try:
        return SimSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"invalid setting sim_{field} ({SIM_ENV_PREFIX}{field.upper()}): {msg}")
        raise SimSettingsError("; ".join(parts)) from None


def unknown_sim_env_vars() -> list[str]:
    """TRAINER_METRICS_SIM_* variables that name no simulate-mode setting (typos)."""
    known = {SIM_ENV_PREFIX + name.upper() for name in SimSettings.model_fields}
    return sorted(k for k in os.environ if k.startswith(SIM_ENV_PREFIX) and k not in known)
