"""The status blocks the Trainer controller writes (docs/design/trainer-domain.md §1-§2): conditions
with the controller's reasons and messages, ``jobsStatus``, and the trainer's own ``trainerStatus``
progress reports (KEP-2779).

Split from ``sim/kubesim/trainer/shapes.py``: what a status write contains is independent of how a TrainJob's
spec is chosen.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

# Controller messages (trainer pkg/constants, jobset pkg/constants) so status looks like a real cluster's.
SUSPENDED_MESSAGE: Final = "TrainJob is suspended"
RESUMED_MESSAGE: Final = "TrainJob is resumed"
COMPLETE_REASON: Final = "AllJobsCompleted"
COMPLETE_MESSAGE: Final = "jobset completed successfully"
FAILURE_MESSAGES: Final = {
    "FailedJobs": "jobset failed due to one or more job failures",
    "DeadlineExceeded": "TrainJob exceeded its active deadline",
    "ReachedMaxRestarts": "jobset failed due to reaching max number of restarts",
    "FailJobSetFailurePolicyAction": "jobset failed due to applying failure policy rule: FailJobSet",
    "TrainingRuntimeNotSupported": "Specified runtime is not supported",
    # Not Trainer v2.3 or JobSet v0.12 reasons, as a newer release (or another controller) could write: the
    # well-formed ones (CamelCase, <= 64 characters) are label values by name, the rest count as "other".
    # All match the CRD's condition-reason pattern, so the API server stores them.
    "PodFailurePolicyRuleMatched": "pod failure policy rule matched on container node",
    "InPlaceRestartBudgetExhausted": "jobset failed: in-place restart budget exhausted",
    "evicted_by_descheduler": "pods evicted by the descheduler",
    "Preempted:HigherPriority": "preempted by a higher-priority workload",
    "FailedJobsBecauseTheNodePoolWasScaledDownWhileTheTrainerPodsWereStillRunning": "node pool scaled down",
}


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def condition(cond_type: str, status: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "type": cond_type,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when,
    }


def suspended_condition(when: str) -> dict[str, Any]:
    return condition("Suspended", "True", "Suspended", SUSPENDED_MESSAGE, when)


def resumed_condition(when: str) -> dict[str, Any]:
    return condition("Suspended", "False", "Resumed", RESUMED_MESSAGE, when)


def complete_condition(when: str) -> dict[str, Any]:
    return condition("Complete", "True", COMPLETE_REASON, COMPLETE_MESSAGE, when)


def failed_condition(reason: str, when: str) -> dict[str, Any]:
    return condition("Failed", "True", reason, FAILURE_MESSAGES.get(reason, "TrainJob failed"), when)


def jobs_status(
    names: Sequence[str],
    *,
    active: Sequence[str] = (),
    succeeded: Sequence[str] = (),
    failed: Sequence[str] = (),
    suspended: bool = False,
    ready: bool = False,
) -> list[dict[str, Any]]:
    """status.jobsStatus: one entry per replicated job; counts are child Jobs (one per replicated job)."""
    return [
        {
            "name": name,
            "active": int(name in active),
            "ready": int(ready and name in active),
            "succeeded": int(name in succeeded),
            "failed": int(name in failed),
            "suspended": int(suspended),
        }
        for name in names
    ]


# ---------------------------------------------------------------------------------------------------------
# Trainer progress (status.trainerStatus, KEP-2779: alpha, feature gate TrainJobStatus)
# ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class TrainingRun:
    """What a running trainer reports about itself: progress that ticks, a loss that goes down, an accuracy
    that goes up, an ETA from the pace so far; plus a checkpoint path, a metric that is text, not a number."""

    started_at: float  # clock() when it began reporting
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
