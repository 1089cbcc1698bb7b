"""The join of the pod series (app/metrics/pods.py), as pure rules and one record per job.

A pod belongs to the TrainJob named by its ``jobset-name`` label in its own namespace
(app/trainer/rules/pods.py), while that TrainJob is cached, and only if the pod is not older than it
(``joined``). What a pod adds to its job's series is a pure function of the two (``contribution``), computed
again whenever either changes, never kept. ``JobPods`` is what the join keeps per namespace and JobSet name
with a pod: its pods (a tuple while few, then a dict by key), their device sums and largest restart attempt,
and how many of its pods show an info series.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

import msgspec

from app.trainer import rules
from app.trainer.pods import PodProjection, shared
from app.trainer.projection_types import TrainJobProjection

__all__ = [
    "NOTHING",
    "SMALL_JOB",
    "Contribution",
    "DeviceSums",
    "InfoKey",
    "JobKey",
    "JobPods",
    "Largest",
    "add_sums",
    "contribution",
    "joined",
    "shared_sums",
    "with_attempt",
]

JobKey = str  # "namespace/name" of the TrainJob a pod's jobset-name label names (PodProjection.trainjob_key)
InfoKey = tuple[str, str, str, str, str, str]


def joined(pod: PodProjection, job: TrainJobProjection | None) -> bool:
    """``pod`` belongs to ``job`` (the cached TrainJob of its namespace and JobSet name, or None)."""
    if job is None:
        return False
    # A pod older than the TrainJob is a previous TrainJob's (same name), not yet gone.
    return pod.created is None or job.created is None or pod.created >= job.created


class Contribution(NamedTuple):
    """What one pod adds to its job's series."""

    info: InfoKey | None  # its info series' labels, while it holds a node (None: none)
    devices: rules.Devices  # while it holds a node
    restart: int | None


NOTHING: Final = Contribution(None, (), None)


def contribution(pod: PodProjection, job: TrainJobProjection | None) -> Contribution:
    """What ``pod`` adds to the series of ``job`` (as ``joined`` takes it). A pure function of the two: what
    a pod added is computed again when it changes rather than kept, so the join keeps nothing per pod but
    the pod itself (~200 B a pod less than a kept share, by tracemalloc)."""
    if not joined(pod, job):
        return NOTHING
    assert job is not None
    if not pod.holds_node:
        return Contribution(None, (), pod.restart_attempt)
    name = pod.name
    info: InfoKey | None = None
    node, replicated = pod.node, pod.replicated_job
    if rules.is_object_name(name) and rules.is_object_name(node) and rules.is_label_value(replicated):
        info = (job.namespace, job.name, name, node, replicated, job.runtime_ref)
    return Contribution(info, () if pod.implausible else pod.devices, pod.restart_attempt)


Largest = tuple[int | None, int]  # the largest restart attempt of a job's joined pods, how many have it


def with_attempt(largest: Largest, restart: int | None) -> Largest:
    """``largest`` with one more pod of attempt ``restart`` (None: none) counted."""
    attempt, count = largest
    if restart is None or (attempt is not None and restart < attempt):
        return largest
    return (restart, count + 1) if restart == attempt else (restart, 1)


# A job's pods are kept in a tuple up to this many, then in a dict by key: most jobs have a few pods, and a
# small dict costs ~150 B more than a tuple (a tuple is searched and rebuilt on a change, a dict looked up),
# a list ~25 B more (its header and the room it keeps to grow).
SMALL_JOB: Final = 16

# A job's device sums: (accelerator_class label, total) pairs in the order the classes came. Jobs of one
# template hold the same sums, so the tuples are shared (``shared_sums``), as pods share their devices.
DeviceSums = tuple[tuple[str, int], ...]
_SHARED_SUMS: dict[DeviceSums, DeviceSums] = {}


def shared_sums(sums: DeviceSums) -> DeviceSums:
    """``sums`` as one object per distinct value (app/trainer/pods.py ``shared``)."""
    return shared(_SHARED_SUMS, sums)


def add_sums(sums: DeviceSums, label: str, delta: int) -> DeviceSums:
    """``sums`` with ``delta`` added to ``label``'s total; a total that reaches 0 goes."""
    for i, (have, total) in enumerate(sums):
        if have == label:
            after = total + delta
            if after > 0:
                return (*sums[:i], (label, after), *sums[i + 1 :])
            return sums[:i] + sums[i + 1 :]
    return (*sums, (label, delta)) if delta > 0 else sums


class JobPods(msgspec.Struct, gc=False):
    """The pods of one namespace and JobSet name, and what the joined ones add up to. Untracked by the
    cyclic GC (16 B a job less), as the projections it holds: it is in no reference cycle."""

    key: JobKey  # its TrainJob's key: the one string its pods and its series' entries share
    # In the order they came (replaced in place): a single pod itself (no tuple: 48 B a one-pod job less),
    # a tuple up to SMALL_JOB pods, then a dict by key.
    pods: PodProjection | tuple[PodProjection, ...] | dict[str, PodProjection] = ()
    devices: DeviceSums = ()  # the joined pods' devices per accelerator_class label (shared)
    attempt: int | None = None  # the largest restart attempt of the joined pods
    at_attempt: int = 0  # joined pods with that attempt
    shown: int = 0  # its pods with an info series shown

    def __len__(self) -> int:
        pods = self.pods
        return 1 if isinstance(pods, PodProjection) else len(pods)

    def all(self) -> Iterable[PodProjection]:
        pods = self.pods
        if isinstance(pods, PodProjection):
            return (pods,)
        return pods.values() if isinstance(pods, dict) else pods

    def put(self, pod: PodProjection) -> PodProjection | None:
        """``pod`` is the one of its key; returns the one it replaces."""
        pods, key = self.pods, pod.key
        if isinstance(pods, dict):
            previous = pods.get(key)
            pods[key] = pod
            return previous
        if isinstance(pods, PodProjection):
            if pods.key == key:
                self.pods = pod
                return pods
            self.pods = (pods, pod)
            return None
        if not pods:
            self.pods = pod
            return None
        for i, old in enumerate(pods):
            if old.key == key:
                self.pods = (*pods[:i], pod, *pods[i + 1 :])
                return old
        if len(pods) < SMALL_JOB:
            self.pods = (*pods, pod)
        else:
            self.pods = {old.key: old for old in pods}
            self.pods[key] = pod
        return None

    def pop(self, key: str) -> PodProjection | None:
        pods = self.pods
        if isinstance(pods, dict):
            return pods.pop(key, None)
        if isinstance(pods, PodProjection):
            if pods.key != key:
                return None
            self.pods = ()
            return pods
        for i, old in enumerate(pods):
            if old.key == key:
                rest = pods[:i] + pods[i + 1 :]
                self.pods = rest[0] if len(rest) == 1 else rest
                return old
        return None
