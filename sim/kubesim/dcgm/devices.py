"""The NVIDIA devices the pods of the simulated cluster hold, as dcgm-exporter's pod mapper sees them: pure
functions from pod objects to devices, each device numbered on its node and given to one container.

Which pods hold devices is the kubelet's rule (``spec.nodeName`` set, phase not Succeeded or Failed); how
many is each app container's effective request (request, else limit), per class:
- ``nvidia.com/gpu``: whole GPUs;
- ``nvidia.com/mig-<profile>`` (the GPU Operator's mixed MIG strategy): MIG instances of that profile, packed
  onto MIG-mode GPUs of the node, seven instances each; an instance is the device (UUID, GPU_I_ID).
Other classes (``nvidia.com/gpu.shared``, other vendors) are not DCGM devices of their own here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
GPU: Final = "nvidia.com/gpu"
MIG_PREFIX: Final = "nvidia.com/mig-"
_MIG_PROFILE = re.compile(r"([1-7])g\.([0-9]{1,3})gb(?:\+me)?")
MIG_PER_GPU: Final = 7
GPU_MEMORY_MIB: Final = 81920  # an A100 80GB's framebuffer
MODEL_NAME: Final = "NVIDIA A100-SXM4-80GB"
_FINISHED: Final = frozenset(("Succeeded", "Failed"))
_UUID_NS: Final = uuid.UUID("5f0c3a52-4a0e-4b7c-9d7a-6b3f2e1d0c9b")


@dataclass(frozen=True, slots=True)
class Holder:
    """The pod and container a device is given to, and the TrainJob (the JobSet's name) if any."""

    namespace: str
    pod: str
    container: str
    trainjob: str | None


@dataclass(frozen=True, slots=True)
class Device:
    node: str
    gpu: int  # the physical GPU's index on the node (dcgm-exporter's `gpu`, the `nvidia<gpu>` device)
    uuid: str  # the physical GPU's
    mig_profile: str | None  # GPU_I_PROFILE, on a MIG instance only
    instance: int | None  # GPU_I_ID, on a MIG instance only
    memory_mib: int  # the device's framebuffer
    holder: Holder


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID of GPU ``index`` on ``node``, in NVML's ``GPU-<uuid>`` form."""
    return f"GPU-{uuid.uuid5(_UUID_NS, f'{node}/{index}')}"


def _count(value: Any) -> int:
    """A whole device quantity ("2", 2); 0 for anything else (a device is never fractional)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 4:
        return int(value)
    return 0


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def container_devices(container: Any) -> list[tuple[str, int]]:
    """(class, count) of one container's NVIDIA requests (request, else limit), in class order."""
    if not isinstance(container, dict):
        return []
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return []
    requests = _mapping(resources.get("requests"))
    limits = _mapping(resources.get("limits"))
    out = []
    for cls in sorted({*requests, *limits}):
        if cls == GPU or (cls.startswith(MIG_PREFIX) and _MIG_PROFILE.fullmatch(cls[len(MIG_PREFIX) :])):
            count = _count(requests[cls] if cls in requests else limits[cls])
            if count:
                out.append((cls, count))
    return out


def mig_memory_mib(profile: str) -> int:
    """The framebuffer of a MIG instance: ``<n>g.<size>gb`` has ``size`` GiB (less in reality; close)."""
    match = _MIG_PROFILE.fullmatch(profile)
    return int(match.group(2)) * 1024 if match else 0


def holds_devices(pod: Any) -> bool:
    spec = pod.get("spec") if isinstance(pod, dict) else None
    status = pod.get("status") if isinstance(pod, dict) else None
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    phase = status.get("phase") if isinstance(status, dict) else None
    return isinstance(node, str) and bool(node) and phase not in _FINISHED


def _holder(pod: dict[str, Any], container: str) -> Holder:
    meta = _mapping(pod.get("metadata"))
    labels = _mapping(meta.get("labels"))
    trainjob = labels.get(JOBSET_NAME_LABEL)
    return Holder(
        namespace=str(meta.get("namespace", "")),
        pod=str(meta.get("name", "")),
        container=container,
        trainjob=trainjob if isinstance(trainjob, str) and trainjob else None,
    )


def _pod_key(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def devices(pods: Iterable[Any]) -> list[Device]:
    """Every device held by ``pods`` (stored Pod objects), numbered per node in (namespace, name) order so the
    same pods always get the same devices."""
    held = sorted((p for p in pods if holds_devices(p)), key=_pod_key)
    next_gpu: dict[str, int] = {}
    # Per node: the MIG-mode GPU being filled (index, instances used), across pods.
    mig_gpu: dict[str, tuple[int, int]] = {}
    out: list[Device] = []
    for pod in held:
        node = pod["spec"]["nodeName"]
        for container in pod["spec"].get("containers") or []:
            name = container.get("name", "") if isinstance(container, dict) else ""
            holder = _holder(pod, str(name))
            for cls, count in container_devices(container):
                for _ in range(count):
                    if cls == GPU:
                        index = next_gpu.get(node, 0)
                        next_gpu[node] = index + 1
                        uid = gpu_uuid(node, index)
                        out.append(Device(node, index, uid, None, None, GPU_MEMORY_MIB, holder))
                        continue
                    index, used = mig_gpu.get(node, (-1, MIG_PER_GPU))
                    if used == MIG_PER_GPU:
                        index, used = next_gpu.get(node, 0), 0
                        next_gpu[node] = index + 1
                    mig_gpu[node] = (index, used + 1)
                    profile = cls[len(MIG_PREFIX) :]
                    device = Device(
                        node, index, gpu_uuid(node, index), profile, used + 1, mig_memory_mib(profile), holder
                    )
                    out.append(device)
    return out
