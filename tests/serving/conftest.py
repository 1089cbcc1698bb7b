"""The package's fixtures: tests/support/auth_rig.py's, for the HTTPS tests that also check auth, and one real
exporter process for the raw-bytes tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.auth_rig import api_server, kube, registry
from tests.support.replica_process import SIMULATED_ALONE, ReplicaProcess, running

__all__ = ["api_server", "kube", "registry", "served"]


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaProcess]:
    """One real exporter (``--simulate``, auth off, both listeners) for this package's raw-bytes tests."""
    with running(tmp_path_factory.mktemp("served") / "exporter.log", SIMULATED_ALONE, timeout=60.0) as ex:
        yield ex
