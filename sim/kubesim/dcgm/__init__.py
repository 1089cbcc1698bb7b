"""A simulated NVIDIA dcgm-exporter: per-GPU series, with dcgm-exporter's names and labels, for the devices
the simulated cluster's pods hold, each TrainJob's GPUs following a profile (busy, idle, hung, no
telemetry), and the truth per TrainJob that the chart's GPU rules must compute from them."""

from kubesim.dcgm.profiles import PROFILE_ANNOTATION, Profile
from kubesim.dcgm.server import SimulatedDcgmExporter

__all__ = ["PROFILE_ANNOTATION", "Profile", "SimulatedDcgmExporter"]
