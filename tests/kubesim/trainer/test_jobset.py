"""The simulated JobSet controller writes ``replicatedJobsStatus`` as JobSet v0.12.0 does, on the runtimes
the Trainer ships.

Upstream: kubernetes-sigs/jobset v0.12.0 (f22e565a) pkg/controllers/jobset_controller.go reconcile,
calculateReplicatedJobStatuses, replicatedJobStatusesEqual, suspendJobs, resumeJobsIfNecessary;
depends_on.go dependencyReachedStatus; success_policy.go; failure_policy.go executeFailurePolicy;
pkg/constants/constants.go (reasons and messages)."""

from __future__ import annotations

from typing import Any

from kubesim.trainer import jobset
from kubesim.trainer.jobset import JobSetRun, jobset_spec, reconcile, set_phase
from kubesim.trainer.shapes_runtimes import cluster_runtimes

# A runtime's template with a JobSet failure policy: restart twice, fail at once on a Job that failed by its
# pod failure policy (the simulated cluster's sim-torch-restartable has this one).
RESTARTABLE = {
    "failurePolicy": {
        "maxRestarts": 2,
        "rules": [
            {"name": "fail-on-bad-exit", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
        ],
    },
    "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {"containers": []}}}}}],
}


def run_of(runtime: str, *, suspended: bool = False, no_pods: frozenset[str] = frozenset()) -> JobSetRun:
    if runtime == "restartable":
        template: dict[str, Any] = RESTARTABLE
    else:
        template = next(d for d in cluster_runtimes() if d["metadata"]["name"] == runtime)["spec"][
            "template"
        ]["spec"]
    return JobSetRun(jobset_spec(template), "job", suspended=suspended, no_pods=no_pods)


def counts(status: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """name -> the non-zero counts of its entry."""
    return {e["name"]: {k: v for k, v in e.items() if k != "name" and v} for e in status}


def test_initializers_run_first_then_the_trainer_waits_for_capacity() -> None:
    """torchtune: node dependsOn both initializers Complete. Every pass reports the Jobs as they were when
    it began; Jobs created or changed in a pass show in the next one."""
    run = run_of("torchtune-llama3.2-1b")
    first = reconcile(run)  # no Job yet: every replicated job reported, all zeros
    assert counts(first) == {"node": {}, "model-initializer": {}, "dataset-initializer": {}}
    # Sorted by name, descending: replicatedJobStatusesEqual sorts the list it then stores.
    assert [e["name"] for e in first] == ["node", "model-initializer", "dataset-initializer"]
    assert run.phase("node") == jobset.ABSENT  # dependsOn not reached: not created
    assert run.phase("dataset-initializer") == jobset.CREATED
    set_phase(run, "dataset-initializer", jobset.READY)
    set_phase(run, "model-initializer", jobset.STARTING)
    assert counts(reconcile(run)) == {
        "node": {},
        "model-initializer": {"active": 1},
        "dataset-initializer": {"active": 1, "ready": 1},  # downloading: ready
    }
    set_phase(run, "dataset-initializer", jobset.SUCCEEDED)
    set_phase(run, "model-initializer", jobset.SUCCEEDED)
    assert counts(reconcile(run)) == {
        "node": {},
        "model-initializer": {"succeeded": 1},
        "dataset-initializer": {"succeeded": 1},
    }
    assert run.phase("node") == jobset.CREATED  # created in that pass
    set_phase(run, "node", jobset.STARTING)  # pods pending: waiting for capacity
    assert counts(reconcile(run))["node"] == {"active": 1}
    set_phase(run, "node", jobset.READY)
    assert counts(reconcile(run))["node"] == {"active": 1, "ready": 1}
    set_phase(run, "node", jobset.SUCCEEDED)
    reconcile(run)
    assert run.condition == ("Completed", "AllJobsCompleted", "jobset completed successfully")


def test_mpi_launcher_waits_for_ready_workers_and_completes_the_jobset() -> None:
    """deepspeed: launcher dependsOn node Ready; successPolicy All targets the launcher; the finished JobSet
    deletes the workers still running."""
    run = run_of("deepspeed-distributed")
    reconcile(run)
    set_phase(run, "node", jobset.READY)
    reconcile(run)
    assert run.phase("launcher") == jobset.CREATED
    set_phase(run, "launcher", jobset.READY)
    reconcile(run)
    set_phase(run, "launcher", jobset.SUCCEEDED)
    completed = reconcile(run)
    assert run.condition is not None and run.condition[0] == "Completed"
    assert counts(completed) == {"node": {"active": 1, "ready": 1}, "launcher": {"succeeded": 1}}
    assert counts(reconcile(run)) == counts(completed)  # deletes the workers now (foreground)...
    assert counts(reconcile(run)) == {"node": {}, "launcher": {"succeeded": 1}}  # ...gone next pass


def test_a_suspended_jobset_creates_its_first_jobs_suspended() -> None:
    run = run_of("torchtune-llama3.2-1b", suspended=True)
    reconcile(run)
    assert counts(reconcile(run)) == {
        "node": {},
        "model-initializer": {"suspended": 1},
        "dataset-initializer": {"suspended": 1},
    }


def test_suspend_and_resume_after_running() -> None:
    """suspendJobs suspends every unfinished Job; a resumed JobSet resumes those whose dependsOn holds."""
    run = run_of("torch-distributed-with-cache")
    reconcile(run)
    set_phase(run, "dataset-initializer", jobset.SUCCEEDED)
    reconcile(run)
    set_phase(run, "node", jobset.READY)
    reconcile(run)
    run.suspended = True
    assert counts(reconcile(run))["node"] == {"active": 1, "ready": 1}  # still as it was
    assert counts(reconcile(run)) == {"node": {"suspended": 1}, "dataset-initializer": {"succeeded": 1}}
    run.suspended = False
    reconcile(run)
    assert run.phase("node") == jobset.CREATED  # its pods are created again


def test_a_trainer_of_no_pods_is_ready_at_once() -> None:
    """numNodes 0: ready + succeeded pods (0) reach the Job's pod count (0)."""
    run = run_of("torch-distributed", no_pods=frozenset({"node"}))
    reconcile(run)
    assert counts(reconcile(run)) == {"node": {"ready": 1}}


def test_no_failure_policy_fails_with_failed_jobs() -> None:
    run = run_of("torch-distributed")
    reconcile(run)
    set_phase(run, "node", jobset.FAILED)
    status = reconcile(run)
    assert counts(status) == {"node": {"failed": 1}}
    assert run.condition == (
        "Failed",
        "FailedJobs",
        "jobset failed due to one or more job failures (first failed job: job-node-0)",
    )


def test_failure_policy_restarts_then_gives_up() -> None:
    """maxRestarts 2, FailJobSet on PodFailurePolicy; no rule matching: the default action restarts."""
    run = run_of("restartable")
    for restart in range(2):
        reconcile(run)
        set_phase(run, "node", jobset.READY)
        reconcile(run)
        set_phase(run, "node", jobset.FAILED)
        assert counts(reconcile(run)) == {"node": {"failed": 1}}
        assert run.condition is None and run.restarts == restart + 1
        assert counts(reconcile(run)) == {"node": {}}  # the failed Job is left behind, a new one made
    set_phase(run, "node", jobset.FAILED)
    reconcile(run)
    assert run.condition is not None and run.condition[1] == "ReachedMaxRestarts"


def test_a_matching_rule_fails_the_jobset_at_once() -> None:
    run = run_of("restartable")
    reconcile(run)
    set_phase(run, "node", jobset.FAILED, reason=jobset.POD_FAILURE_POLICY)
    reconcile(run)
    assert run.condition is not None and run.condition[1] == "FailJobSetFailurePolicyAction"
    assert run.restarts == 0


def test_pass_due_says_whether_the_controller_has_more_to_write() -> None:
    run = run_of("torch-distributed")
    assert jobset.pass_due(run)  # never reported
    reconcile(run)
    assert not jobset.pass_due(run)  # the node Job exists, without pods: nothing new to say
    set_phase(run, "node", jobset.STARTING)
    assert jobset.pass_due(run)
