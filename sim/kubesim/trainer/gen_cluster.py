"""The cluster under the TrainJobs the workload generator creates: child Jobs whose pods wait for capacity,
become ready, finish or fail; the JobSet controller's answer (``jobset.py``) and the Trainer controller's
status writes (``controller.py``); deadlines when they fall due. A job MultiKueue runs on a worker cluster
goes through the same events there (``gen_multikueue.py``).

Each public method is one event of the cluster; it ends in at most one TrainJob status write, which
carries exactly what the two controllers would write after it. Times are the simulated cluster's:
``time_warp`` stretches a job's age since creation, so a short run covers hours (``_now``). Random choices
come from the generator's ``rng`` in a fixed order; deadlines follow ``clock``: with an injected clock a
seed replays the same writes.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable
from typing import Any, Final

from kubesim.trainer import controller, jobset, kueue
from kubesim.trainer.controller import TrainJob
from kubesim.trainer.gen_adversarial import bend_status
from kubesim.trainer.gen_pods import PodEvents
from kubesim.trainer.gen_population import FINISHED, ORPHANED, PENDING, REMOTE, RUNNING, SUSPENDED, JobRecord
from kubesim.trainer.jobset import JobSetRun
from kubesim.trainer.shapes_runtimes import RuntimeChoice
from kubesim.trainer.shapes_status import TrainingRun

log = logging.getLogger("kubesim.trainer.generator")

# Failure reasons JobSet v0.12 does not write, as a newer JobSet release (or another controller writing
# the JobSet's status) could: copied by the Trainer like any JobSet Failed condition. The well-formed ones
# (CamelCase, <= 64 characters) are label values by name, the rest count as "other" (docs/design/product.md
# §3). All match the CRD's condition-reason pattern, so the API server stores them.
FOREIGN_FAILURES: Final = {
    "PodFailurePolicyRuleMatched": "pod failure policy rule matched on container node",
    "InPlaceRestartBudgetExhausted": "jobset failed: in-place restart budget exhausted",
    "evicted_by_descheduler": "pods evicted by the descheduler",
    "Preempted:HigherPriority": "preempted by a higher-priority workload",
    "FailedJobsBecauseTheNodePoolWasScaledDownWhileTheTrainerPodsWereStillRunning": "node pool scaled down",
}
FOREIGN_FAILURE_RATE: Final = 0.08  # share of JobSet failures written with one of them
POD_FAILURE_POLICY_SHARE: Final = (
    0.4  # failed trainer Jobs that exit 42 where a pod failure policy catches it
)
PASS_WEIGHT: Final = 3.0  # the JobSet controller answers within moments; pods take longer


class ClusterEvents(PodEvents):
    """advance, progress, start, train, finish, fail, refresh and the deadline queue."""

    rng: random.Random
    clock: Callable[[], float]
    time_warp: float
    malformed_ratio: float
    _deadlines: list[tuple[float, int, int, JobRecord]]
    _deadline_seq: int

    # -- time ------------------------------------------------------------------------------------------
    def _now(self, rec: JobRecord) -> float:
        """The simulated time of ``rec``'s cluster: its age since creation, stretched by ``time_warp``."""
        elapsed = max(0.0, self.clock() - rec.created_at)
        return min(rec.created_at + elapsed * self.time_warp, controller.LAST_RFC3339_SECOND)

    def _schedule_deadline(self, rec: JobRecord) -> None:
        """Queue the moment ``rec``'s deadline falls due (reconcileDeadline's RequeueAfter), replacing any
        earlier entry: the deadline moves on every resume and stops while suspended."""
        rec.deadline_token += 1
        job = rec.controlled
        due = job.deadline() if job is not None else None
        if due is None:
            return
        wall = rec.created_at + (due - rec.created_at) / max(self.time_warp, 1e-9)
        self._deadline_seq += 1
        heapq.heappush(self._deadlines, (wall, self._deadline_seq, rec.deadline_token, rec))

    def expire_deadlines(self) -> int:
        """The controller's requeued deadline checks that have come due; returns how many jobs failed."""
        failed = 0
        now = self.clock()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, token, rec = heapq.heappop(self._deadlines)
            if token == rec.deadline_token and rec.slot >= 0 and self._expire_if_due(rec, force=True):
                failed += 1
        return failed

    def _expire_if_due(self, rec: JobRecord, *, force: bool = False) -> bool:
        """Fail ``rec`` by its deadline if it has passed (the controller would have, before whatever else
        happens to the job now); True when it did. ``force``: the queue says it is due."""
        job = rec.controlled
        due = job.deadline() if job is not None else None
        if due is None:
            return False
        now = self._now(rec)
        if now < due and not force:
            return False
        controller.reconcile(job, max(now, due))  # type: ignore[arg-type]
        self._write_job(rec)
        return True

    # -- the writes ------------------------------------------------------------------------------------
    def _write_job(self, rec: JobRecord, *, extra: dict[str, Any] | None = None) -> None:
        """Store what ``rec``'s controllers have made of it: the built-in controller's status, or under
        MultiKueue the worker's status copied whole (kueue.multikueue_status)."""
        if rec.remote is not None:
            status = kueue.multikueue_status(rec.remote.status())
        elif rec.job is not None:
            status = rec.job.status()
        else:
            return
        if extra:
            status = {**status, **extra}
        if all(value is None for value in status.values()):
            return  # nothing written yet (the API server refuses an empty status)
        self._write_status(rec, self._maybe_bend_status(status), self._phase_of(rec))

    def _settle(self, rec: JobRecord, *, jobset_pass: bool = True) -> bool:
        """One JobSet pass (``jobset_pass``), then one Trainer reconcile, on ``rec``'s controlled job; writes
        the status when it changed. True when it wrote."""
        job = rec.controlled
        if job is None:
            return False
        if jobset_pass and job.jobset is not None:
            self._jobset_pass(job.jobset)
        if not controller.reconcile(job, self._now(rec)):
            self._sync_pods(rec)  # the child Jobs may have moved without a status change
            return False
        self._write_job(rec)
        return True

    def _jobset_pass(self, run: JobSetRun) -> None:
        """jobset.reconcile; now and then the pass that fails the JobSet writes a reason JobSet v0.12 does
        not (FOREIGN_FAILURES). A condition once set never changes."""
        before = run.condition
        jobset.reconcile(run)
        if before is not None or run.condition is None or run.condition[0] != jobset.FAILED_CONDITION:
            return
        if self.rng.random() >= FOREIGN_FAILURE_RATE:
            return
        reasons = sorted(FOREIGN_FAILURES)
        reason = reasons[int(self.rng.random() * len(reasons))]
        run.condition = (jobset.FAILED_CONDITION, reason, FOREIGN_FAILURES[reason])

    def _phase_of(self, rec: JobRecord) -> str:
        job = rec.controlled
        if job is None:
            return ORPHANED if rec.remote is None and not rec.dispatch else REMOTE
        if controller.finished(job.conditions):
            return FINISHED
        if rec.remote is not None or rec.job is None:
            return REMOTE
        if job.suspend or rec.controller_behind:
            return SUSPENDED  # until the controller answers an admission, its JobSet stays suspended
        return RUNNING if training_ready(rec.runtime, job) else PENDING

    # -- child Jobs move on ----------------------------------------------------------------------------
    def advance(self, rec: JobRecord) -> bool:
        """One event of ``rec``'s JobSet on its way to training: the JobSet controller's next pass (creating
        the Jobs whose dependsOn is reached, suspending or resuming them, cleaning up), a Job's pods created
        (pending until they get capacity), its pods ready, an initializer done. False when nothing can move
        (the trainer runs: finish() ends it)."""
        if self._expire_if_due(rec):
            return True
        job = rec.controlled
        if job is None or job.jobset is None or controller.finished(job.conditions):
            return False
        if not self._child_event(rec.runtime, job.jobset):
            return False
        self._settle(rec)
        return True

    def _child_event(self, runtime: RuntimeChoice, run: JobSetRun) -> bool:
        """Apply one random cluster event to ``run``'s child Jobs (or none when only a JobSet pass is due);
        False when neither can happen."""
        events: list[tuple[float, str, str]] = []  # (weight, replicated job, new phase)
        if jobset.pass_due(run):
            events.append((PASS_WEIGHT, "", ""))
        if not run.finished:
            for name in run.spec.names:
                phase = run.phase(name)
                if phase == jobset.CREATED:
                    # A Job with no pods (a trainer scaled to 0) completes at once; else its pods appear.
                    events.append((1.0, name, jobset.SUCCEEDED if name in run.no_pods else jobset.STARTING))
                elif phase == jobset.STARTING:
                    events.append((1.0, name, jobset.READY))  # the pods got capacity and are ready
                elif phase == jobset.READY and name in runtime.initializers:
                    events.append((1.0, name, jobset.SUCCEEDED))  # the download is done
        if not events:
            return False
        roll = self.rng.random() * sum(weight for weight, _, _ in events)
        chosen = events[-1]
        for event in events:
            roll -= event[0]
            if roll < 0:
                chosen = event
                break
        _, name, phase = chosen
        if name:
            jobset.set_phase(run, name, phase)
        return True

    def progress(self, rec: JobRecord, *, limit: int = 24) -> None:
        """Events until ``rec``'s trainer runs (a training-step Job ready) or it finishes, each written."""
        for _ in range(limit):
            if self._phase_of(rec) not in (PENDING, REMOTE) or not self.advance(rec):
                return

    def start(self, rec: JobRecord, *, warm: bool = False, pending: bool = False) -> None:
        """The next event of ``rec``'s JobSet. For populate(), many events in memory and one write: ``warm``,
        until the trainer runs (and has trained a while); ``pending``, a few events on the way."""
        if not warm and not pending:
            self.advance(rec)
            return
        job = rec.controlled
        if job is None or job.jobset is None:
            return
        if pending:
            limit = int(self.rng.random() * 5)
            self._fast_forward(rec, job, lambda: training_ready(rec.runtime, job), limit=limit)
        else:
            self._fast_forward(rec, job, lambda: training_ready(rec.runtime, job))
        if training_ready(rec.runtime, job):
            job.trainer_status = self._trainer_status(rec, warm=True)
        self._write_job(rec)

    def _fast_forward(self, rec: JobRecord, job: TrainJob, done: Callable[[], bool], limit: int = 24) -> None:
        """Events, JobSet passes and reconciles in memory until ``done()`` (populate(): one write after)."""
        for _ in range(limit):
            if done() or controller.finished(job.conditions) or job.jobset is None:
                return
            if not self._child_event(rec.runtime, job.jobset):
                return
            jobset.reconcile(job.jobset)
            controller.reconcile(job, self._now(rec))

    def settle_suspended(self, rec: JobRecord) -> None:
        """populate(): a queued job's JobSet passes in memory (its Jobs created suspended), one write."""
        job = rec.controlled
        if job is None or job.jobset is None:
            return
        for _ in range(4):
            if not jobset.pass_due(job.jobset):
                break
            jobset.reconcile(job.jobset)
            controller.reconcile(job, self._now(rec))
        self._write_job(rec)

    def conclude(self, rec: JobRecord, outcome: str) -> None:
        """populate(): the whole run in memory to its end (``"Complete"``, or ``"Failed"`` until the JobSet
        gives up: a failure policy may restart it first), one write."""
        job = rec.controlled
        if job is None or job.jobset is None:
            return
        for _ in range(12):
            self._fast_forward(rec, job, lambda: training_ready(rec.runtime, job))
            run = job.jobset
            if run is None or controller.finished(job.conditions):
                break
            ready = [name for name in sorted(rec.runtime.training) if run.phase(name) == jobset.READY]
            targets = sorted(run.spec.success_targets or rec.runtime.training)
            if outcome == "Failed" and ready:
                self._fail_child(rec.runtime, run, ready)
                self._sync_pods(rec)  # the failed pods, before a restart's pass deletes them
            elif all(run.phase(name) == jobset.READY for name in targets):
                for name in targets:
                    jobset.set_phase(run, name, jobset.SUCCEEDED)
            elif not self._child_event(rec.runtime, run):  # the rest of the way there
                break
            self._jobset_pass(run)
            controller.reconcile(job, self._now(rec))
        self._write_job(rec)

    # -- the trainer -----------------------------------------------------------------------------------
    def train(self, rec: JobRecord) -> None:
        """The trainer reports (status.trainerStatus, KEP-2779): progress ticks, loss goes down, the ETA
        follows. A job whose trainer is not running yet moves on instead (advance())."""
        if self._expire_if_due(rec):
            return
        job = rec.controlled
        if job is None or not training_ready(rec.runtime, job) or controller.finished(job.conditions):
            self.advance(rec)
            return
        job.trainer_status = self._trainer_status(rec)
        if rec.remote is not None:
            self._write_job(rec)
        else:
            self._write_status(rec, self._maybe_bend_status({"trainerStatus": job.trainer_status}), RUNNING)

    def _trainer_status(self, rec: JobRecord, warm: bool = False) -> dict[str, Any]:
        now = self._now(rec)
        if rec.training is None:
            rec.training = TrainingRun.begin(self.rng, now, warm=warm)
        else:
            rec.training.advance(self.rng)
        return rec.training.status(now)

    def finish(self, rec: JobRecord, outcome: str | None = None, *, reason: str | None = None) -> None:
        """The training ends: ``"Complete"`` (the training-step Jobs the success policy targets succeed) or
        ``"Failed"`` (one of them fails: the failure policy decides whether the JobSet fails or restarts;
        ``reason``, the failed Job's, is drawn unless given); None draws by the runtime's failure rate. A job
        whose trainer does not run yet gets there first."""
        if self._expire_if_due(rec):
            return
        job = rec.controlled
        if job is None or job.jobset is None or controller.finished(job.conditions):
            return
        if not training_ready(rec.runtime, job):
            self.progress(rec)
            if (
                job.jobset is None
                or controller.finished(job.conditions)
                or not training_ready(rec.runtime, job)
            ):
                return
        if outcome is None:
            outcome = "Failed" if self.rng.random() < rec.runtime.failure_rate else "Complete"
        run = job.jobset
        ready = [name for name in sorted(rec.runtime.training) if run.phase(name) == jobset.READY]
        if outcome == "Complete":
            # The Jobs the success policy waits for (MPI: the launcher, which starts once the ``node``
            # workers are ready) must be running before they can succeed.
            targets = sorted(run.spec.success_targets or rec.runtime.training)
            if any(run.phase(name) != jobset.READY for name in targets):
                self.advance(rec)
                return
            for name in targets:
                jobset.set_phase(run, name, jobset.SUCCEEDED)
        elif ready:
            self._fail_child(rec.runtime, run, ready, reason)
            self._sync_pods(rec)
        else:  # a trainer of 0 pods cannot fail: it completes
            self.advance(rec)
            return
        self._settle(rec)

    def fail(self, rec: JobRecord) -> None:
        """A child Job fails before the trainer runs: an initializer's download, or trainer pods that crash
        until the Job's backoffLimit. The failure policy answers as in finish()."""
        if self._expire_if_due(rec):
            return
        job = rec.controlled
        if job is None or job.jobset is None or controller.finished(job.conditions):
            return
        run = job.jobset
        started = [n for n in run.spec.names if run.phase(n) in (jobset.STARTING, jobset.READY)]
        if not started:
            self.advance(rec)
            return
        self._fail_child(rec.runtime, run, started)
        self._sync_pods(rec)
        self._settle(rec)

    def _fail_child(
        self, runtime: RuntimeChoice, run: JobSetRun, candidates: list[str], reason: str | None = None
    ) -> None:
        """One of ``candidates`` fails: its pods crashed past the Job's backoffLimit, or (a trainer Job with a
        pod failure policy) one exited with the code the policy fails the Job on; ``reason`` says which."""
        name = candidates[int(self.rng.random() * len(candidates))]
        if reason is None:
            reason = jobset.BACKOFF_LIMIT_EXCEEDED
            if (
                runtime.pod_failure_policy
                and name in runtime.training
                and self.rng.random() < POD_FAILURE_POLICY_SHARE
            ):
                reason = jobset.POD_FAILURE_POLICY
        jobset.set_phase(run, name, jobset.FAILED, reason=reason)

    def refresh(self, rec: JobRecord) -> bool:
        """After the end: the JobSet deletes the Jobs still running (MPI's ``node`` workers, the rest of a
        failed JobSet) and the Trainer copies the status once more. False when there is nothing left."""
        job = rec.controlled
        if job is None or job.jobset is None or not jobset.pass_due(job.jobset):
            return False
        return self._settle(rec)

    def _maybe_bend_status(self, status: dict[str, Any]) -> dict[str, Any]:
        """Sometimes make a status write odd without changing what it means for the metrics."""
        if self.malformed_ratio <= 0 or self.rng.random() >= self.malformed_ratio:
            return status
        return bend_status(self.rng, status, lambda: controller.rfc3339(self.clock()))


def training_ready(runtime: RuntimeChoice, job: TrainJob) -> bool:
    """The job's trainer runs: a child Job of its training step is ready, as its last status says."""
    return any(
        entry.get("name") in runtime.training and (entry.get("ready") or 0) > 0
        for entry in job.jobs_status or ()
    )
