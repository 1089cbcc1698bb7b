"""One replica of the service: its lifecycle (``service``) and what it is built from and checked against
before and while it runs (informer options, kube access, namespaces, extra collectors, the embedded
simulated cluster of ``--simulate``)."""
