"""dcgm-exporter's ``/metrics`` for the simulated devices, written as dcgm-exporter writes it.

From NVIDIA/dcgm-exporter (4.x):
- ``etc/default-counters.csv``: each field's name, type and help (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_FREE,
  DCGM_FI_DEV_FB_USED, and the profiling field DCGM_FI_PROF_GR_ENGINE_ACTIVE of the profiling counters);
- ``internal/pkg/rendermetrics/render_metrics.go`` (gpuMetricsFormat): every series has ``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``; a MIG instance also ``GPU_I_PROFILE`` and ``GPU_I_ID``; then the
  host as ``Hostname`` (``hostname`` on the main branch), then the pod mapper's labels in key order
  (``internal/pkg/transformation/kubernetes.go``: ``container``, ``namespace``, ``pod`` of the pod the
  device is given to), then the attributes (``DCGM_FI_DRIVER_VERSION``, a ``label`` field of the counters);
- a blank value is not written: a MIG instance has no DCGM_FI_DEV_GPU_UTIL (NVML reports no utilisation per
  GPU instance), and without profiling (off in DCGM, a GPU without it, another profiler attached) no
  DCGM_FI_PROF_* field is written at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from kubesim.dcgm.devices import MODEL_NAME, Device
from kubesim.dcgm.profiles import Reading

DRIVER_VERSION: Final = "570.124.06"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    help: str
    profiling: bool  # a DCGM_FI_PROF_* field: written only with profiling on
    value: Callable[[Device, Reading], str | None]  # None: blank, not written


def used_mib(device: Device, reading: Reading) -> int:
    return round(device.memory_mib * reading.memory_used)


def _util(device: Device, reading: Reading) -> str | None:
    return None if device.instance is not None else str(reading.gpu_util)


def _fb_free(device: Device, reading: Reading) -> str:
    return str(device.memory_mib - used_mib(device, reading))


def _fb_used(device: Device, reading: Reading) -> str:
    return str(used_mib(device, reading))


def _gr_engine(device: Device, reading: Reading) -> str:
    return f"{reading.gr_engine_active:f}"  # Go's %f, as dcgm-exporter formats a float field


# In the counters file's order.
FIELDS: Final = (
    Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", False, _util),
    Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", False, _fb_free),
    Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", False, _fb_used),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", True, _gr_engine),
)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def device_labels(device: Device, host_label: str) -> str:
    parts = [
        ("gpu", str(device.gpu)),
        ("UUID", device.uuid),
        ("pci_bus_id", f"00000000:{0x07 + device.gpu:02X}:00.0"),
        ("device", f"nvidia{device.gpu}"),
        ("modelName", MODEL_NAME),
    ]
    if device.mig_profile is not None and device.instance is not None:
        parts += [("GPU_I_PROFILE", device.mig_profile), ("GPU_I_ID", str(device.instance))]
    holder = device.holder
    parts += [
        (host_label, device.node),
        ("container", holder.container),
        ("namespace", holder.namespace),
        ("pod", holder.pod),
        ("DCGM_FI_DRIVER_VERSION", DRIVER_VERSION),
    ]
    return ",".join(f'{k}="{_escape(v)}"' for k, v in parts)


def render(
    readings: Iterable[tuple[Device, Reading]], *, profiling: bool = True, host_label: str = "Hostname"
) -> str:
    """The exposition of the reported devices (those with a reading), one family per field."""
    reported = [(d, r, device_labels(d, host_label)) for d, r in readings]
    lines: list[str] = []
    for field in FIELDS:
        if field.profiling and not profiling:
            continue
        lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} gauge"]
        for device, reading, labels in reported:
            value = field.value(device, reading)
            if value is not None:
                lines.append(f"{field.name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"
