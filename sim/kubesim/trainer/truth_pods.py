"""The ground truth of ``kubeflow_trainer_trainjob_pod_failures_total``: the failed pods of TrainJobs, by
(namespace, runtime_ref, reason), read from the pods the simulated API server stores.

Written from the issue's and docs/metrics.md's wording, not from ``app/trainer``: a pod belongs to the
TrainJob its ``jobset.sigs.k8s.io/jobset-name`` label names in its own namespace (JobSet labels its pods
with its name; the Trainer names the JobSet after the TrainJob), unless it was created before that TrainJob
(a previous job's of the same name). It failed when its ``status.phase`` is ``Failed``; its reason is its
``status.reason`` (the kubelet's: Evicted, DeadlineExceeded) if that is a CamelCase word of at most 64
characters, else the ``state.terminated.reason`` of its first container that exited non-zero (the
runtime's: OOMKilled, Error) under the same rule, else ``other``. Once per pod uid.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kubesim.trainer.truth_rules import as_dict, parse_time, runtime_ref_of

JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
_REASON: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,63}")

PodFailureKey = tuple[str, str, str]  # (namespace, runtime_ref, reason)


def pod_failure_reason(pod: Mapping[str, Any]) -> str:
    status = as_dict(pod.get("status"))
    reason = status.get("reason")
    if isinstance(reason, str) and _REASON.fullmatch(reason):
        return reason
    statuses = status.get("containerStatuses")
    for container in statuses if isinstance(statuses, list) else ():
        terminated = as_dict(as_dict(as_dict(container).get("state")).get("terminated"))
        code = terminated.get("exitCode")
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            reason = terminated.get("reason")
            return reason if isinstance(reason, str) and _REASON.fullmatch(reason) else "other"
    return "other"


def failed_pod_key(pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> PodFailureKey | None:
    """The series a failed pod of ``job`` (its TrainJob, as stored) counts in; None when the pod has not
    failed or is not that job's."""
    if job is None or as_dict(pod.get("status")).get("phase") != "Failed":
        return None
    pod_created = parse_time(as_dict(pod.get("metadata")).get("creationTimestamp"))
    job_meta = as_dict(job.get("metadata"))
    job_created = parse_time(job_meta.get("creationTimestamp"))
    if pod_created is not None and job_created is not None and pod_created < job_created:
        return None
    return str(job_meta.get("namespace", "")), runtime_ref_of(job)[0], pod_failure_reason(pod)


def trainjob_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the TrainJob a pod's JobSet label names."""
    meta = as_dict(pod.get("metadata"))
    name = as_dict(meta.get("labels")).get(JOBSET_NAME_LABEL)
    if not isinstance(name, str) or not name:
        return None
    return str(meta.get("namespace", "")), name


def pod_failures(
    pods: Iterable[Mapping[str, Any]], trainjobs: Iterable[Mapping[str, Any]]
) -> Counter[PodFailureKey]:
    """The failed pods of the TrainJobs among ``trainjobs`` (as stored), once per pod uid."""
    jobs: dict[tuple[str, str], Mapping[str, Any]] = {}
    for job in trainjobs:
        meta = as_dict(job.get("metadata"))
        jobs[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = job
    out: Counter[PodFailureKey] = Counter()
    seen: set[str] = set()
    for pod in pods:
        uid = str(as_dict(pod.get("metadata")).get("uid", ""))
        owner = trainjob_of(pod)
        key = failed_pod_key(pod, jobs.get(owner) if owner is not None else None)
        if key is not None and uid not in seen:
            seen.add(uid)
            out[key] += 1
    return out
