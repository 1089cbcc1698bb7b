"""The simulated GPU telemetry at one moment: each device with its job's profile and reading, and the
truth per TrainJob that the chart's GPU rules (helm/trainer-metrics/files/gpu.yaml) must compute from it:

- ``busy_mean``: the mean busy ratio over the job's reporting devices, DCGM_FI_PROF_GR_ENGINE_ACTIVE with
  profiling on, else DCGM_FI_DEV_GPU_UTIL / 100 (a MIG instance has no GPU_UTIL, so without profiling it
  does not report);
- ``devices_reporting``: the devices with a busy value;
- ``memory_used_ratio``: framebuffer used over used plus free, summed over the job's reported devices.
A job whose GPUs send no telemetry has 0 devices reporting and no busy or memory value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubesim.dcgm.devices import Device
from kubesim.dcgm.exposition import used_mib
from kubesim.dcgm.profiles import Profile, Reading, hashed_profile, reading

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobTruth:
    namespace: str
    trainjob: str
    profile: Profile
    devices_held: int
    devices_reporting: int
    busy_mean: float | None
    memory_used_ratio: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "trainjob": self.trainjob,
            "profile": self.profile.value,
            "devices_held": self.devices_held,
            "devices_reporting": self.devices_reporting,
            "busy_mean": self.busy_mean,
            "memory_used_ratio": self.memory_used_ratio,
        }


# (namespace, TrainJob name) -> the profile its annotation names, or None
ProfileLookup = Callable[[str, str], Profile | None]


def profile_of(device: Device, lookup: ProfileLookup) -> Profile:
    holder = device.holder
    if holder.trainjob is None:  # a GPU pod of no TrainJob: its own stable profile
        return hashed_profile(holder.namespace, holder.pod)
    named = lookup(holder.namespace, holder.trainjob)
    return named if named is not None else hashed_profile(holder.namespace, holder.trainjob)


Read = tuple[Device, Profile, Reading | None]


def readings(devices: Iterable[Device], lookup: ProfileLookup) -> list[Read]:
    """Each device with its job's profile and its reading (None: not reported)."""
    return [(d, p, reading(p)) for d in devices for p in (profile_of(d, lookup),)]


def busy_value(device: Device, r: Reading, profiling: bool) -> float | None:
    if profiling:
        return r.gr_engine_active
    return None if device.instance is not None else r.gpu_util / 100


def job_truths(read: Iterable[Read], *, profiling: bool) -> list[JobTruth]:
    by_job: dict[tuple[str, str], list[Read]] = {}
    for item in read:
        holder = item[0].holder
        if holder.trainjob is not None:
            by_job.setdefault((holder.namespace, holder.trainjob), []).append(item)
    out = []
    for (namespace, trainjob), items in sorted(by_job.items()):
        busy = [
            b for d, _p, r in items if r is not None for b in (busy_value(d, r, profiling),) if b is not None
        ]
        used = sum(used_mib(d, r) for d, _p, r in items if r is not None)
        total = sum(d.memory_mib for d, _p, r in items if r is not None)
        out.append(
            JobTruth(
                namespace=namespace,
                trainjob=trainjob,
                profile=items[0][1],
                devices_held=len(items),
                devices_reporting=len(busy),
                busy_mean=sum(busy) / len(busy) if busy else None,
                memory_used_ratio=used / total if total else None,
            )
        )
    return out
