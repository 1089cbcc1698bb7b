"""The pods of the TrainJobs the simulated controllers run: after each change of a job's child Jobs, the pods
their Job controller, the scheduler and the kubelet would have, written through the store (so every watch
sees them, with their resourceVersions, like any other object).

What each child Job's pods look like is ``pods.py`` (names, labels, owner, status) and ``pod_plan.py`` (how
many, which containers and resources); which phase they are in follows the child Job's phase in the JobSet
model (``jobset.py``, ``pods.pod_phase``):

- a Job created but without pods, suspended, or absent has none: the Job controller deletes a suspended
  Job's pods (kubernetes ``pkg/controller/job`` syncJob), and JobSet deletes the Jobs of a finished JobSet
  that are still active and every Job of a restarted attempt (jobset v0.12.0
  ``pkg/controllers/jobset_controller.go`` deleteJobs, foreground propagation: the Jobs' pods go first);
- a starting Job's pods are Pending, not yet bound (waiting for capacity); a ready Job's are bound to a node
  (pods/binding, ``spec.nodeName``) and Running; a finished Job's pods are Succeeded or Failed and stay until
  their TrainJob is deleted, with the reason the kubelet or the runtime gave (``pods.failure_of``);
- a restart makes new pods, labelled with the next ``jobset.sigs.k8s.io/restart-attempt`` (jobset
  labelAndAnnotateObject: ``status.restarts``);
- the TrainJob deleted (gone from the store) takes its pods with it, as the garbage collector does through
  the owner chain (TrainJob -> JobSet -> Job -> Pod; a TrainJob held by a finalizer keeps them until it is
  gone). The Trainer deleting the JobSet at the TrainJob's deadline (kubeflow/trainer v2.3.0
  trainjob_controller.go reconcileDeadline, background propagation) deletes them too.

Jobs run on a worker cluster (MultiKueue) have no pods here. Pods need the real ``Store`` (binding and the
status subresource); ``WorkloadGenerator(pods=True)`` turns them on, off by default: the benchmarks and most
tests size the simulated cluster in TrainJobs alone.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from kubesim.apiserver.core import PODS
from kubesim.apiserver.status import StoreError
from kubesim.trainer import controller, pods
from kubesim.trainer.gen_population import JobRecord
from kubesim.trainer.gen_writes import GENERATOR_WRITES, StoreWrites
from kubesim.trainer.jobset import JobSetRun
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES
from kubesim.trainer.pod_plan import PodTemplate, pod_templates

log = logging.getLogger("kubesim.trainer.generator")

NODE_POOL: Final = 256  # simulated nodes the scheduler binds pods to, in turn
_JOB_UID_NS: Final = uuid.UUID("0b7c4a8e-2f3d-4c1a-9e6b-5d8f7a1c2e30")
_FINISHED: Final = frozenset({"Succeeded", "Failed"})


def node_name(index: int) -> str:
    return f"sim-node-{index % NODE_POOL:03d}"


@dataclass(slots=True)
class ChildPods:
    """The stored pods of one replicated job's child Jobs, as last written."""

    restart: int
    phase: str  # the pods' phase
    names: list[tuple[str, str | None]]  # (pod name, node bound to)
    incarnation: int


@dataclass(slots=True)
class JobPods:
    """One TrainJob's pods: its plan (per replicated job) and what is stored of them."""

    plan: tuple[PodTemplate, ...]
    live: dict[str, ChildPods] = field(default_factory=dict)  # replicated job -> its pods
    incarnations: dict[str, int] = field(default_factory=dict)  # replicated job -> pod sets created


