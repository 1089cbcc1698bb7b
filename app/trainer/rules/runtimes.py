"""Rules of a Trainer runtime: the bounded runtime_ref label, ml_policy / pod_group_policy / framework,
and what the controller does with a runtime's replicated jobs (ancestor, MPI launcher, resource merge).

Its own module because these rules read a runtime (or a TrainJob's spec.runtimeRef), not a job's status.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Final

from app.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINER_GROUP, TRAINING_RUNTIMES
from app.trainer.rules.labels import _MAX_MEMO_KEY, _MEMO_MAX, MAX_LABEL_VALUE, NONE, UNKNOWN, is_dns_label
from app.trainer.rules.nodes import NODE, coerce_count

ML_POLICIES: Final = ("torch", "mpi", "flux", "jax", "xgboost", NONE, UNKNOWN)
POD_GROUP_POLICIES: Final = ("coscheduling", "volcano", NONE, UNKNOWN)

TRAINING_RUNTIME_KIND: Final = TRAINING_RUNTIMES.kind
CLUSTER_TRAINING_RUNTIME_KIND: Final = CLUSTER_TRAINING_RUNTIMES.kind
RUNTIME_KINDS: Final = (TRAINING_RUNTIME_KIND, CLUSTER_TRAINING_RUNTIME_KIND)
# How every runtime_ref of a ClusterTrainingRuntime starts (its namespace part is empty).
CLUSTER_RUNTIME_REF_PREFIX: Final = f"{TRAINER_GROUP}/{CLUSTER_TRAINING_RUNTIME_KIND}//"
# CRD defaults of spec.runtimeRef (applied by the apiserver; we apply them again for nil values).
DEFAULT_RUNTIME_API_GROUP: Final = TRAINER_GROUP
DEFAULT_RUNTIME_KIND: Final = CLUSTER_TRAINING_RUNTIME_KIND

FRAMEWORK_LABEL: Final = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER: Final = "trainer"

_ML_POLICY_ORDER: Final = ("torch", "mpi", "flux", "jax", "xgboost")
_POD_GROUP_POLICY_ORDER: Final = ("coscheduling", "volcano")
# A runtime name is a DNS-1123 subdomain: anything else cannot name a real runtime.
_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# --- runtime references ------------------------------------------------------------------------


def runtime_ref_label(api_group: str | None, kind: str | None, name: str | None, job_namespace: str) -> str:
    """``<apiGroup>/<kind>/<namespace>/<name>`` (upstream format), or ``"unknown"``.

    ``None`` or empty group/kind take the CRD defaults (upstream uses ``ptr.Deref``; an empty string
    is treated like nil here because the apiserver would have defaulted it and nothing else is valid).
    The namespace is the job's for a TrainingRuntime and empty for a ClusterTrainingRuntime. A
    reference that cannot name a Trainer runtime (foreign group/kind, invalid name, or for a
    TrainingRuntime a job namespace that is not a DNS-1123 label) is "unknown", so junk never becomes
    a label value. The result is interned (many jobs share a handful of refs) and memoised.
    """
    memo_key = (api_group, kind, name, job_namespace)
    label = _REF_MEMO.get(memo_key)
    if label is not None:
        return label
    label = _runtime_ref_label(api_group, kind, name, job_namespace)
    if (name is None or len(name) <= _MAX_MEMO_KEY) and len(job_namespace) <= _MAX_MEMO_KEY:
        if len(_REF_MEMO) >= _MEMO_MAX:
            _REF_MEMO.clear()
        _REF_MEMO[memo_key] = label
    return label


_REF_MEMO: dict[tuple[str | None, str | None, str | None, str], str] = {}


def _runtime_ref_label(api_group: str | None, kind: str | None, name: str | None, job_namespace: str) -> str:
    group = api_group or DEFAULT_RUNTIME_API_GROUP
    kind = kind or DEFAULT_RUNTIME_KIND
    if group != TRAINER_GROUP or kind not in RUNTIME_KINDS:
        return UNKNOWN
    if not name or len(name) > 253 or _DNS_SUBDOMAIN.fullmatch(name) is None:
        return UNKNOWN
    if kind == TRAINING_RUNTIME_KIND:
        if not is_dns_label(job_namespace):
            return UNKNOWN  # the namespace is part of the label: it must be a real one
        namespace = job_namespace
    else:
        namespace = ""
    return sys.intern(f"{group}/{kind}/{namespace}/{name}")


# --- runtimes ----------------------------------------------------------------------------------


def _policy_name(policy: object, order: tuple[str, ...]) -> str:
    if policy is None:
        return NONE
    if not isinstance(policy, Mapping):
        return UNKNOWN
    for name in order:
        if policy.get(name) is not None:  # first non-nil policy wins, in upstream's order
            return name
    return UNKNOWN  # set, but none of the policies we know (upstream: "unknown")


def ml_policy(ml_policy_obj: object) -> str:
    """``spec.mlPolicy`` → torch | mpi | flux | jax | xgboost; "none" when absent; else "unknown".

    As upstream, an mlPolicy carrying only ``numNodes`` (no policy source) is "unknown".
    """
    return _policy_name(ml_policy_obj, _ML_POLICY_ORDER)


def pod_group_policy(pod_group_policy_obj: object) -> str:
    """``spec.podGroupPolicy`` → coscheduling | volcano; "none" when absent; else "unknown"."""
    return _policy_name(pod_group_policy_obj, _POD_GROUP_POLICY_ORDER)


def runtime_num_nodes(ml_policy_obj: object) -> tuple[int | None, bool]:
    """(``spec.mlPolicy.numNodes``, malformed). No CRD default: ``None`` when unset."""
    if not isinstance(ml_policy_obj, Mapping):
        return None, ml_policy_obj is not None
    return coerce_count(ml_policy_obj.get("numNodes"))


def is_mpi(ml_policy_obj: object) -> bool:
    """The runtime's mlPolicy has an ``mpi`` source: the MPI plugin acts on it (kubeflow/trainer v2.3.0
    ``plugins/mpi/mpi.go`` EnforceMLPolicy: ``MLPolicySource.MPI != nil``), whatever else is set."""
    return isinstance(ml_policy_obj, Mapping) and ml_policy_obj.get("mpi") is not None


def run_launcher_as_node(ml_policy_obj: object) -> bool:
    """``spec.mlPolicy.mpi.runLauncherAsNode`` (default false): the launcher is a training node too (see
    nodes.node_rule), and a TrainJob's resourcesPerNode also reaches the ``node`` job
    (merges_job_resources)."""
    if not isinstance(ml_policy_obj, Mapping):
        return False
    mpi = ml_policy_obj.get("mpi")
    return isinstance(mpi, Mapping) and mpi.get("runLauncherAsNode") is True


def framework(labels: object) -> str:
    """The ``trainer.kubeflow.org/framework`` label, or "unknown" when missing or empty.

    Every runtime must carry it (kubeflow/trainer docs/operator-guides/runtime.md), so a missing one
    is an anomaly worth seeing; "unknown" rather than "" because Prometheus treats an empty label as
    absent. The value is operator-chosen but runtimes are operator-controlled and Kubernetes caps
    label values at 63 characters; we cap again for objects that bypassed validation.
    """
    if not isinstance(labels, Mapping):
        return UNKNOWN
    value = labels.get(FRAMEWORK_LABEL)
    if not isinstance(value, str) or not value:
        return UNKNOWN
    return sys.intern(value[:MAX_LABEL_VALUE])


def is_trainer_ancestor(labels: object) -> bool:
    """The replicated job's template is labelled ancestor-step ``trainer``: the controller's trainer PodSet
    (``FindPodSetByAncestor(constants.AncestorTrainer)``), the one whose count the ML policy sets."""
    return isinstance(labels, Mapping) and labels.get(ANCESTOR_LABEL) == ANCESTOR_TRAINER


def merges_job_resources(ml_policy_obj: object, job_name: object, trainer_ancestor: bool) -> bool:
    """The controller merges a TrainJob's ``resourcesPerNode`` into this replicated job's ``node``
    container (kubeflow/trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo):
    ``isTrainerAncestor`` (labelled ancestor ``trainer`` and the runtime has an mlPolicy) or
    ``isMPILauncherAsNode`` (MPI with ``runLauncherAsNode``, and the job is named ``node``). Otherwise the
    job's resourcesPerNode never reaches that container: a runtime without an mlPolicy ignores it.
    """
    if ml_policy_obj is None:
        return False
    return trainer_ancestor or (job_name == NODE and run_launcher_as_node(ml_policy_obj))
