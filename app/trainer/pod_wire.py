"""Wire types of the pods watch: the msgspec structs a pod's watch line or LIST item is decoded into.

Only the JSON paths the pod rules read (app/trainer/rules/pods.py), so msgspec skips the rest of a pod
(volumes, env, probes, managedFields, conditions...) unread. A value of the wrong JSON type fails decoding
and the informer takes the tolerant path (app/trainer/pods.py ``PodProjector.from_json``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from app.trainer.rules.pods import JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, RESTART_ATTEMPT_LABEL
from app.trainer.wire import Resources

# As for the Trainer objects: an object without a name or uid cannot be tracked, and the typed path admits
# only what the tolerant path admits.
_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class PodLabels(msgspec.Struct, forbid_unknown_fields=False):
    """The labels the pod series read (rules/pods.py, which cites JobSet for them); a pod carries a dozen
    more, which msgspec skips instead of building a dict of them for every pod listed."""

    jobset_name: str | None = msgspec.field(default=None, name=JOBSET_NAME_LABEL)
    replicated_job: str | None = msgspec.field(default=None, name=REPLICATED_JOB_LABEL)
    restart_attempt: str | None = msgspec.field(default=None, name=RESTART_ATTEMPT_LABEL)


class PodMeta(msgspec.Struct, forbid_unknown_fields=False):
    name: _NonEmpty
    uid: _NonEmpty
    namespace: str = ""
    resourceVersion: str = ""
    creationTimestamp: str | None = None
    labels: PodLabels | None = None


class PodContainer(msgspec.Struct, forbid_unknown_fields=False):
    resources: Resources | None = None
    # Init containers only: "Always" makes one a sidecar (it runs beside the app containers).
    restartPolicy: str | None = None


class PodSpecWire(msgspec.Struct, forbid_unknown_fields=False):
    nodeName: str = ""
    containers: list[PodContainer] | None = None
    initContainers: list[PodContainer] | None = None


class TerminatedWire(msgspec.Struct, forbid_unknown_fields=False):
    reason: str = ""
    exitCode: int = 0


class ContainerStateWire(msgspec.Struct, forbid_unknown_fields=False):
    terminated: TerminatedWire | None = None


class ContainerStatusWire(msgspec.Struct, forbid_unknown_fields=False):
    state: ContainerStateWire | None = None


class PodStatusWire(msgspec.Struct, forbid_unknown_fields=False):
    phase: str = ""
    reason: str = ""  # set by the kubelet or the eviction manager: Evicted, DeadlineExceeded, ...
    containerStatuses: list[ContainerStatusWire] | None = None


class PodWire(msgspec.Struct, forbid_unknown_fields=False):
    """The parts of a pod the pods watch reads."""

    metadata: PodMeta
    spec: PodSpecWire | None = None
    status: PodStatusWire | None = None
