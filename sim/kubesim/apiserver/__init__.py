"""A generic simulated Kubernetes API server: storage, schemas, HTTP. Knows no Trainer kinds: the CRDs it
serves are given to it (see :mod:`kubesim.trainer.cluster`)."""
