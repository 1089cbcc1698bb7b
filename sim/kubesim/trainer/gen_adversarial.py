"""Adversarial mode of the workload generator: odd but schema-valid TrainJobs and status writes
(docs/design/product.md §6 invariant 6), which the exporter must count without crashing or inventing
series.

Split from ``sim/kubesim/trainer/generator.py`` so that the catalogue of oddities reads in one place. The
functions draw from the generator's ``rng`` in a fixed order: a seed replays the same odd writes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Final

from kubesim.trainer import controller, shapes
from kubesim.trainer.kinds import TRAINER_GROUP
from kubesim.trainer.shapes import JobShape
from kubesim.trainer.shapes_runtimes import CLUSTER_KIND

HUGE_ANNOTATION_BYTES: Final = 1_000_000
MAX_HUGE_JOBS: Final = 4  # bound the memory adversarial mode can pin in the store


def bend_shape(rng: random.Random, shape: JobShape, *, huge_allowed: bool) -> bool:
    """Make ``shape`` odd in one way; True when that way was a huge annotation (the caller counts them
    against MAX_HUGE_JOBS and says through ``huge_allowed`` whether another is allowed)."""
    roll = rng.random()
    if roll < 0.05 and huge_allowed:
        shape.annotations = {shapes.HUGE_ANNOTATION: "x" * HUGE_ANNOTATION_BYTES}
        return True
    if roll < 0.40:
        # Valid quantities nobody writes for GPUs: fractional, suffixed, exponent form.
        gpu = ("500m", "1k", "1500m", "2e0", "0.5")[int(rng.random() * 5)]
        shape.resources = {"limits": {"nvidia.com/gpu": gpu}}
    elif roll < 0.55:
        # A group or kind that is not a Trainer runtime: the runtime_ref label must be "unknown".
        if rng.random() < 0.5:
            shape.ref = {"apiGroup": "kubeflow.org", "kind": "PyTorchJob", "name": shape.runtime.name}
        else:
            shape.ref = {"kind": "JobSet", "name": shape.runtime.name}
    elif roll < 0.75:
        # A runtime that does not exist; few distinct names, so it stays under the service's cap.
        missing = f"missing-runtime-{int(rng.random() * 3)}"
        shape.ref = {"apiGroup": TRAINER_GROUP, "kind": CLUSTER_KIND, "name": missing}
    else:
        shape.num_nodes = (256, 1024, 0)[int(rng.random() * 3)]
    return False


def bend_status(rng: random.Random, status: dict[str, Any], now: Callable[[], str]) -> dict[str, Any]:
    """An odd variant of ``status`` that means the same for the metrics (``now`` stamps added
    conditions)."""
    conditions = list(status.get("conditions") or [])
    terminal = any(c.get("type") in ("Complete", "Failed") for c in conditions)
    failed = next((c for c in conditions if c.get("type") == "Failed" and c.get("status") == "True"), None)
    roll = rng.random()
    if roll < 0.3:
        # Removed in Trainer #2621 but still on old objects; and a foreign domain-prefixed type.
        when = now()
        conditions.append(controller.condition("Created", "True", "JobsCreationSucceeded", "", when))
        conditions.append(controller.condition("example.com/Checkpointed", "True", "Saved", "ok", when))
    elif roll < 0.4 and failed is not None and not any(c.get("type") == "Complete" for c in conditions):
        # Complete and Failed both True, which no Trainer v2.3 writes (another writer might): Failed wins.
        when = str(failed.get("lastTransitionTime"))
        conditions.insert(0, controller.condition("Complete", "True", "AllJobsCompleted", "", when))
    elif roll < 0.5 and conditions:
        conditions.append(dict(conditions[-1]))  # an exact duplicate of a list-map key
    elif roll < 0.7 and not terminal:
        conditions.append(controller.condition("Failed", "Unknown", "Pending", "", now()))
    elif not terminal and any(v is not None for k, v in status.items() if k != "conditions"):
        # No conditions at all (never on a finished job; and a status must keep some field).
        return {**status, "conditions": None}
    return {**status, "conditions": conditions}
