"""JobSet v0.12.0 as the simulated cluster runs it: the child Jobs of one TrainJob's JobSet, what the JobSet
controller writes to ``status.replicatedJobsStatus``, and how its dependsOn, success and failure policies move
them on.

Each function follows kubernetes-sigs/jobset v0.12.0 (commit f22e565a) ``pkg/controllers/``, cited where it
is used. The Trainer never writes child Jobs itself: it copies this status into the TrainJob
(``controller.py``). What makes a child Job's pods get capacity, become ready, finish or fail is the cluster,
decided by the workload generator (``gen_cluster.py``); this module only says what JobSet makes of it.

A child Job is in one of these phases (``calculateReplicatedJobStatuses`` reads them from the Job's status):

- ABSENT: not created (its dependsOn is not reached yet), deleted, or left behind by a restart;
- CREATED: created, no pod yet (``Job.status.active`` 0): counted in no column;
- SUSPENDED: created while, or suspended because, the JobSet is suspended: ``suspended``;
- STARTING: pods exist but are not all ready (pending for capacity, pulling images): ``active``;
- READY: every pod ready: ``active`` and ``ready``;
- SUCCEEDED / FAILED: the Job finished: ``succeeded`` / ``failed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

ABSENT: Final = "absent"
CREATED: Final = "created"
SUSPENDED: Final = "suspended"
STARTING: Final = "starting"
READY: Final = "ready"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
FINISHED_PHASES: Final = frozenset({SUCCEEDED, FAILED})
# Not finished: what getChildJobs puts in ``ownedJobs.active`` (JobFinished reports no condition).
ACTIVE_PHASES: Final = frozenset({CREATED, SUSPENDED, STARTING, READY})

# JobSet condition types and the reasons and messages it writes (jobset v0.12.0 pkg/constants/constants.go).
COMPLETED: Final = "Completed"
FAILED_CONDITION: Final = "Failed"
ALL_JOBS_COMPLETED: Final = "AllJobsCompleted"
ALL_JOBS_COMPLETED_MESSAGE: Final = "jobset completed successfully"
FAILED_JOBS: Final = "FailedJobs"
FAILED_JOBS_MESSAGE: Final = "jobset failed due to one or more job failures"
REACHED_MAX_RESTARTS: Final = "ReachedMaxRestarts"
REACHED_MAX_RESTARTS_MESSAGE: Final = "jobset failed due to reaching max number of restarts"
FAIL_JOBSET_ACTION: Final = "FailJobSetFailurePolicyAction"
FAIL_JOBSET_ACTION_MESSAGE: Final = "applying FailJobSet failure policy action"

# Why a child Job failed (its Failed condition's reason, batch/v1 JobReasonBackoffLimitExceeded,
# JobReasonPodFailurePolicy): what a JobSet failure policy rule's onJobFailureReasons matches.
BACKOFF_LIMIT_EXCEEDED: Final = "BackoffLimitExceeded"
POD_FAILURE_POLICY: Final = "PodFailurePolicy"


@dataclass(frozen=True, slots=True)
class ReplicatedJob:
    """One ``spec.replicatedJobs[]`` entry, as JobSet reads it."""

    name: str
    replicas: int = 1  # child Jobs (the built-in runtimes leave it at its default, 1)
    depends_on: tuple[tuple[str, str], ...] = ()  # (replicated job, "Complete" | "Ready")


@dataclass(frozen=True, slots=True)
class JobSetSpec:
    """The parts of a JobSet spec that decide its status: the Trainer builds it from the runtime's template
    (kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go Build)."""

    replicated_jobs: tuple[ReplicatedJob, ...]
    success_any: bool = False  # successPolicy.operator Any (default All)
    success_targets: frozenset[str] = frozenset()  # successPolicy.targetReplicatedJobs; empty = every one
    has_failure_policy: bool = False
    max_restarts: int = 0  # failurePolicy.maxRestarts
    fail_jobset_on: frozenset[str] = frozenset()  # job failure reasons of FailJobSet rules

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(job.name for job in self.replicated_jobs)


def jobset_spec(template_spec: Mapping[str, Any]) -> JobSetSpec:
    """A runtime's ``spec.template.spec`` (a JobSetSpec) read as JobSet reads it."""
    jobs = []
    for job in _list(template_spec.get("replicatedJobs")):
        if not isinstance(job, dict) or not isinstance(job.get("name"), str):
            continue
        depends = tuple(
            (str(dep.get("name")), str(dep.get("status")))
            for dep in _list(job.get("dependsOn"))
            if isinstance(dep, dict)
        )
        replicas = job.get("replicas")
        jobs.append(ReplicatedJob(job["name"], replicas if isinstance(replicas, int) else 1, depends))
    success = _dict(template_spec.get("successPolicy"))
    failure = template_spec.get("failurePolicy")
    fail_on: set[str] = set()
    for rule in _list(_dict(failure).get("rules")):
        if isinstance(rule, dict) and rule.get("action") == "FailJobSet":
            fail_on.update(str(r) for r in _list(rule.get("onJobFailureReasons")))
    max_restarts = _dict(failure).get("maxRestarts")
    return JobSetSpec(
        tuple(jobs),
        success_any=success.get("operator") == "Any",
        success_targets=frozenset(str(t) for t in _list(success.get("targetReplicatedJobs"))),
        has_failure_policy=isinstance(failure, dict),
        max_restarts=max_restarts if isinstance(max_restarts, int) else 0,
        fail_jobset_on=frozenset(fail_on),
    )


