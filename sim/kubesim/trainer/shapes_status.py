"""The trainer's own progress reports, ``status.trainerStatus`` (KEP-2779: alpha, feature gate
TrainJobStatus): the trainer pods post them to the controller's status server, which writes them into the
TrainJob (kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/trainjobstatus). What the controller itself
writes (conditions, jobsStatus) is ``controller.py``.

Split from ``sim/kubesim/trainer/shapes.py``: what a status write contains is independent of how a TrainJob's
spec is chosen.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kubesim.trainer.controller import rfc3339


@dataclass(slots=True)
class TrainingRun:
    """What a running trainer reports about itself: progress that ticks, a loss that goes down, an accuracy
    that goes up, an ETA from the pace so far; plus a checkpoint path, a metric that is text, not a number."""

    started_at: float  # the simulated time it began reporting
    progress: float  # percent
    loss: float
    accuracy: float
    step: int

    @classmethod
    def begin(cls, rng: random.Random, now: float, *, warm: bool = False) -> TrainingRun:
        """A run that starts now, or (``warm``) one that has been training for a while already."""
        done = rng.random() * 80.0 if warm else 0.0
        run = cls(now - done * 30.0, done, 2.0 + rng.random(), 0.1 + rng.random() * 0.2, int(done * 50))
        run.loss *= 0.97 ** (done / 2)
        return run

    def advance(self, rng: random.Random) -> None:
        gain = 2.0 + rng.random() * 10.0
        self.progress = min(99.0, self.progress + gain)
        self.loss *= 0.88 + rng.random() * 0.1
        self.accuracy = min(0.99, self.accuracy + (1.0 - self.accuracy) * rng.random() * 0.2)
        self.step += int(gain * 50)

    def status(self, now: float) -> dict[str, Any]:
        percent = int(self.progress)
        status: dict[str, Any] = {
            "progressPercentage": percent,
            "lastUpdatedTime": rfc3339(now),
            "metrics": [
                {"name": "loss", "value": f"{self.loss:.4f}"},
                {"name": "eval_accuracy", "value": f"{self.accuracy:.4f}"},
                {"name": "learning_rate", "value": "3e-05"},
                {"name": "checkpoint", "value": f"s3://checkpoints/step-{self.step}"},
            ],
        }
        if percent > 0:
            elapsed = max(now - self.started_at, 1.0)
            status["estimatedRemainingSeconds"] = int(elapsed * (100 - percent) / percent)
        return status
