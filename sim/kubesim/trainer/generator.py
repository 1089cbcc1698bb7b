"""Workload generator for the simulated cluster: creates runtimes and TrainJobs in a Store and plays everyone
who writes to them in a real cluster: users, Kueue (and MultiKueue), the cluster's child Jobs, JobSet v0.12
and the Trainer controller v2.3 (docs/design/trainer-domain.md §1-§2), while keeping an independent ground
truth (``sim/kubesim/trainer/truth.py``) of what the exporter's metrics should report.

Everything random comes from one ``random.Random(seed)``, so a seed replays the same sequence of writes
against an empty store given the same ``clock`` readings (deadlines are the one event that follows the
clock: inject a clock to replay a run exactly). Timestamps come from ``clock`` (wall time unless a test
injects one), stretched by ``time_warp`` per job.

``WorkloadGenerator`` stacks one layer per job, each in its own module: ``gen_writes`` (every write and the
truth and bookkeeping that follow it), ``gen_cluster`` (the cluster and its controllers: child Jobs, JobSet,
the Trainer, deadlines; what they write is ``jobset`` and ``controller``), ``gen_multikueue`` (a job run on
a worker cluster, its status copied back; Kueue's admission, ``kueue``),
``gen_actions`` (users and Kueue), ``gen_drivers`` (when to make which transition; bulk populate); beside
them ``gen_population`` (live job records by phase), ``gen_runtimes`` (the runtime mix) and
``gen_adversarial`` (odd but valid writes).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Final

from kubesim.apiserver.storage.store import Store
from kubesim.trainer import shapes
from kubesim.trainer.gen_actions import COMPLETE, FAILED
from kubesim.trainer.gen_drivers import Drivers
from kubesim.trainer.gen_pods import JobPods
from kubesim.trainer.gen_population import PENDING, RUNNING, SUSPENDED, JobRecord, PhaseBucket, Population
from kubesim.trainer.gen_runtimes import RuntimeCatalog
from kubesim.trainer.gen_writes import StoreLike
from kubesim.trainer.kinds import TRAINJOBS
from kubesim.trainer.shapes import WeightedPicker
from kubesim.trainer.shapes_runtimes import RuntimeChoice
from kubesim.trainer.truth import Truth
from kubesim.trainer.truth_records import TruthSnapshot

# One second of the generator's clock is a simulated minute: a demo's jobs live minutes to hours and their
# activeDeadlineSeconds (10 minutes to 2 days) can fall due, as on a real cluster. Tests that need other
# spans pass their own.
DEFAULT_TIME_WARP: Final = 60.0


class WorkloadGenerator(Drivers):
    """Creates and drives Trainer objects in ``store``; ``truth`` says what the metrics should show."""

    def __init__(
        self,
        store: StoreLike,
        *,
        seed: int | None = None,
        namespaces: int = 5,
        max_jobs: int = 1000,
        suspend_ratio: float = 0.2,
        deadline_ratio: float = shapes.DEADLINE_RATIO,
        finalizer_ratio: float = 0.15,
        malformed_ratio: float = 0.0,
        unregistered_ratio: float = shapes.UNREGISTERED_RATIO,
        time_warp: float = DEFAULT_TIME_WARP,
        clock: Callable[[], float] = time.time,
        min_delete_age: float = 0.0,
        pods: bool = False,
    ) -> None:
        """``max_jobs`` bounds the live population step() keeps; ``time_warp`` stretches time as the
        cluster's controllers see it (a job's condition times are its creation + elapsed * warp, and its
        deadline falls due after activeDeadlineSeconds / warp of ``clock``), so a short run fills
        minute-to-day histogram buckets; ``suspend_ratio`` / ``deadline_ratio`` are the shares of jobs
        created with a Kueue queue / an activeDeadlineSeconds; ``malformed_ratio`` is the share of creates
        and status writes made odd; ``unregistered_ratio`` the share of TrainJobs referring to a runtime kind
        the controller has not registered (``shapes.UNREGISTERED_REFS``: stored only while the webhook is
        bypassed; the exporter logs each as having unusable fields, so the demo turns them off).

        ``min_delete_age`` (seconds of ``clock``): step() deletes a finished TrainJob only once it has been
        finished that long, and cancels (deletes) an unfinished one only once it exists that long, as on a
        real cluster where finished jobs stay for minutes to days (a TTL, a user, a pipeline cleaning up).
        0 (the default) deletes at once. A job created, finished and deleted within one relist gap of a
        list+watch client is invisible to it; this bounds how short-lived the generated jobs are.
        ``lifecycles()`` ignores it (its driver deletes when the lifecycle ends).

        ``pods``: run the pods of the jobs' JobSets too (``gen_pods.py``; needs the real ``Store``), whose
        failures the truth counts."""
        self.store = store
        self._direct = store if isinstance(store, Store) else None
        self.rng = random.Random(seed)
        self.namespaces = shapes.namespace_names(max(1, namespaces))
        self.max_jobs = max_jobs
        self.suspend_ratio = suspend_ratio
        self.deadline_ratio = deadline_ratio
        self.finalizer_ratio = finalizer_ratio
        self.malformed_ratio = malformed_ratio
        self.unregistered_ratio = unregistered_ratio
        self.time_warp = time_warp
        self.clock = clock
        self.truth = Truth(clock=clock)
        self.catalog = RuntimeCatalog()
        self.population = Population(clock, min_delete_age)
        # The population's own containers, under the names callers (tests, the chaos soak) read.
        self.jobs: dict[str, JobRecord] = self.population.jobs  # uid -> live record
        self.buckets: dict[str, PhaseBucket] = self.population.buckets
        self.steps = 0
        self._deadlines: list[tuple[float, int, int, JobRecord]] = []  # the controller's requeued checks
        self._deadline_seq = 0
        self._populate_targets = WeightedPicker(
            [SUSPENDED, PENDING, RUNNING, COMPLETE, FAILED], [8.0, 12.0, 25.0, 45.0, 10.0]
        )
        self._salt = "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3))
        self._sequence = 0
        self._huge_jobs = 0
        self.run_pods = pods
        self._node_seq = 0
        self._pods: dict[str, JobPods] = {}

    @property
    def runtimes(self) -> list[RuntimeChoice]:
        """The runtimes TrainJobs may reference (empty until load_runtimes(), which step() calls first)."""
        return self.catalog.runtimes

    @property
    def min_delete_age(self) -> float:
        return self.population.min_delete_age

    def reconcile(self) -> int:
        """Forget the jobs deleted behind the generator's back (by a test, or a client of the simulated
        API), so the truth matches the store again. Returns how many were forgotten."""
        live = {str(obj["metadata"].get("uid")) for obj in self.store.list(TRAINJOBS, None)[0]}
        gone = [rec for uid, rec in self.jobs.items() if uid not in live]
        for rec in gone:
            self._forget(rec)
        return len(gone)

    def snapshot(self) -> TruthSnapshot:
        """The truth now, stamped with the store's current resourceVersion."""
        return self.truth.snapshot(self.store.resource_version)
