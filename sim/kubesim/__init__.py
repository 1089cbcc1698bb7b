"""kubesim: a simulated Kubernetes API server with the Kubeflow Trainer installed.

A real HTTP server, faithful to the API server's protocol (docs/design/k8s-protocol.md), for the demo
(``trainer-metrics --simulate``), the integration and chaos tests and the benchmarks. Two parts:

- :mod:`kubesim.apiserver`: a generic API server. ``storage`` (one revision counter, the registry's write
  rules, watch history, paging), ``schema`` (validation and defaulting from OpenAPI schemas, the CEL rules
  of CRDs), ``http`` (routing, LIST and watch streams, writes, discovery, OpenAPI, content negotiation,
  authentication, fault injection), and the CRDs and built-in kinds it serves.
- :mod:`kubesim.trainer`: the Kubeflow Trainer on top of it. Its manifests (CRDs, runtimes, examples), the
  cluster with them installed, the workload generator that plays users, Kueue and the Trainer controller,
  and the independent ground truth the tests compare the exporter with.

It imports nothing from the exporter (``app``), and ``kubesim.apiserver`` nothing from ``kubesim.trainer``.
"""
