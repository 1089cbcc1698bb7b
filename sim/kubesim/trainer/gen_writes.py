"""Every write the workload generator makes, and the bookkeeping that must follow each one: the object
the store returns goes to the truth, the job's record changes phase, a refused write is told apart from
a broken store.

Split from ``sim/kubesim/trainer/generator.py`` so that one layer holds the rule the ground truth depends on:
the truth only ever sees writes that succeeded, exactly as stored. The state this layer reads is set up by
``WorkloadGenerator.__init__``.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.validation import WriteOptions
from kubesim.apiserver.status import StoreError
from kubesim.apiserver.storage.store import Store
from kubesim.trainer.gen_population import JobRecord, Population
from kubesim.trainer.gen_runtimes import RuntimeCatalog, runtime_documents
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from kubesim.trainer.shapes_runtimes import RuntimeChoice, runtime_choice
from kubesim.trainer.truth import Truth

# One logger for the whole generator, whichever module writes: tests and operators filter on this name.
log = logging.getLogger("kubesim.trainer.generator")

# The generator's writes are validated like a client's (schema, CEL rules, metadata; unknown fields refused),
# so what it stores is what a real cluster would; its namespaces are created when first used.
GENERATOR_WRITES: Final = WriteOptions(validate=True, field_validation="Strict", require_namespace=False)


class StoreLike(Protocol):
    """The subset of ``kubesim.apiserver.storage.store.Store`` the generator uses."""

    @property
    def resource_version(self) -> int: ...

    def create(
        self, resource: ResourceKind, namespace: str | None, obj: dict[str, Any], *, field_manager: str = ...
    ) -> dict[str, Any]: ...

    def get(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]: ...

    def list(self, resource: ResourceKind, namespace: str | None) -> tuple[list[dict[str, Any]], int]: ...

    def patch(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = ...,
        patch_type: str = ...,
        field_manager: str = ...,
    ) -> dict[str, Any]: ...

    def delete(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]: ...


class StoreWrites:
    """Writes to ``store`` that keep ``truth`` and ``population`` in step with what was stored."""

    store: StoreLike
    # The real Store can hand back its stored objects instead of copies: the generator and the truth
    # only read what a write returns (any other StoreLike is used through the protocol).
    _direct: Store | None
    truth: Truth
    population: Population
    catalog: RuntimeCatalog
    namespaces: list[str]

    # -- runtimes ------------------------------------------------------------------------------------
    def load_runtimes(self, extra: int = 0) -> list[str]:
        """Create the real ClusterTrainingRuntimes, two TrainingRuntimes per job namespace and ``extra``
        synthetic runtimes (a quarter cluster-scoped, the rest spread over the namespaces) for benchmarks.
        Runtimes that already exist are adopted. Returns the runtime_ref of every runtime known."""
        for resource, namespace, doc, weight in runtime_documents(self.namespaces, extra):
            self._add_runtime(resource, namespace, doc, weight=weight)
        self.catalog.reset_pickers()
        return [choice.ref_label for choice in self.catalog.runtimes]

    def add_runtime(
        self, doc: dict[str, Any], *, namespace: str | None = None, weight: float = 0.0
    ) -> RuntimeChoice:
        """Create one more runtime (a TrainingRuntime in ``namespace``, else a ClusterTrainingRuntime); with
        ``weight`` 0 new TrainJobs reference it only when they name it."""
        resource = TRAINING_RUNTIMES if namespace else CLUSTER_TRAINING_RUNTIMES
        self._add_runtime(resource, namespace, doc, weight=weight)
        self.catalog.reset_pickers()
        return self.catalog.runtimes[-1]

    def edit_runtime(self, choice: RuntimeChoice, replicated_jobs: list[dict[str, Any]]) -> RuntimeChoice:
        """A user replaces the replicated jobs of a runtime in use: the Trainer's webhook accepts any edit of
        a runtime (kubeflow/trainer v2.3.0 pkg/webhooks/trainingruntime_webhook.go ValidateUpdate). TrainJobs
        created from now on are built from the edited runtime; the ones that exist keep the runtime they were
        first reconciled with (``JobRecord.runtime``): the controller builds a job from its
        ``<trainjob>-runtime-snapshot`` ConfigMap, not from the runtime (pkg/runtime/core/snapshot.go,
        trainingruntime.go NewObjects), and never rebuilds an existing JobSet (plugins/jobset/jobset.go
        Build)."""
        resource = TRAINING_RUNTIMES if choice.namespace else CLUSTER_TRAINING_RUNTIMES
        patch = {"spec": {"template": {"spec": {"replicatedJobs": replicated_jobs}}}}
        stored = self.store.patch(resource, choice.namespace or None, choice.name, patch)
        self.truth.runtime_written(stored)
        edited = runtime_choice(stored, choice.weight)
        self.catalog.adopt(edited)
        self.catalog.reset_pickers()
        return edited

    def delete_runtime(self, choice: RuntimeChoice) -> None:
        """A user deletes a runtime in use: nothing stops it (no finalizer), and its jobs run on, from their
        runtime snapshots (see edit_runtime); no new job references it."""
        resource = TRAINING_RUNTIMES if choice.namespace else CLUSTER_TRAINING_RUNTIMES
        stored = self.store.delete(resource, choice.namespace or None, choice.name)
        self.truth.runtime_deleted(stored)
        self.catalog.remove(choice.key)
        self.catalog.reset_pickers()

    def _add_runtime(
        self, resource: ResourceKind, namespace: str | None, doc: dict[str, Any], *, weight: float
    ) -> None:
        try:
            stored = self._create(resource, namespace, doc)
        except StoreError as exc:
            if exc.code != 409:
                raise
            stored = self._get(resource, namespace, doc["metadata"]["name"])
        self.truth.runtime_written(stored)
        self.catalog.adopt(runtime_choice(stored, weight))

    # -- TrainJob writes that feed the truth ---------------------------------------------------------
    def _write_status(self, rec: JobRecord, status: dict[str, Any], phase: str) -> None:
        try:
            stored = self._store_patch(rec, {"status": status}, "status")
        except StoreError as exc:
            self._write_failed(rec, exc)
            return
        self.truth.job_written(stored)
        self.population.set_phase(rec, phase)

    def _patch(self, rec: JobRecord, patch: dict[str, Any]) -> dict[str, Any] | None:
        try:
            stored = self._store_patch(rec, patch, None)
        except StoreError as exc:
            self._write_failed(rec, exc)
            return None
        self.truth.job_written(stored)
        return stored

    def _write_failed(self, rec: JobRecord, exc: StoreError) -> None:
        """404: someone else deleted the job, so forget it. Another 4xx: the store refused a deliberately
        odd write (a real apiserver rejects duplicate list-map keys), so nothing changed. Else raise."""
        if exc.code == 404:
            self._forget(rec)
        elif exc.code >= 500 or exc.code in (409, 410, 429):
            raise exc
        else:
            log.debug("store refused a write to %s/%s: %s", rec.namespace, rec.name, exc)

    def _forget(self, rec: JobRecord) -> None:
        self.population.discard(rec)
        rec.deadline_token += 1  # its queued deadline check, if any, finds nothing to do
        self.truth.job_deleted(rec.uid, self.store.resource_version)

    # -- the store, directly when it is the real one -------------------------------------------------
    def _create(self, resource: ResourceKind, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.create(resource, namespace, obj, copy=False, opts=GENERATOR_WRITES)
        return self.store.create(resource, namespace, obj)

    def _get(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.get(resource, namespace, name, copy=False)
        return self.store.get(resource, namespace, name)

    def _store_patch(self, rec: JobRecord, patch: dict[str, Any], subresource: str | None) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.patch(
                TRAINJOBS,
                rec.namespace,
                rec.name,
                patch,
                subresource=subresource,
                copy=False,
                opts=GENERATOR_WRITES,
            )
        if subresource is None:
            return self.store.patch(TRAINJOBS, rec.namespace, rec.name, patch)
        return self.store.patch(TRAINJOBS, rec.namespace, rec.name, patch, subresource=subresource)

    def _store_delete(self, rec: JobRecord) -> dict[str, Any]:
        if self._direct is not None:
            return self._direct.delete(TRAINJOBS, rec.namespace, rec.name, copy=False, opts=GENERATOR_WRITES)
        return self.store.delete(TRAINJOBS, rec.namespace, rec.name)
