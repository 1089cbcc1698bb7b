"""MultiKueue in the simulated cluster: a job Kueue dispatches to a worker cluster runs there (the worker's
Trainer controller and JobSet, played by ``gen_cluster``), and every change of the worker's copy comes back
to this cluster's job whole (``kueue.multikueue_status``); Kueue's admission writes, which start a job here
too (``kueue.admission_patches``).

Split from ``gen_cluster.py``: which cluster runs a job is a concern of its own; the events are the same.
"""

from __future__ import annotations

from kubesim.trainer import controller, kueue
from kubesim.trainer.controller import TrainJob
from kubesim.trainer.gen_cluster import ClusterEvents, training_ready
from kubesim.trainer.gen_population import JobRecord


class MultiKueueEvents(ClusterEvents):
    """remote_step (dispatch, the worker's admission, then the worker's events) and Kueue's admission."""

    def remote_step(self, rec: JobRecord) -> None:
        """MultiKueue runs ``rec`` on a worker cluster: dispatch it there (a copy, suspended until the
        worker's Kueue admits it), then the worker's cluster moves it on like any job; every change of the
        worker's copy is copied back here whole (kueue.multikueue_status)."""
        if rec.remote is None:
            self._dispatch(rec)
        elif rec.remote.suspend:
            self._remote_admitted(rec)
        elif training_ready(rec.runtime, rec.remote):
            roll = self.rng.random()
            if roll < 0.45:
                self.train(rec)
            else:
                self.finish(rec)
        elif self.rng.random() < 0.05:
            self.fail(rec)
        else:
            self.advance(rec)

    def _dispatch(self, rec: JobRecord) -> None:
        """trainjob_multikueue_adapter.go SyncJob, the remote missing: the worker gets a copy of the spec
        with managedBy cleared (so the worker's Trainer runs it) and still suspended (the worker's Kueue
        admits it); its controller then reports Suspended, which the next sync copies here."""
        plan = rec.blueprint
        if plan is None:
            return
        now = self._now(rec)
        rec.remote = TrainJob(
            rec.name,
            float(int(now)),  # the worker's creationTimestamp
            plan.template,
            plan.no_pods,
            suspend=True,
            active_deadline=plan.active_deadline,
        )
        controller.reconcile(rec.remote, now)
        self._write_job(rec)

    def _remote_admitted(self, rec: JobRecord) -> None:
        """The worker's Kueue admits its copy (the Trainer there resumes it; the copy comes back here), and
        the manager's admission check turns Ready, so the local job is started too (jobframework startJob:
        the runtime patch, then unsuspend)."""
        remote = rec.remote
        assert remote is not None
        remote.suspend = False
        controller.reconcile(remote, self._now(rec))
        self._schedule_deadline(rec)
        self._write_job(rec)
        self._kueue_start(rec)

    def _kueue_start(self, rec: JobRecord) -> None:
        """Kueue's admission writes (kueue.admission_patches)."""
        when = controller.rfc3339(self._now(rec))
        flavor = int(self.rng.random() * len(kueue.FLAVORS))
        for patch in kueue.admission_patches(list(rec.runtime.replicated_jobs), when, flavor):
            if self._patch(rec, patch) is None:
                return
