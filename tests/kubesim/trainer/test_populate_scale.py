"""populate(100_000) stays practical: the generator's own cost per job is small.

Runs against a minimal no-copy stand-in of the Store API so that what is measured is the generator
(object building + ground truth), not the simulated store's copies and managedFields bookkeeping.
No timing assertion: the elapsed time is printed (pytest -s) for a person to judge.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubesim.apiserver.resources import ResourceKind
from kubesim.trainer.generator import WorkloadGenerator


class ThinStore:
    """The Store API at its cheapest: create drops status and stamps metadata, status patches merge."""

    def __init__(self) -> None:
        self.rv = 0
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}

    @property
    def resource_version(self) -> int:
        return self.rv

    def create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: dict[str, Any],
        *,
        field_manager: str = "sim",
    ) -> dict[str, Any]:
        self.rv += 1
        meta = {
            **obj["metadata"],
            "uid": f"uid-{self.rv}",
            "resourceVersion": str(self.rv),
            "creationTimestamp": "2026-01-01T00:00:00Z",
        }
        stored = {k: v for k, v in obj.items() if k != "status"} | {"metadata": meta}
        self.objects[(resource.plural, namespace, meta["name"])] = stored
        return stored

    def get(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        return self.objects[(resource.plural, namespace, name)]

    def list(self, resource: ResourceKind, namespace: str | None) -> tuple[list[dict[str, Any]], int]:
        return [o for (plural, _, _), o in self.objects.items() if plural == resource.plural], self.rv

    def patch(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
        field_manager: str = "sim",
    ) -> dict[str, Any]:
        self.rv += 1
        key = (resource.plural, namespace, name)
        old = self.objects[key]
        status = {k: v for k, v in {**(old.get("status") or {}), **patch["status"]}.items() if v is not None}
        new = {**old, "status": status, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
        self.objects[key] = new
        return new

    def delete(self, resource: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        self.rv += 1
        return self.objects.pop((resource.plural, namespace, name))


@pytest.mark.slow
def test_populate_100k_is_practical() -> None:
    gen = WorkloadGenerator(ThinStore(), seed=1)
    gen.load_runtimes()
    started = time.perf_counter()
    gen.populate(100_000)
    elapsed = time.perf_counter() - started
    print(f"\npopulate(100_000), generator only: {elapsed:.1f}s ({elapsed * 10:.0f} us/job)")
    snap = gen.snapshot()
    assert sum(snap.created.values()) == 100_000
    assert sum(snap.jobs.values()) == 100_000
    assert len(gen.jobs) == 100_000
