"""What a TrainJob's GPUs do in the simulated cluster: one profile per job, each a constant reading of every
device the job holds, so a test knows exactly what PromQL must compute from them.

A job's profile is the value of its annotation ``kubesim.kubeflow.org/gpu-profile`` when that names one,
else a stable hash of its namespace and name (most jobs busy, some idle, a few hung or without telemetry).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Final, assert_never

PROFILE_ANNOTATION: Final = "kubesim.kubeflow.org/gpu-profile"


class Profile(enum.StrEnum):
    BUSY = "busy"  # training: GPUs mostly busy, progress reported
    IDLE = "idle"  # holds GPUs it does not use (data loading, a wait, a job left running)
    HUNG = "hung"  # busy GPUs and no progress: a collective spinning on a lost peer
    NO_TELEMETRY = "no-telemetry"  # its GPUs are absent from dcgm-exporter (not scraped, no pod mapping)


@dataclass(frozen=True, slots=True)
class Reading:
    """What every device of a job with this profile reports. ``gr_engine_active`` is
    DCGM_FI_PROF_GR_ENGINE_ACTIVE (0-1, a profiling field), ``gpu_util`` DCGM_FI_DEV_GPU_UTIL (whole percent:
    DCGM reports it as an integer); they differ on purpose, so a test can tell which one a rule read.
    ``memory_used`` is the share of each device's framebuffer in use."""

    gr_engine_active: float
    gpu_util: int
    memory_used: float


def reading(profile: Profile) -> Reading | None:
    """The constant reading of ``profile``'s devices; None: they are not reported at all."""
    match profile:
        case Profile.BUSY:
            return Reading(gr_engine_active=0.82, gpu_util=91, memory_used=0.75)
        case Profile.IDLE:
            return Reading(gr_engine_active=0.01, gpu_util=2, memory_used=0.25)
        case Profile.HUNG:
            return Reading(gr_engine_active=0.97, gpu_util=100, memory_used=0.8)
        case Profile.NO_TELEMETRY:
            return None
        case _:
            assert_never(profile)


# Shares (out of 100) of the jobs without an annotation, in this order.
_HASHED: Final = ((Profile.BUSY, 70), (Profile.IDLE, 15), (Profile.HUNG, 10), (Profile.NO_TELEMETRY, 5))


def hashed_profile(namespace: str, name: str) -> Profile:
    """A job's profile when it names none: stable across runs and processes (not Python's salted hash)."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % 100
    for profile, share in _HASHED:
        if bucket < share:
            return profile
        bucket -= share
    raise AssertionError("the shares add up to 100")


def parse_profile(value: object) -> Profile | None:
    """The profile an annotation names; None when it names none (absent, not a string, unknown)."""
    if isinstance(value, str):
        try:
            return Profile(value.strip().lower())
        except ValueError:
            return None
    return None
