"""What users and Kueue do to TrainJobs in the simulated cluster: create them (through the admission
webhooks), admit and preempt them, annotate, delete and clean up; and the Trainer controller's immediate
answer to each (its status writes come from ``controller.py`` through ``gen_cluster``).

Split from ``sim/kubesim/trainer/generator.py``: what a transition writes is independent of when the drivers
decide to make it. Every draw comes from the generator's ``rng`` in a fixed order, so a seed replays the same
writes; the state this layer reads is set up by ``WorkloadGenerator.__init__``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from datetime import datetime
from typing import Any, Final

from kubesim.apiserver.status import StoreError
from kubesim.trainer import controller, jobset, kueue, shapes
from kubesim.trainer.controller import TrainJob
from kubesim.trainer.gen_adversarial import MAX_HUGE_JOBS, bend_shape
from kubesim.trainer.gen_multikueue import MultiKueueEvents
from kubesim.trainer.gen_population import DELETING, ORPHANED, PENDING, REMOTE, SUSPENDED, JobRecord
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.shapes import JobShape
from kubesim.trainer.shapes_runtimes import RuntimeChoice
from kubesim.trainer.truth_rules import parse_time

# One logger for the whole generator, whichever module writes: tests and operators filter on this name.
log = logging.getLogger("kubesim.trainer.generator")

COMPLETE: Final = "Complete"
FAILED: Final = "Failed"
# Share of MultiKueue jobs a worker cluster admits: the others wait in the manager's queue until their user
# deletes them, with no status at all (the manager's Trainer skips them).
DISPATCH_RATIO: Final = 0.7
# The share of Kueue admissions the Trainer controller answers only later (it restarts meanwhile): the job
# stays suspended, Suspended=True with spec.suspend false, until Resumed at its next reconcile.
CONTROLLER_DOWN_RATIO: Final = 0.05
EXPORT_ANNOTATION: Final = "sim.trainer-metrics.io/exported-to"


class JobActions(MultiKueueEvents):
    """create_job, admit, preempt, annotate, delete and remove_finalizer, each on one ``JobRecord``."""

    suspend_ratio: float
    deadline_ratio: float
    unregistered_ratio: float
    finalizer_ratio: float
    _salt: str
    _sequence: int
    _huge_jobs: int

    def create_job(
        self,
        suspended: bool | None = None,
        *,
        allow_huge: bool = True,
        runtime: str | None = None,
        dispatch: bool | None = None,
        controller_late: bool = False,
        **fields: Any,
    ) -> JobRecord | None:
        """A user creates a TrainJob (``suspended``: with a Kueue queue label, which Kueue's webhook turns
        into ``spec.suspend: true``; None = random). ``runtime`` names the runtime to use and ``fields`` set
        ``JobShape`` fields (``deadline``, ``num_nodes``, ``multikueue``, ``ref``, ...) instead of drawing
        them.
        ``dispatch``: whether MultiKueue will run a MultiKueue job on a worker (None = random). The Trainer
        controller's first reconcile follows at once, unless ``controller_late``: its queue has not reached
        the job yet (a burst of creations), and it reconciles only at controller_catches_up(). None when the
        store refused it."""
        namespace = self.namespaces[int(self.rng.random() * len(self.namespaces))]
        choice = (
            self._runtime_named(runtime, namespace)
            if runtime
            else self.catalog.picker(namespace).pick(self.rng)
        )
        name = shapes.job_name(self.rng, self._next_suffix())
        ratio = self.suspend_ratio if suspended is None else float(suspended)
        shape = shapes.random_shape(
            self.rng,
            namespace,
            name,
            choice,
            suspend_ratio=ratio,
            deadline_ratio=self.deadline_ratio,
            unregistered_ratio=self.unregistered_ratio,
        )
        shape.finalizer = self.rng.random() < self.finalizer_ratio
        malformed = self.malformed_ratio > 0 and self.rng.random() < self.malformed_ratio
        if malformed and bend_shape(
            self.rng, shape, huge_allowed=allow_huge and self._huge_jobs < MAX_HUGE_JOBS
        ):
            self._huge_jobs += 1
        if fields:
            shape = dataclasses.replace(shape, **fields)
        if shape.multikueue and shape.queue is None:
            shape.queue = shapes.QUEUE_NAMES[0]
        drawn = self.rng.random() < DISPATCH_RATIO
        dispatch = drawn if dispatch is None else dispatch
        stored = self._create_stored(shape)
        if stored is None:
            return None
        self.truth.job_created(stored, malformed=malformed)
        rec = self._remember(stored, shape)
        self._first_reconcile(rec, stored, shape, dispatch, late=controller_late)
        return rec

    def _runtime_named(self, name: str, namespace: str) -> RuntimeChoice:
        usable = [rt for rt in self.catalog.runtimes if rt.name == name and rt.namespace in ("", namespace)]
        if not usable:
            raise ValueError(f"no runtime {name!r} usable in namespace {namespace!r}")
        return usable[0]

    def _first_reconcile(
        self, rec: JobRecord, stored: dict[str, Any], shape: JobShape, dispatch: bool, *, late: bool = False
    ) -> None:
        """What the Trainer controller does with a new job (controller.py): skip it when another controller
        manages it (MultiKueue runs it elsewhere, or never: ``dispatch``), write nothing for a runtime kind it
        has not registered, only the Suspended condition for a runtime that does not exist (its JobSet cannot
        be built); else build the JobSet and write the Suspended condition of a queued job."""
        spec = stored.get("spec") or {}
        plan = TrainJob(
            rec.name,
            rec.created_at,
            shape.runtime.template,
            self._no_pods(shape.runtime, shape.num_nodes),
            suspend=spec.get("suspend") is True,
            active_deadline=shape.deadline,
        )
        registered = controller.runtime_registered(spec.get("runtimeRef") or {})
        exists = registered and self._runtime_exists(stored, shape.runtime)
        if controller.managed_externally(spec):
            # Kueue builds a job's PodSets from its runtime (kueue trainjob_controller.go getChildJobSet):
            # without one it never admits the job, so MultiKueue never dispatches it.
            rec.dispatch, rec.blueprint = dispatch and exists, plan
            self.population.move(rec, REMOTE if rec.dispatch else ORPHANED)
            return
        if not registered:
            self.population.move(rec, ORPHANED)
            return
        if not exists:
            if plan.suspend:
                conditions = controller.with_suspended_condition([], True, controller.rfc3339(self._now(rec)))
                self._write_status(rec, {"conditions": conditions}, ORPHANED)
            self.population.move(rec, ORPHANED)
            return
        rec.job = plan
        self._plan_pods(rec, stored)
        if late:
            rec.controller_behind = True
            return
        controller.reconcile(plan, self._now(rec))
        if plan.conditions:
            self._write_job(rec)
        self._schedule_deadline(rec)

    @staticmethod
    def _no_pods(runtime: RuntimeChoice, num_nodes: int | None) -> frozenset[str]:
        """The replicated job numNodes scales to 0 pods, if any (shapes_runtimes.runtime_choice): MPI with
        runLauncherAsNode keeps at least one ``node`` (max(numNodes-1, 1))."""
        if num_nodes != 0 or runtime.scaled_job is None or runtime.launcher_as_node:
            return frozenset()
        return frozenset({runtime.scaled_job})

    def _runtime_exists(self, stored: dict[str, Any], runtime: RuntimeChoice) -> bool:
        ref = (stored.get("spec") or {}).get("runtimeRef") or {}
        return ref.get("name") == runtime.name and ref.get("kind") == runtime.kind

    # -- Kueue -----------------------------------------------------------------------------------------
    def queued(self, rec: JobRecord) -> None:
        """A suspended job moves on: the controller answers an admission it was behind on; else its JobSet's
        passes first (the Jobs created, or suspended, and then counted suspended), then Kueue admits it."""
        job = rec.job
        if job is not None and rec.controller_behind and not job.suspend:
            self.controller_catches_up(rec)
        elif job is not None and job.jobset is not None and jobset.pass_due(job.jobset):
            self._settle(rec)
        else:
            self.admit(rec, controller_down=self.rng.random() < CONTROLLER_DOWN_RATIO)

    def admit(self, rec: JobRecord, *, controller_down: bool = False) -> None:
        """Kueue admits a queued job (kueue.admission_patches); the controller answers Suspended=False/Resumed
        and resumes the JobSet, and the deadline counts from then.

        Kueue does not wait for the Trainer controller: it builds the job's PodSets from the runtime itself
        (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/trainjob trainjob_controller.go getChildJobSet), so
        it admits a job the controller is behind on (``rec.controller_behind``: created in a burst), or while
        the controller is down (``controller_down``; queued() draws it, CONTROLLER_DOWN_RATIO). The controller
        answers at controller_catches_up(): Resumed at that time over a Suspended=True condition, and no
        Suspended condition at all for a job it never saw suspended (kubeflow/trainer v2.3.0
        setSuspendedCondition)."""
        job = rec.job
        if job is None or not job.suspend or controller.finished(job.conditions):
            return
        self._kueue_start(rec)
        if rec.slot < 0:
            return
        job.suspend = False
        if controller_down or rec.controller_behind:
            rec.controller_behind = True
            return
        self._settle(rec, jobset_pass=False)
        self._schedule_deadline(rec)

    def controller_catches_up(self, rec: JobRecord) -> None:
        """The Trainer controller reconciles a job it was behind on (its queue reached it, or it restarted):
        the JobSet built or resumed, the Suspended condition as setSuspendedCondition has it now."""
        if not rec.controller_behind:
            return
        rec.controller_behind = False
        self._settle(rec, jobset_pass=False)
        self._schedule_deadline(rec)

    def preempt(self, rec: JobRecord) -> None:
        """Kueue preempts (or evicts) an admitted job (kueue.preemption_patches); the controller answers
        Suspended=True and suspends the JobSet, whose Jobs are suspended on its next pass; the deadline
        stops."""
        if self._expire_if_due(rec):
            return
        job = rec.job
        if job is None or not rec.queued or job.suspend or controller.finished(job.conditions):
            return
        for patch in kueue.preemption_patches(controller.rfc3339(self._now(rec))):
            if self._patch(rec, patch) is None:
                return
        job.suspend = True
        self._settle(rec, jobset_pass=False)
        self._schedule_deadline(rec)

    # -- users -----------------------------------------------------------------------------------------
    def annotate(self, rec: JobRecord) -> None:
        """A tool records where the finished job's results went: a metadata-only write (the status stays)."""
        run_id = "".join(self.rng.choice("0123456789abcdef") for _ in range(12))
        self._patch(rec, {"metadata": {"annotations": {EXPORT_ANNOTATION: f"mlflow://runs/{run_id}"}}})

    def delete(self, rec: JobRecord) -> None:
        """Delete; a job carrying our finalizer stays (deletionTimestamp set) until remove_finalizer()."""
        try:
            stored = self._store_delete(rec)
        except StoreError as exc:
            self._write_failed(rec, exc)
            return
        meta = stored.get("metadata") or {}
        if meta.get("deletionTimestamp") and meta.get("finalizers"):
            self.truth.job_written(stored)
            self.population.set_phase(rec, DELETING)
        else:
            self._forget(rec)

    def remove_finalizer(self, rec: JobRecord) -> None:
        """Our finalizer's work is done: remove it, which lets the store delete the object."""
        if self._patch(rec, {"metadata": {"finalizers": None}}) is None:
            return
        try:
            still = self._get(TRAINJOBS, rec.namespace, rec.name)
        except StoreError as exc:
            if exc.code != 404:
                raise
            self._forget(rec)
            return
        self.truth.job_written(still)  # not deleted after all: keep the truth exact

    def duplicate_terminal(self, rec: JobRecord) -> None:
        """A write to a finished job: the JobSet's clean-up copied once more, else a tool's annotation."""
        if not self.refresh(rec):
            self.annotate(rec)

    # -- helpers of the transitions ------------------------------------------------------------------
    def _next_suffix(self) -> str:
        # The salt comes from the seeded rng: two generators sharing a store rarely pick the same names.
        self._sequence += 1
        return f"{self._salt}{self._sequence:x}"

    def _create_stored(self, shape: JobShape) -> dict[str, Any] | None:
        """store.create, retrying a taken name with a fresh suffix and shrinking an annotation the
        store finds too large (a real apiserver caps annotations at 256 KiB in total)."""
        when = controller.rfc3339(self.clock())
        for _ in range(3):
            try:
                return self._create(TRAINJOBS, shape.namespace, shapes.trainjob(shape, when))
            except StoreError as exc:
                if exc.code == 409:
                    shape.name = shapes.job_name(self.rng, self._next_suffix())
                elif exc.code in (413, 422) and shape.annotations:
                    shape.annotations = {shapes.HUGE_ANNOTATION: "x" * 200_000}
                elif 400 <= exc.code < 500:
                    log.debug("store refused TrainJob %s/%s: %s", shape.namespace, shape.name, exc)
                    return None
                else:
                    raise
        return None

    def _remember(self, stored: dict[str, Any], shape: JobShape) -> JobRecord:
        meta = stored.get("metadata") or {}
        created = _parse_time(meta.get("creationTimestamp"))
        rec = JobRecord(
            namespace=shape.namespace,
            name=shape.name,
            uid=str(meta.get("uid", "")),
            runtime=shape.runtime,
            created_at=created.timestamp() if created else self.clock(),
            phase=SUSPENDED if shape.queue is not None else PENDING,
            queued=shape.queue is not None,
        )
        self.population.add(rec)
        return rec


@functools.lru_cache(maxsize=256)
def _parse_time(value: Any) -> datetime | None:
    # populate() creates thousands of jobs per second: they share a few creationTimestamps.
    return parse_time(value)
