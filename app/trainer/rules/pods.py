"""Pod rules: which TrainJob a pod belongs to (the labels JobSet writes), whether it holds its node now, the
devices it holds as the scheduler counts them, its JobSet restart attempt, and why it failed.

Its own module because the pods are a watch of their own (app/trainer/pods.py projects them) and none of
the TrainJob rules reads them.

The labels (kubernetes-sigs/jobset v0.12.0): ``pkg/controllers/jobset_controller.go`` labelAndAnnotateObject
writes ``jobset.sigs.k8s.io/jobset-name`` (the JobSet's name), ``replicatedjob-name`` and ``restart-attempt``
(``pkg/constants/constants.go`` RestartsKey: ``strconv.Itoa(js.Status.Restarts)``) on each child Job and on
its pod template, so every pod of a JobSet carries them. The Trainer names the JobSet after its TrainJob and
owns it (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go`` Build:
``jobsetv1alpha2ac.JobSet(trainJob.Name, trainJob.Namespace)`` with the TrainJob as controller owner), so a
pod's JobSet name is its TrainJob's name in the pod's namespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from app.trainer.rules.status import OTHER_REASON, is_condition_reason

# kubernetes-sigs/jobset v0.12.0 api/jobset/v1alpha2/jobset_types.go, pkg/constants/constants.go
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"
# The label selector of the pods watch: the pods that have the JobSet name label at all (existence).
POD_SELECTOR: Final = JOBSET_NAME_LABEL

# status.phase (k8s.io/api core/v1 PodPhase): a pod in a terminal phase holds nothing any more.
SUCCEEDED_PHASE: Final = "Succeeded"
FAILED_PHASE: Final = "Failed"
PENDING_PHASE: Final = "Pending"
_FINISHED_PHASES: Final = frozenset((SUCCEEDED_PHASE, FAILED_PHASE))

# JobSet's status.restarts is an int32; a larger or non-decimal value is not what JobSet writes.
MAX_RESTART_ATTEMPT: Final = 2**31 - 1
# A pod or node name is a DNS-1123 subdomain (<= 253 characters).
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A label value (<= 63 characters, alphanumeric at both ends, '-', '_', '.' between), or empty.
_LABEL_VALUE: Final = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

# (class, count) of each accelerator, sorted by class.
Devices = tuple[tuple[str, int], ...]
NO_DEVICES: Final[Devices] = ()


def is_object_name(value: str) -> bool:
    """A DNS-1123 subdomain: what a pod's or a node's name is."""
    return len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def is_label_value(value: str) -> bool:
    """A Kubernetes label value (the replicated job's name as JobSet writes it)."""
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def restart_attempt(value: object) -> tuple[int | None, bool]:
    """(attempt, malformed) of a ``restart-attempt`` label value: JobSet writes ``strconv.Itoa`` of an int32,
    so a decimal of at most 10 digits within int32; anything else is no attempt, flagged malformed (absent:
    no attempt, not malformed)."""
    if value is None:
        return None, False
    if isinstance(value, str) and 0 < len(value) <= 10 and value.isascii() and value.isdigit():
        attempt = int(value)
        if attempt <= MAX_RESTART_ATTEMPT:
            return attempt, False
    return None, True


def holds_node(node: str, phase: str) -> bool:
    """The pod is bound to a node (``spec.nodeName``) and not finished (phase not Succeeded or Failed):
    the kubelet still runs it or is about to, so its devices are allocated to it."""
    return bool(node) and phase not in _FINISHED_PHASES


def pod_devices(containers: Iterable[Devices], init_containers: Iterable[tuple[Devices, bool]]) -> Devices:
    """The devices a pod holds, per class, as the scheduler counts a pod's requests (kubernetes
    ``staging/src/k8s.io/component-helpers/resource/helpers.go`` AggregateContainerRequests, which the
    scheduler's NodeResourcesFit computes a pod's request with):

    - the sum over the app containers;
    - a restartable init container (``restartPolicy: Always``, a sidecar) runs beside them: it is added to
      that sum, and to the sidecars every later init container runs beside;
    - a plain init container runs alone with the sidecars before it: its need is its own request plus
      theirs; the pod needs the most of any init step;
    - the pod's request is, per class, the larger of the sum and the largest init step.

    ``containers``: each app container's devices; ``init_containers``: each init container's devices and
    whether it is a sidecar, in ``spec.initContainers`` order. A container's devices are its effective
    requests (request, else limit: AcceleratorMatcher.per_node). Counts are whole and positive; the result
    omits classes with 0.
    """
    total: dict[str, int] = {}
    for devices in containers:
        for cls, count in devices:
            total[cls] = total.get(cls, 0) + count
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for devices, sidecar in init_containers:
        if sidecar:
            for cls, count in devices:
                total[cls] = total.get(cls, 0) + count
                sidecars[cls] = sidecars.get(cls, 0) + count
            step = sidecars
        else:
            step = dict(sidecars)
            for cls, count in devices:
                step[cls] = step.get(cls, 0) + count
        for cls, count in step.items():
            if count > init_max.get(cls, 0):
                init_max[cls] = count
    for cls, count in init_max.items():
        if count > total.get(cls, 0):
            total[cls] = count
    return tuple(sorted((cls, count) for cls, count in total.items() if count > 0))


# What the kubelet writes into a failed pod's status.reason (kubernetes v1.33): the eviction manager
# (pkg/kubelet/eviction/helpers.go ``Reason = "Evicted"``, written by evictPod through the status manager)
# and activeDeadlineSeconds (pkg/kubelet/active_deadline.go ``reason = "DeadlineExceeded"``, the pod
# failed by the kubelet's ShouldEvict); admission and node shutdown write others (UnexpectedAdmissionError,
# OutOfcpu, Terminated: pkg/kubelet/lifecycle, pkg/kubelet/nodeshutdown), which show by name as well.
# A container's state.terminated.reason comes from the container runtime through CRI: containerd writes
# "OOMKilled" for a container the kernel's OOM killer ended and "Error" for any other non-zero exit
# (internal/cri/server/container_status.go toCRIContainerStatus), as CRI-O does.
EVICTED_REASON: Final = "Evicted"
POD_DEADLINE_REASON: Final = "DeadlineExceeded"
OOM_KILLED_REASON: Final = "OOMKilled"
ERROR_REASON: Final = "Error"
# Always kept by name, beyond the cap on distinct reasons (app/trainer/pod_failures.py).
POD_FAILURE_REASONS: Final = (
    EVICTED_REASON,
    POD_DEADLINE_REASON,
    OOM_KILLED_REASON,
    ERROR_REASON,
    OTHER_REASON,
)


def pod_failure_reason(status_reason: str, container_reason: str) -> str:
    """The reason label of a failed pod, before the cap on distinct values: the pod's ``status.reason``
    when it is a well-formed reason (the kubelet's: Evicted, DeadlineExceeded, ...), else its failed
    container's ``state.terminated.reason`` (the runtime's: OOMKilled, Error, ...), else ``other``.

    The pod's own reason comes first: the kubelet that evicts a pod or ends it at its deadline kills its
    containers too, and their exit (137, "Error") says less than why they were killed. Well-formed as
    ``finished_total``'s reasons (rules.is_condition_reason: a CamelCase identifier of at most 64
    characters): anything else, or no reason at all, is ``other``."""
    for reason in (status_reason, container_reason):
        if reason and is_condition_reason(reason):
            return reason
    return OTHER_REASON