class PodEvents(StoreWrites):
    """_plan_pods at a job's first reconcile, _sync_pods after each change of its child Jobs."""

    run_pods: bool
    _node_seq: int
    _pods: dict[str, JobPods]  # TrainJob uid -> its pods

    def _now(self, rec: JobRecord) -> float:
        """The simulated time of ``rec``'s cluster (``gen_cluster.ClusterEvents``)."""
        raise NotImplementedError

    def _plan_pods(self, rec: JobRecord, stored: dict[str, Any]) -> None:
        """What ``rec``'s JobSet will run, read once from the runtime as it is now (the controller keeps the
        runtime it first built the job from: gen_writes.edit_runtime)."""
        if not self.run_pods or self._direct is None:
            return
        resource = TRAINING_RUNTIMES if rec.runtime.namespace else CLUSTER_TRAINING_RUNTIMES
        try:
            runtime = self._get(resource, rec.runtime.namespace or None, rec.runtime.name)
        except StoreError:
            return
        self._pods[rec.uid] = JobPods(pod_templates(runtime, stored, rec.runtime))

    def _sync_pods(self, rec: JobRecord) -> None:
        """Bring ``rec``'s stored pods in step with its child Jobs now."""
        state = self._pods.get(rec.uid)
        if state is None or rec.job is None:
            return
        run: JobSetRun | None = rec.job.jobset
        when = controller.rfc3339(self._now(rec))
        for template in state.plan:
            wanted = pods.pod_phase(run.phase(template.replicated_job)) if run is not None else None
            restart = run.restarts if run is not None else 0
            live = state.live.get(template.replicated_job)
            if live is not None and live.phase == wanted and live.restart == restart:
                continue
            reason = run.failure_reasons.get(template.replicated_job, "") if run is not None else ""
            if wanted is None or template.pods == 0:
                self._delete_pods(rec, state, template.replicated_job)
            elif live is None or live.restart != restart or live.phase in _FINISHED:
                self._delete_pods(rec, state, template.replicated_job)
                self._create_pods(
                    rec, state, template, restart=restart, phase=wanted, reason=reason, when=when
                )
            else:
                self._move_pods(rec, live, template, phase=wanted, reason=reason, when=when)

    def _write_status(self, rec: JobRecord, status: dict[str, Any], phase: str) -> None:
        super()._write_status(rec, status, phase)
        self._sync_pods(rec)

    def _forget(self, rec: JobRecord) -> None:
        """The TrainJob is gone: the garbage collector deletes its pods."""
        super()._forget(rec)
        state = self._pods.pop(rec.uid, None)
        if state is not None:
            for name in list(state.live):
                self._delete_pods(rec, state, name)

    # -- the writes ------------------------------------------------------------------------------------
    def _create_pods(
        self,
        rec: JobRecord,
        state: JobPods,
        template: PodTemplate,
        *,
        restart: int,
        phase: str,
        reason: str,
        when: str,
    ) -> None:
        incarnation = state.incarnations.get(template.replicated_job, 0)
        state.incarnations[template.replicated_job] = incarnation + 1
        child = ChildPods(restart, "Pending", [], incarnation)
        state.live[template.replicated_job] = child
        for job_index in range(template.replicas):
            job_name = pods.child_job_name(rec.name, template.replicated_job, job_index)
            job_uid = str(uuid.uuid5(_JOB_UID_NS, f"{rec.uid}/{job_name}/{restart}"))
            for index in range(template.pods):
                manifest = pods.pod_manifest(
                    namespace=rec.namespace,
                    jobset=rec.name,
                    replicated_job=template.replicated_job,
                    job_index=job_index,
                    replicas=template.replicas,
                    completion_index=index,
                    restart=restart,
                    job_uid=job_uid,
                    containers=list(template.containers),
                    node=None,
                    phase="Pending",
                    incarnation=incarnation,
                )
                manifest.pop("status")  # the registry writes a new pod's status (Pending)
                try:
                    assert self._direct is not None
                    self._direct.create(
                        PODS,
                        rec.namespace,
                        manifest,
                        copy=False,
                        opts=GENERATOR_WRITES,
                        field_manager="kube-controller-manager",
                    )
                except StoreError as exc:
                    if exc.code >= 500:
                        raise
                    log.debug("store refused pod %s/%s: %s", rec.namespace, manifest["metadata"]["name"], exc)
                    if exc.code != 409:
                        continue
                child.names.append((manifest["metadata"]["name"], None))
        if phase != "Pending":
            self._move_pods(rec, child, template, phase=phase, reason=reason, when=when)

    def _move_pods(
        self, rec: JobRecord, child: ChildPods, template: PodTemplate, *, phase: str, reason: str, when: str
    ) -> None:
        """Bind the pods (once they leave Pending) and report their new phase, as the scheduler and the
        kubelet do."""
        store = self._direct
        assert store is not None
        child.phase = phase
        kept: list[tuple[str, str | None]] = []
        for name, bound in child.names:
            node = bound
            try:
                if node is None and phase != "Pending":
                    node = node_name(self._node_seq)
                    self._node_seq += 1
                    store.bind_pod(rec.namespace, name, {"target": {"kind": "Node", "name": node}})
                failure = pods.failure_of(name, reason) if phase == "Failed" else None
                status = pods.pod_status(phase, list(template.containers), when, failure)
                stored = store.patch(
                    PODS,
                    rec.namespace,
                    name,
                    {"status": status},
                    subresource="status",
                    copy=False,
                    opts=GENERATOR_WRITES,
                    field_manager="kubelet",
                )
            except StoreError as exc:
                if self._pod_write_failed(rec, name, exc):
                    kept.append((name, node))
                continue
            self.truth.pod_written(stored)
            kept.append((name, node))
        child.names = kept

    def _delete_pods(self, rec: JobRecord, state: JobPods, replicated_job: str) -> None:
        child = state.live.pop(replicated_job, None)
        if child is None:
            return
        assert self._direct is not None
        for name, _ in child.names:
            try:
                self._direct.delete(PODS, rec.namespace, name, copy=False, opts=GENERATOR_WRITES)
            except StoreError as exc:
                self._pod_write_failed(rec, name, exc)

    def _pod_write_failed(self, rec: JobRecord, name: str, exc: StoreError) -> bool:
        """True when the pod is still there. 404: someone else deleted it. Another 4xx: refused, logged.
        5xx: the store is broken, raised (as for TrainJob writes)."""
        if exc.code >= 500:
            raise exc
        if exc.code != 404:
            log.debug("store refused a write to pod %s/%s: %s", rec.namespace, name, exc)
            return True
        return False
