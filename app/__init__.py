"""trainer-metrics: Prometheus exporter for Kubeflow Trainer objects."""
