"""``RecordFamily``: a gauge family kept per TrainJob and rendered from its owner's state.

The pod series (app/metrics/pods.py) keep one record per TrainJob with pods (its pods, their device sums, its
largest restart attempt), and their series are functions of it: a ``pod_info`` series per pod shown, an
``allocated_accelerators`` series per accelerator class held, one ``restarts`` series. Kept as the other
families keep theirs, each series would hold its label tuple (with the pod name, for ``pod_info``), its value
and three dict entries (~280 B a ``pod_info`` series by tracemalloc). Here an entry of the family is a
TrainJob, and its series are rendered from the owner's record when their block is rendered again: nothing is
kept per series but its line in the compressed block.

The owner counts each TrainJob's series and tells every change while it happens (``resize``); ``samples(job)``
gives the label values and value of each series of a TrainJob as they are at that moment (a block is
rendered at the next flush or scrape, after every change before it was told).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from app.metrics import protobuf as pb
from app.metrics.cached_family import Family
from app.metrics.formatting import LabelValues, floatToGoString

__all__ = ["RecordFamily", "Samples"]

# The series of one TrainJob, by its key: (label values, value) each.
Samples = Callable[[str], Iterable[tuple[LabelValues, float]]]


class RecordFamily(Family[str]):
    """A gauge family whose entries are TrainJobs, by their key ("namespace/name": the owner's record's,
    no tuple a job), and whose series are rendered from ``samples`` (the module docstring); its length is
    the number of series."""

    __slots__ = ("_samples", "_total")

    def __init__(self, name: str, documentation: str, label_names: Sequence[str], samples: Samples) -> None:
        super().__init__(name, documentation, "gauge", label_names, keep_chunks=False, compressed=True)
        self._samples = samples
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def resize(self, job: str, before: int, after: int) -> None:
        """``job`` has ``after`` series now and had ``before`` (its owner counts them); its block is
        rendered again while it has any."""
        self._total += after - before
        if after:
            if not before:
                self._add_series(job)
            self.touch(job)
        elif before:
            self._drop_series(job)

    def _render_series(self, key: str) -> bytes:
        labelstr, name = self._labelstr, self.name
        return "".join(
            f"{name}{labelstr(labels)} {floatToGoString(value)}\n" for labels, value in self._samples(key)
        ).encode()

    def _render_protobuf(self, key: str) -> bytes:
        pairs = self._pb_label_pairs
        return b"".join(
            pb.metric_field(pairs(labels) + pb.field_bytes(pb.METRIC_GAUGE, pb.field_double(1, value)))
            for labels, value in self._samples(key)
        )

    @property
    def values(self) -> dict[LabelValues, float]:
        """Every series, by its label values (what the text lists, in its order)."""
        return {
            labels: value
            for block in self._blocks
            for job in block.keys
            for labels, value in self._samples(job)
        }

    def metric(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family
