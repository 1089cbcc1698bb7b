"""trainer-metrics: Prometheus exporter for Kubeflow Trainer objects."""

__version__ = "0.1.0"
