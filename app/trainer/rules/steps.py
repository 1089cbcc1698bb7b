"""The training step of a TrainJob: which of its replicated jobs train, and whether one of them is ready.

There is no Running condition: a TrainJob runs when a child Job *of the training step* is ready
(docs/design/trainer-domain.md §1, ``status.jobsStatus``). Initializer jobs run first and are ready while
they download; when they finish their ``ready`` drops to 0 (kubernetes-sigs/jobset v0.12.0
``pkg/controllers/jobset_controller.go`` calculateReplicatedJobStatuses counts ``ready`` over *active*
Jobs only) and the trainer's pods may still wait for capacity: the whole window is pending.

A job's training step is resolved once, from its runtime as it was when the job was first resolved
(``step_id``, kept in the job's projection): the controller builds every TrainJob from the copy of its runtime
it took at the job's first reconcile, not from the live runtime (kubeflow/trainer v2.3.0
``pkg/runtime/core/snapshot.go`` and ``trainingruntime.go`` NewObjects: the ``<trainjob>-runtime-snapshot``
ConfigMap is read before the runtime), a runtime in use may be edited or deleted
(``trainingruntime_webhook.go`` ValidateUpdate accepts any edit; no finalizer), and the JobSet is not rebuilt
after its creation (``plugins/jobset/jobset.go`` Build).

Its own module because the answer depends on the runtime (which replicated jobs it labels as the trainer),
while ``jobsStatus`` is read on every watch event: a runtime's set of training-step names is computed once
per runtime version (``training_jobs``), and a job's event only tests the names of its ready child Jobs
against that set (``training_ready``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from app.trainer.rules.nodes import LAUNCHER, NODE
from app.trainer.rules.runtimes import ANCESTOR_LABEL, ANCESTOR_TRAINER

# kubeflow/trainer v2.3.0 pkg/constants/constants.go: DatasetInitializer and ModelInitializer are "the name
# of the Job, volume mount, container, and label value" of the initializers.
DATASET_INITIALIZER: Final = "dataset-initializer"
MODEL_INITIALIZER: Final = "model-initializer"
INITIALIZER_STEPS: Final = frozenset({DATASET_INITIALIZER, MODEL_INITIALIZER})

# The jobs that train by the controller's own naming (constants.Node, the trainer's replicated job;
# constants.Launcher, MPI's launcher): the training step of a runtime that labels no job `trainer`, and of a
# job whose runtime is not known (not listed yet, or a reference to none). Never an initializer's name.
FALLBACK_TRAINING_JOBS: Final = frozenset({NODE, LAUNCHER})


def training_jobs(replicated: Iterable[tuple[object, object]], mpi: bool) -> frozenset[str]:
    """The names of a runtime's replicated jobs that are its training step, from (name, Job template
    labels) pairs in template order; ``mpi``: the runtime's mlPolicy has an ``mpi`` source.

    - Every job labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``: the controller's trainer
      PodSet (kubeflow/trainer v2.3.0 ``pkg/runtime/runtime.go`` FindPodSetByAncestor(AncestorTrainer), which
      the torch, jax, xgboost and plainml plugins size and configure).
    - MPI: the ``launcher`` alone, by name, whatever the labels. The job's command goes to the
      ancestor-``trainer`` job (``pkg/runtime/framework/plugins/jobset/builder.go`` Trainer), which in the
      built-in MPI runtimes is ``launcher`` alone (manifests/base/runtimes/deepspeed_distributed.yaml,
      mlx_distributed.yaml); the launcher runs ``mpirun`` over the hostfile
      (``pkg/runtime/framework/plugins/mpi/mpi.go``, constants.Launcher) and ``dependsOn`` the ``node`` job
      being Ready, so JobSet creates it only once every ``node`` Job is ready (kubernetes-sigs/jobset v0.12.0
      ``pkg/controllers/depends_on.go`` dependencyReachedStatus). A ready ``node`` means its sshd listens
      (the runtimes' readinessProbe on port 2222), not that anything trains. With ``runLauncherAsNode`` the
      launcher is also a node (rules.node_rule), which changes the node count, not when the job runs.
    - A runtime that labels no job ``trainer`` (and is not MPI): FALLBACK_TRAINING_JOBS, the controller's
      naming.

    A job labelled as an initializer step (``dataset-initializer`` / ``model-initializer``) is never part of
    it, whatever its name.
    """
    if mpi:
        return _MPI_TRAINING
    labelled: set[str] = set()
    initializers: set[str] = set()
    for name, labels in replicated:
        if not isinstance(name, str):
            continue
        step = labels.get(ANCESTOR_LABEL) if isinstance(labels, Mapping) else None
        if step == ANCESTOR_TRAINER:
            labelled.add(name)
        elif step in INITIALIZER_STEPS:
            initializers.add(name)
    if not labelled:
        labelled = set(FALLBACK_TRAINING_JOBS)
    return _shared(frozenset(labelled - initializers))


def _shared(names: frozenset[str]) -> frozenset[str]:
    """One object per distinct set: the runtimes of a cluster share a few of them."""
    return _SETS.setdefault(names, names)


_MPI_TRAINING: Final = frozenset({LAUNCHER})
_SETS: dict[frozenset[str], frozenset[str]] = {
    FALLBACK_TRAINING_JOBS: FALLBACK_TRAINING_JOBS,
    _MPI_TRAINING: _MPI_TRAINING,
}


# Training steps as small ints, so that a job's projection can keep the one it was resolved with in its flags
# (app/trainer/projection_types.py STEP_SHIFT) at no cost in bytes. Id 0 is "not resolved yet" (its runtime
# not known), read by the controller's naming; ids are never reused, and at most MAX_STEP_IDS distinct steps
# get one (a cluster has a few; beyond that a step reads as not resolved, i.e. from the live runtime).
MAX_STEP_IDS: Final = 4096
STEP_SETS: Final[list[frozenset[str]]] = [FALLBACK_TRAINING_JOBS]
_STEP_IDS: dict[frozenset[str], int] = {}


def step_id(training: frozenset[str]) -> int:
    """The id of a training step (``training_jobs``'s answer), 0 when the ids are used up."""
    known = _STEP_IDS.get(training)
    if known is not None:
        return known
    if len(STEP_SETS) > MAX_STEP_IDS:
        return 0
    STEP_SETS.append(training)
    _STEP_IDS[training] = len(STEP_SETS) - 1
    return len(STEP_SETS) - 1


def training_ready(jobs_status: Iterable[tuple[object, object]], training: frozenset[str]) -> bool:
    """Some child Job of the training step is ready: a ``status.jobsStatus`` entry, as (name, ready) pairs,
    whose name is in ``training`` and whose ``ready`` count is above 0.

    ``jobsStatus`` is the Trainer's copy of the JobSet's ``replicatedJobsStatus``, one entry per replicated
    job name (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go`` Status). ``ready``
    counts that replicated job's child Jobs whose ready plus succeeded pods reach the Job's pod count. A
    count that is not a number, or a name that is not a string, is not ready (the tolerant projector flags
    the count malformed).
    """
    for name, ready in jobs_status:
        if type(name) is str and type(ready) in _NUMBER and ready > 0 and name in training:  # type: ignore[operator]
            return True
    return False


_NUMBER: Final = (int, float)
