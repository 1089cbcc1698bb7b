"""A TrainerSink that records what it is handed, for tests of TrainerState and of the hand-over journal."""

from __future__ import annotations

from collections.abc import Callable

from app.trainer.events import CountableEvent, GaugeKey, JobCreated, JobFinished


class RecordingSink:
    """Records every countable event, gauge update and runtime signal (the metric state's inputs).

    ``check_gauge_key`` (optional) is called with each gauge key before it is recorded: a test's invariant
    on the labels (tests/badinput checks that they are bounded)."""

    def __init__(self, check_gauge_key: Callable[[GaugeKey], None] | None = None) -> None:
        self.events: list[CountableEvent] = []
        self.gauge: dict[GaugeKey, int] = {}  # the gauge's current non-zero values
        self.gauge_calls: list[tuple[GaugeKey, int]] = []  # every update, in order
        self.runtime_changes = 0
        self._check_gauge_key = check_gauge_key

    def on_countable(self, event: CountableEvent) -> None:
        self.events.append(event)

    def on_jobs_gauge(self, key: GaugeKey, value: int) -> None:
        if self._check_gauge_key is not None:
            self._check_gauge_key(key)
        self.gauge_calls.append((key, value))
        if value:
            self.gauge[key] = value
        else:
            self.gauge.pop(key, None)

    def on_runtimes_changed(self) -> None:
        self.runtime_changes += 1

    @property
    def created(self) -> list[JobCreated]:
        return [e for e in self.events if isinstance(e, JobCreated)]

    @property
    def finished(self) -> list[JobFinished]:
        return [e for e in self.events if isinstance(e, JobFinished)]

    @property
    def rvs(self) -> list[int]:
        """The resourceVersions of the events, in the order they were handed over."""
        return [e.rv for e in self.events]

    @property
    def gauge_values(self) -> list[int]:
        return [value for _, value in self.gauge_calls]
