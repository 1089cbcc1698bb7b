"""Everything the workload generator writes passes the validation a real apiserver applies (the CRDs' schemas,
their CEL rules, ObjectMeta), so tests and the demo never rest on objects a real cluster would refuse.

Two checks: no write of the generator is refused except the deliberately odd ones a real apiserver refuses
too (duplicate condition types, the oversized annotation, both retried or dropped by design), and every
object it stored validates again from scratch, as a new create would."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from kubesim.apiserver.storage.store import Store
from kubesim.trainer.cluster import trainer_store
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.kinds import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS

KINDS = (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES)


def _revalidate(store: Store) -> int:
    """Validate every stored object of the Trainer kinds as if it were created now; returns how many."""
    checked = 0
    for resource in KINDS:
        validator = store.schema(resource).validator
        assert validator is not None
        for entry in store.entries(resource, None):
            obj = entry.copy()
            validator.validate(obj, None)  # raises StoreError (422) on anything invalid
            checked += 1
    return checked


@pytest.mark.parametrize("malformed", [0.0, 0.3])
def test_every_generator_write_validates(malformed: float, caplog: pytest.LogCaptureFixture) -> None:
    store = trainer_store()
    written: Counter[str] = Counter()
    store.subscribe(lambda ev: written.update([f"{ev.resource.plural}:{ev.type}"]))
    gen = WorkloadGenerator(store, seed=5, malformed_ratio=malformed, max_jobs=300)
    with caplog.at_level(logging.DEBUG, logger="kubesim.trainer.generator"):
        gen.load_runtimes(extra=12)
        gen.populate(300)
        for _ in range(1500):
            gen.step()
        gen.lifecycles(60, delete=False)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    if malformed == 0:
        assert refused == []
    else:
        # Only what the generator makes odd on purpose and a real apiserver refuses as well.
        assert refused and all("Duplicate value" in m for m in refused), refused[:3]
    assert written["trainjobs:ADDED"] >= 300 and written["trainjobs:MODIFIED"] > 300
    assert _revalidate(store) > 300
