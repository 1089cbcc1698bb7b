"""The Kubeflow Trainer kinds the simulated cluster serves (trainer.kubeflow.org/v1alpha1, from its CRDs)."""

from __future__ import annotations

from kubesim.apiserver.resources import ResourceKind

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"

TRAINJOBS = ResourceKind(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", "TrainJob", namespaced=True)
TRAINING_RUNTIMES = ResourceKind(
    TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", "TrainingRuntime", namespaced=True
)
CLUSTER_TRAINING_RUNTIMES = ResourceKind(
    TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
TRAINER_RESOURCES = (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES)
