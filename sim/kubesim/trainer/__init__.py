"""The Kubeflow Trainer in the simulated cluster: its manifests, the cluster with them installed, the workload
generator (users, Kueue and the Trainer controller), and the independent ground truth."""
