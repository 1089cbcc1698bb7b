"""The jobs that ran (were admitted) before, carried in the Lease from the leader to every other replica
(docs/leadership.md, "Jobs that ran before").

No field of a TrainJob says that it ran before: a preempted job looks like one waiting for its first
admission (app/trainer/history.py). The leader publishes the uids of the live jobs it knows ran (were
resumed) and do not run (are suspended) now, with every Lease renewal; every replica merges what it reads
(app/replica/service.py). So a replica that started while a job was preempted does not count the job's next
run, or re-admission, as its first one, and the Lease keeps the facts across a restart of every replica.

The training steps of jobs whose runtime was edited or deleted since they were resolved travel the same way
(app/trainer/snapshots.py): a replica that lists such a job resolves it from the step published here, as the
controller runs it from its runtime snapshot, rather than from the runtime as it is now.

Format: one annotation per fact, the uids as their 16 UUID bytes concatenated and base64-encoded (22
characters a uid); the training steps as a JSON object from the step's replicated-job names (sorted,
comma-separated) to its jobs' uids in that encoding. At most ``MAX_PUBLISHED`` uids each (about 44 KB; the API
server allows 256 KB of annotations), so a renewal stays small; beyond it the rest are left out and the hit is
counted. A uid that is not a UUID (the API server always assigns UUIDs) is left out.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from app.kube.logthrottle import RateLimit
from app.trainer.projection_types import compact_uid, uid_text

__all__ = [
    "ADMITTED_BEFORE_ANNOTATION",
    "HISTORY_LIMIT",
    "MAX_PUBLISHED",
    "RAN_BEFORE_ANNOTATION",
    "TRAINING_STEPS_ANNOTATION",
    "format_history",
    "format_training_steps",
    "parse_history",
    "parse_training_steps",
]

log = logging.getLogger(__name__)

RAN_BEFORE_ANNOTATION: Final = "trainer-metrics.kubeflow.org/ran-before"
ADMITTED_BEFORE_ANNOTATION: Final = "trainer-metrics.kubeflow.org/admitted-before"
TRAINING_STEPS_ANNOTATION: Final = "trainer-metrics.kubeflow.org/training-steps"
MAX_PUBLISHED: Final = 2048
MAX_STEPS: Final = 64  # distinct training steps in the annotation
MAX_STEP_NAMES: Final = 16  # replicated jobs in one step
_JOB_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a replicated job's name: a DNS label
HISTORY_LIMIT: Final = "handover_history"  # app.metrics.telemetry.Limit

_throttle = RateLimit(300.0)


def _encode(uids: Iterable[str], on_limit: Callable[[str], None] | None) -> str:
    out: list[bytes] = []
    dropped = 0
    for uid in uids:
        raw = compact_uid(uid)
        if isinstance(raw, str):  # not a canonical UUID: nothing the API server assigns
            continue
        if len(out) >= MAX_PUBLISHED:
            dropped += 1
            continue
        out.append(raw)
    if dropped:
        if on_limit is not None:
            on_limit(HISTORY_LIMIT)
        if _throttle.allow("published") is not None:
            log.warning(
                "%d preempted jobs are above the %d the Lease carries: a replica that starts now and leads "
                "later may count their next run (admission) again",
                dropped,
                MAX_PUBLISHED,
            )
    return base64.b64encode(b"".join(sorted(out))).decode("ascii")


def format_history(
    ran: Iterable[str], admitted: Iterable[str], *, on_limit: Callable[[str], None] | None = None
) -> dict[str, str]:
    """The two annotations, from uid strings."""
    return {
        RAN_BEFORE_ANNOTATION: _encode(ran, on_limit),
        ADMITTED_BEFORE_ANNOTATION: _encode(admitted, on_limit),
    }


def _decode(raw: str | None) -> list[str]:
    if not raw:
        return []
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        data = b"\x00"  # not a multiple of 16: reported below
    if len(data) % 16:
        if _throttle.allow("malformed") is not None:
            log.warning(
                "ignoring a malformed ran-before/admitted-before annotation in the Lease (%r)", raw[:64]
            )
        return []
    count = min(len(data) // 16, MAX_PUBLISHED)
    return [uid_text(data[i * 16 : i * 16 + 16]) for i in range(count)]


def parse_history(annotations: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(uids that ran before, uids admitted before) from a Lease's annotations; empty when absent or
    malformed (logged)."""
    return _decode(annotations.get(RAN_BEFORE_ANNOTATION)), _decode(
        annotations.get(ADMITTED_BEFORE_ANNOTATION)
    )


def format_training_steps(
    steps: Mapping[str, frozenset[str]], *, on_limit: Callable[[str], None] | None = None
) -> dict[str, str]:
    """The training-steps annotation, from uid -> replicated-job names (at most MAX_PUBLISHED uids)."""
    by_step: dict[str, list[str]] = {}
    for uid, names in steps.items():
        by_step.setdefault(",".join(sorted(names)), []).append(uid)
    budget = MAX_PUBLISHED
    out: dict[str, str] = {}
    for key in sorted(by_step)[:MAX_STEPS]:
        uids = by_step[key][:budget]
        budget -= len(uids)
        out[key] = _encode(uids, on_limit)
    if budget <= 0 and on_limit is not None:
        on_limit(HISTORY_LIMIT)
    return {TRAINING_STEPS_ANNOTATION: json.dumps(out, separators=(",", ":"), sort_keys=True)}


def parse_training_steps(annotations: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """uid -> training step from a Lease's annotations; empty when absent; a malformed annotation, or entry,
    is ignored (logged)."""
    raw = annotations.get(TRAINING_STEPS_ANNOTATION)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        if _throttle.allow("malformed-steps") is not None:
            log.warning("ignoring a malformed training-steps annotation in the Lease (%r)", raw[:64])
        return {}
    out: dict[str, frozenset[str]] = {}
    for key, uids in list(doc.items())[:MAX_STEPS]:
        names = key.split(",") if isinstance(key, str) else []
        if not names or len(names) > MAX_STEP_NAMES or not all(_JOB_NAME.fullmatch(n) for n in names):
            continue
        if not isinstance(uids, str):
            continue
        step = frozenset(names)
        for uid in _decode(uids)[: MAX_PUBLISHED - len(out)]:
            out[uid] = step
    return out
