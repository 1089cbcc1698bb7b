"""Ground truth for the workload generator: what the exporter's Trainer metrics should say.

Deliberately written from the design documents (docs/design/product.md §3,
docs/design/trainer-domain.md §1-§3), NOT by importing ``app/trainer`` (nor the generator's controller
model): a test that compares the service against this module then checks two independent readings of the
same rules instead of the service's code against itself.

The generator feeds every object the store returns from its writes into ``Truth``; the truth then derives
everything from those stored objects (and the runtimes it was shown), so what it counts is exactly what a
watcher of the store can see.

The rules live in ``truth_rules`` (states, refs, times) and ``truth_resources`` (nodes, accelerators,
quantities, training steps), the records in ``truth_records``; this module keeps the running tally.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from kubesim.trainer.truth_pods import PodFailureKey, failed_pod_key, trainjob_of
from kubesim.trainer.truth_records import (
    AdmittedJob,
    CreatedKey,
    FinishedJob,
    FinishedKey,
    JobRequest,
    JobsKey,
    StartedJob,
    TruthSnapshot,
)
from kubesim.trainer.truth_resources import (
    RuntimeFacts,
    requested_accelerators,
    requested_nodes,
    runtime_facts,
)
from kubesim.trainer.truth_rules import (
    FALLBACK_TRAINING,
    RuntimeKey,
    as_dict,
    classify,
    lifetime_of,
    parse_time,
    resumed_condition,
    runtime_key_of,
    runtime_ref_of,
    since_creation,
)


class Truth:
    """Counts derived from the objects the generator wrote; independent of the service's rules code."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the writer's wall clock (epoch seconds), read at each write to time the first running
        state (nothing in a TrainJob records when its pods became ready)."""
        self.clock = clock
        self.started: dict[str, StartedJob] = {}
        self.admitted: dict[str, AdmittedJob] = {}
        self.runtimes: dict[RuntimeKey, RuntimeFacts] = {}
        self.created: Counter[CreatedKey] = Counter()
        self.finished: Counter[FinishedKey] = Counter()
        self.jobs: Counter[JobsKey] = Counter()
        self.requests: dict[str, JobRequest] = {}
        self.accelerator_observations: Counter[str] = Counter()  # by runtime_ref; never pruned
        self.terminal: dict[str, FinishedJob] = {}
        self._current: dict[str, JobsKey] = {}  # uid -> gauge key of the job as last written
        self._refs: dict[str, str] = {}  # uid -> runtime_ref of a live job
        # uid -> the training step of the runtime a job was created with (its runtime snapshot), once known
        self.training: dict[str, frozenset[str]] = {}
        self._queued: set[str] = set()  # jobs suspended since their creation: waiting for admission
        # kubeflow_trainer_trainjob_pod_failures_total (truth_pods.py): the failed pods of live TrainJobs
        self.pod_failures: Counter[PodFailureKey] = Counter()
        self._failed_pods: set[str] = set()  # pod uids counted
        self._by_name: dict[tuple[str, str], tuple[str, Mapping[str, Any]]] = {}  # -> (uid, job as stored)
        self.resource_version = 0

    # -- runtimes --------------------------------------------------------------------------------------
    def runtime_written(self, runtime: Mapping[str, Any]) -> None:
        self.runtimes[runtime_key_of(runtime)] = runtime_facts(runtime)

    def runtime_deleted(self, runtime: Mapping[str, Any]) -> None:
        self.runtimes.pop(runtime_key_of(runtime), None)

    # -- TrainJobs -------------------------------------------------------------------------------------
    def job_created(self, job: Mapping[str, Any], *, malformed: bool = False) -> None:
        """A TrainJob create returned ``job``: count it created and note what it requests."""
        meta = as_dict(job.get("metadata"))
        uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
        ref, key = runtime_ref_of(job)
        runtime = self.runtimes.get(key) if key is not None else None
        nodes = requested_nodes(job, runtime)
        self.created[(namespace, ref)] += 1
        accelerators = requested_accelerators(job, runtime, nodes)
        self.accelerator_observations[ref] += len(accelerators)
        self.requests[uid] = JobRequest(
            namespace, str(meta.get("name", "")), ref, nodes, accelerators, malformed
        )
        self._refs[uid] = ref
        if runtime is not None:
            self.training[uid] = runtime.training
        if self.classify(job)[0] == "suspended":
            self._queued.add(uid)
        self.job_written(job)

    def job_written(self, job: Mapping[str, Any]) -> None:
        """Any write returned ``job`` (create, spec patch, status write, delete that left it in place)."""
        meta = as_dict(job.get("metadata"))
        uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
        self._note_rv(meta)
        ref = self._refs.get(uid)
        if ref is None:  # not created through us: still count its state
            ref = self._refs[uid] = runtime_ref_of(job)[0]
        state, terminal = self.classify(job)
        if terminal is None:
            self._first_running_or_admitted(job, uid, namespace, ref, state)
        if terminal is not None and uid not in self.terminal:
            result, reason, condition = terminal
            self.finished[(result, reason, ref)] += 1
            self.terminal[uid] = FinishedJob(
                namespace,
                str(meta.get("name", "")),
                result,
                reason,
                ref,
                lifetime_of(job, condition),
                self.resource_version,
            )
        self._move(uid, (namespace, ref, state))
        self._by_name[(namespace, str(meta.get("name", "")))] = (uid, job)

    def _first_running_or_admitted(
        self, job: Mapping[str, Any], uid: str, namespace: str, ref: str, state: str
    ) -> None:
        """docs/design/product.md §3 and docs/metrics.md: a job created suspended is admitted when it first
        leaves ``suspended`` (the controller's Resumed condition, or, without one, spec.suspend going off)
        before it ever ran, timed by the Resumed condition's lastTransitionTime when the job has one, else by
        the writer's clock (no object records it); a job runs when a training-step Job is ready. Each at most
        once per job."""
        name = str(as_dict(job.get("metadata")).get("name", ""))
        if uid in self._queued and state != "suspended":
            self._queued.discard(uid)
            if uid not in self.admitted and uid not in self.started:
                resumed = resumed_condition(job)
                by_clock = resumed is None
                at = self.clock() if resumed is None else parse_time(resumed.get("lastTransitionTime"))
                wait = since_creation(job, at)
                if wait is not None:
                    self.admitted[uid] = AdmittedJob(
                        namespace, name, ref, wait, self.resource_version, by_clock=by_clock
                    )
        if state == "running" and uid not in self.started:
            startup = since_creation(job, self.clock())
            if startup is not None:
                self.started[uid] = StartedJob(namespace, name, ref, startup, self.resource_version)

    def job_deleted(self, uid: str, resource_version: int = 0) -> None:
        """The TrainJob ``uid`` is gone from the store."""
        self.resource_version = max(self.resource_version, resource_version)
        self._refs.pop(uid, None)
        self.training.pop(uid, None)
        self._queued.discard(uid)
        self._move(uid, None)
        for key, (known, _) in list(self._by_name.items()):
            if known == uid:
                del self._by_name[key]

    def pod_written(self, pod: Mapping[str, Any]) -> None:
        """Any write returned ``pod``: a pod of a live TrainJob first written Failed counts one failure
        (truth_pods.py), once per pod uid."""
        meta = as_dict(pod.get("metadata"))
        self._note_rv(meta)
        uid = str(meta.get("uid", ""))
        if uid in self._failed_pods:
            return
        owner = trainjob_of(pod)
        entry = self._by_name.get(owner) if owner is not None else None
        key = failed_pod_key(pod, entry[1] if entry is not None else None)
        if key is not None:
            self._failed_pods.add(uid)
            self.pod_failures[key] += 1

    def _move(self, uid: str, key: JobsKey | None) -> None:
        old = self._current.pop(uid, None)
        if old is not None:
            self.jobs[old] -= 1
            if not self.jobs[old]:
                del self.jobs[old]
        if key is not None:
            self._current[uid] = key
            self.jobs[key] += 1

    def _note_rv(self, meta: Mapping[str, Any]) -> None:
        try:
            rv = int(meta.get("resourceVersion") or 0)
        except (TypeError, ValueError):
            return
        self.resource_version = max(self.resource_version, rv)

    def training_of(self, job: Mapping[str, Any]) -> frozenset[str]:
        """The training step of ``job``: that of its runtime as it was when the job was created (the
        controller's runtime snapshot: an edit or a deletion of the runtime later does not change it), or,
        for a job created before the truth was shown its runtime, its runtime's as soon as it is shown;
        else the controller's naming."""
        uid = str(as_dict(job.get("metadata")).get("uid", ""))
        pinned = self.training.get(uid)
        if pinned is not None:
            return pinned
        key = runtime_ref_of(job)[1]
        facts = self.runtimes.get(key) if key is not None else None
        if facts is None:
            return FALLBACK_TRAINING
        if uid in self._refs:
            self.training[uid] = facts.training
        return facts.training

    def classify(self, job: Mapping[str, Any]) -> tuple[str, tuple[str, str, dict[str, Any]] | None]:
        """truth_rules.classify with ``job``'s training step."""
        return classify(job, self.training_of(job))

    def state_of(self, uid: str) -> str | None:
        key = self._current.get(uid)
        return key[2] if key else None

    def snapshot(self, resource_version: int | None = None) -> TruthSnapshot:
        return TruthSnapshot(
            resource_version=self.resource_version if resource_version is None else resource_version,
            created=MappingProxyType(dict(self.created)),
            finished=MappingProxyType(dict(self.finished)),
            jobs=MappingProxyType(dict(self.jobs)),
            requests=MappingProxyType(dict(self.requests)),
            terminal=MappingProxyType(dict(self.terminal)),
            started=MappingProxyType(dict(self.started)),
            admitted=MappingProxyType(dict(self.admitted)),
            accelerator_observations=MappingProxyType(dict(self.accelerator_observations)),
            pod_failures=MappingProxyType(dict(self.pod_failures)),
        )


def recount_jobs(
    jobs: Iterable[Mapping[str, Any]],
    runtimes: Mapping[RuntimeKey, RuntimeFacts] | None = None,
    training_by_uid: Mapping[str, frozenset[str]] | None = None,
) -> dict[JobsKey, int]:
    """The trainjobs gauge recomputed from scratch over stored TrainJobs (for consistency checks), with
    ``training_by_uid`` (the truth's pinned steps), else ``runtimes`` (the truth's), deciding each job's
    training step."""
    counts: Counter[JobsKey] = Counter()
    for job in jobs:
        meta = as_dict(job.get("metadata"))
        namespace = str(meta.get("namespace", ""))
        ref, key = runtime_ref_of(job)
        facts = (runtimes or {}).get(key) if key is not None else None
        training = (training_by_uid or {}).get(str(meta.get("uid", "")))
        if training is None:
            training = facts.training if facts is not None else FALLBACK_TRAINING
        counts[(namespace, ref, classify(job, training)[0])] += 1
    return dict(counts)
