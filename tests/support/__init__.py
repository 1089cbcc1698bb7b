"""Helpers shared by test modules (no tests here): condition waits, service replicas against the simulated
cluster, recording sinks. Fixtures built on them live in tests/conftest.py."""
