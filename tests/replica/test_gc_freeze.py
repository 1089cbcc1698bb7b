"""A replica that owns its process (the CLI) freezes its synced caches out of the cyclic GC; one that
shares the process (tests, several replicas) never does, or stopped replicas could not be collected."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.replica.service import Service
from tests.support.waiting import eventually


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # what this test froze goes back to the collector: later tests check for leaks


@pytest.mark.parametrize("owns_process", [True, False], ids=["owns-process", "shares-process"])
async def test_gc_freeze_after_sync_only_when_the_replica_owns_the_process(
    kubeconfig: Path, unfrozen: None, owns_process: bool
) -> None:
    settings = Settings(kubeconfig=str(kubeconfig), leader_election=False, host="127.0.0.1", port=0)
    service = Service(settings, owns_process=owns_process)
    await service.start()
    try:
        # Exporting starts right after the freeze decision, in the same step.
        await eventually(lambda: service.journal.leading, 20, what="replica exporting")
        assert (gc.get_freeze_count() > 0) is owns_process
    finally:
        await service.stop()
