"""The Kubeflow Trainer kinds this service watches (trainer.kubeflow.org/v1alpha1)."""

from __future__ import annotations

from app.kube.resources import ResourceKind

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"

TRAINJOBS = ResourceKind(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", "TrainJob", namespaced=True)
TRAINING_RUNTIMES = ResourceKind(
    TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", "TrainingRuntime", namespaced=True
)
CLUSTER_TRAINING_RUNTIMES = ResourceKind(
    TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