@dataclass(slots=True)
class JobSetRun:
    """One JobSet and its child Jobs (one per replica, moving together: the built-in runtimes have one)."""

    spec: JobSetSpec
    name: str  # the TrainJob's name: the JobSet's, and the prefix of its child Jobs' names
    suspended: bool
    # Replicated jobs whose child Job has no pod to wait for (a trainer scaled to 0 nodes): ready at once.
    no_pods: frozenset[str] = frozenset()
    phases: dict[str, str] = field(default_factory=dict)
    failure_reasons: dict[str, str] = field(default_factory=dict)  # replicated job -> its Job's reason
    restarts: int = 0  # status.restartsCountTowardsMax
    condition: tuple[str, str, str] | None = None  # (Completed | Failed, reason, message) once finished
    # status.replicatedJobsStatus as last written by the controller (empty until its first pass).
    status: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for job in self.spec.replicated_jobs:
            self.phases.setdefault(job.name, ABSENT)

    @property
    def finished(self) -> bool:
        return self.condition is not None

    def phase(self, name: str) -> str:
        return self.phases.get(name, ABSENT)


def replicated_jobs_status(run: JobSetRun) -> list[dict[str, Any]]:
    """``status.replicatedJobsStatus`` as the JobSet controller computes it now.

    jobset v0.12.0 pkg/controllers/jobset_controller.go calculateReplicatedJobStatuses: one entry per
    replicated job of the spec (zeros for the ones without Jobs), over the Jobs of the current restart
    attempt;
    an unfinished Job counts ``ready`` when its ready plus succeeded pods reach min(parallelism, completions)
    (so a Job of 0 pods is ready as soon as it exists), ``active`` when ``Job.status.active`` > 0 and
    ``suspended`` when ``spec.suspend``; finished Jobs count ``succeeded`` or ``failed``. The list is kept
    sorted by name, descending: replicatedJobStatusesEqual sorts both lists in place before comparing, and
    the sorted one is what updateReplicatedJobsStatuses stores.
    """
    out = []
    for job in sorted(run.spec.replicated_jobs, key=lambda j: j.name, reverse=True):
        phase = run.phase(job.name)
        zero = job.name in run.no_pods
        counts = {"ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        if phase == READY or (zero and phase in (CREATED, SUSPENDED)):
            counts["ready"] = job.replicas
        if phase in (STARTING, READY):
            counts["active"] = job.replicas
        if phase == SUSPENDED:
            counts["suspended"] = job.replicas
        if phase == SUCCEEDED:
            counts["succeeded"] = job.replicas
        if phase == FAILED:
            counts["failed"] = job.replicas
        out.append({"name": job.name, **counts})
    return out


def reconcile(run: JobSetRun) -> list[dict[str, Any]]:
    """One pass of the JobSet controller; returns the ``replicatedJobsStatus`` it writes.

    jobset v0.12.0 pkg/controllers/jobset_controller.go reconcile, in its order: the status is computed
    first, from the child Jobs as they are (so Jobs created, suspended or deleted in this pass show in the
    next one); then a finished JobSet deletes its unfinished Jobs (foreground deletion: gone by the next
    pass); else a failed Job runs the failure policy, a succeeded one the success policy; else the Jobs
    whose dependsOn is reached are created (reconcileReplicatedJobs, depends_on.go dependencyReachedStatus)
    and, with the JobSet suspended, its unfinished Jobs are suspended (suspendJobs) or, resumed, resumed
    (resumeJobsIfNecessary, which checks dependsOn the same way).
    """
    status = run.status = replicated_jobs_status(run)
    if run.finished:
        for name, phase in run.phases.items():
            if phase in ACTIVE_PHASES:
                run.phases[name] = ABSENT
        return status
    failed = [name for name in run.spec.names if run.phase(name) == FAILED]
    if failed:
        _failure_policy(run, failed[0])
        return status
    if _success_policy_met(run):
        run.condition = (COMPLETED, ALL_JOBS_COMPLETED, ALL_JOBS_COMPLETED_MESSAGE)
        return status
    by_name = {entry["name"]: entry for entry in status}
    reached = {job.name for job in run.spec.replicated_jobs if _dependencies_reached(run.spec, job, by_name)}
    for name in run.spec.names:
        phase = run.phase(name)
        if phase == ABSENT and name in reached:
            # constructJob: a Job is created suspended when its JobSet is.
            run.phases[name] = SUSPENDED if run.suspended else CREATED
        elif run.suspended and phase in (CREATED, STARTING, READY):
            run.phases[name] = SUSPENDED  # suspendJobs: every unfinished Job, dependsOn or not
        elif not run.suspended and phase == SUSPENDED and name in reached:
            run.phases[name] = CREATED  # resumeJob: the Job controller creates its pods again
    return status


def _dependencies_reached(
    spec: JobSetSpec, job: ReplicatedJob, status: Mapping[str, Mapping[str, int]]
) -> bool:
    """jobset v0.12.0 pkg/controllers/depends_on.go dependencyReachedStatus: ``Complete`` needs every child
    Job of the dependency succeeded, ``Ready`` every one ready, failed or succeeded."""
    replicas = {j.name: j.replicas for j in spec.replicated_jobs}
    for name, wanted in job.depends_on:
        counts = status.get(name)
        if counts is None:
            return False
        if wanted == "Complete" and counts["succeeded"] != replicas.get(name, 1):
            return False
        if wanted == "Ready" and counts["ready"] + counts["failed"] + counts["succeeded"] != replicas.get(
            name, 1
        ):
            return False
    return True


def _success_policy_met(run: JobSetRun) -> bool:
    """jobset v0.12.0 pkg/controllers/success_policy.go: ``All`` needs every Job of the target replicated
    jobs (every replicated job when none is named) succeeded, ``Any`` one of them."""
    targets = [
        j
        for j in run.spec.replicated_jobs
        if not run.spec.success_targets or j.name in run.spec.success_targets
    ]
    done = [j for j in targets if run.phase(j.name) == SUCCEEDED]
    return bool(done) if run.spec.success_any else bool(targets) and len(done) == len(targets)


def _failure_policy(run: JobSetRun, first_failed: str) -> None:
    """jobset v0.12.0 pkg/controllers/failure_policy.go executeFailurePolicy.

    No failurePolicy: the JobSet fails, ``FailedJobs``. With one: a rule whose onJobFailureReasons matches
    the failed Job's reason applies its action (``FailJobSet``: fails, ``FailJobSetFailurePolicyAction``);
    no matching rule: the default action, RestartJobSet, which fails the JobSet with ``ReachedMaxRestarts``
    once restartsCountTowardsMax has reached maxRestarts and otherwise restarts it: every Job of this
    attempt is left behind (deleted, not counted again) and the next pass creates the first ones anew.
    Messages name the first failed Job (messageWithFirstFailedJob; placement.GenJobName: <jobset>-<rjob>-0).
    """
    job_name = f"{run.name}-{first_failed}-0"
    if not run.spec.has_failure_policy:
        run.condition = (FAILED_CONDITION, FAILED_JOBS, _first_failed(FAILED_JOBS_MESSAGE, job_name))
    elif run.failure_reasons.get(first_failed) in run.spec.fail_jobset_on:
        run.condition = (
            FAILED_CONDITION,
            FAIL_JOBSET_ACTION,
            _first_failed(FAIL_JOBSET_ACTION_MESSAGE, job_name),
        )
    elif run.restarts >= run.spec.max_restarts:
        run.condition = (
            FAILED_CONDITION,
            REACHED_MAX_RESTARTS,
            _first_failed(REACHED_MAX_RESTARTS_MESSAGE, job_name),
        )
    else:
        run.restarts += 1
        for name in run.phases:
            run.phases[name] = ABSENT
        run.failure_reasons.clear()


def _first_failed(message: str, job: str) -> str:
    return f"{message} (first failed job: {job})"


def set_phase(run: JobSetRun, name: str, phase: str, *, reason: str = BACKOFF_LIMIT_EXCEEDED) -> None:
    """A child Job of ``name`` moved on in the cluster (``reason``: why it failed, when ``phase`` is
    FAILED)."""
    run.phases[name] = phase
    if phase == FAILED:
        run.failure_reasons[name] = reason


def unfinished(run: JobSetRun, names: Sequence[str] | None = None) -> list[str]:
    """The replicated jobs (of ``names``, default all) whose child Job exists and has not finished."""
    return [n for n in (names if names is not None else run.spec.names) if run.phase(n) in ACTIVE_PHASES]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def pass_due(run: JobSetRun) -> bool:
    """The JobSet controller has more to write: its next pass would change the status or the child Jobs
    (it reconciles again on every change of its Jobs, within moments)."""
    trial = JobSetRun(
        run.spec,
        run.name,
        run.suspended,
        run.no_pods,
        dict(run.phases),
        dict(run.failure_reasons),
        run.restarts,
        run.condition,
        run.status,
    )
    status = reconcile(trial)
    return (
        status != run.status
        or trial.phases != run.phases
        or trial.condition != run.condition
        or trial.restarts != run.restarts
    )


def status_of(phases: Mapping[str, str]) -> list[dict[str, Any]]:
    """``replicatedJobsStatus`` of a JobSet with one child Job per replicated job, in the given phases (fixed
    shapes for benchmarks and tests)."""
    spec = JobSetSpec(tuple(ReplicatedJob(name) for name in phases))
    return replicated_jobs_status(JobSetRun(spec, "", suspended=False, phases=dict(phases)))
