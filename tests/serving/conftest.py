from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.exporter_proc import Exporter, exporter


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    """One real exporter (``--simulate``, auth off, both listeners) for this package's raw-bytes tests."""
    with exporter(tmp_path_factory.mktemp("served"), timeout=60.0) as ex:
        yield ex
