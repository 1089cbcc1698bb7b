"""The protobuf exposition against the ``protobuf`` library (metrics.proto as Prometheus 2.42 parses it,
tests/support/metrics_proto.py): decoded, it says what the text format says (classic buckets, counts, sums,
gauges) plus native buckets and exemplars; re-encoded by the library, it is the same bytes. Native buckets
follow Prometheus' bucket definition and the documented schema, zero threshold and bucket limit."""

from __future__ import annotations

import gzip
import math
import random
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.metrics import native
from app.metrics.cached_family import Format
from app.metrics.exposition import CONTENT_TYPE_PROTOBUF, MetricsExposition, negotiate
from app.metrics.per_job import PerJobSeries
from app.metrics.protobuf import encode_registry
from app.metrics.telemetry import SelfTelemetry
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import JobCreated, JobFinished
from tests.support.metrics_proto import decode_delimited, encode_delimited

from .helpers import REF, samples

T0 = 1_750_000_000.0
NATIVE_ACCEPT_2_42 = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
    "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def created(n: int, nodes: int = 2, gpus: int = 8, cls: str = "nvidia.com/gpu") -> JobCreated:
    return JobCreated(n, f"uid-{n}", "team-a", REF, nodes, cls, gpus, key=f"team-a/job-{n}", at=T0 + n)


def finished(n: int, lifetime: float, result: str = "succeeded") -> JobFinished:
    return JobFinished(
        n, f"uid-{n}", result, "none", REF, lifetime, "team-a", key=f"team-a/job-{n}", at=T0 + n
    )


def busy_state(*, exemplars: bool = True) -> TrainerMetricState:
    state = TrainerMetricState(exemplars=exemplars)
    rng = random.Random(7)
    for n in range(1, 200):
        state.on_countable(created(n, nodes=rng.choice([1, 2, 4, 16]), gpus=rng.choice([0, 1, 8, 64])))
        state.on_countable(finished(n, rng.lognormvariate(8, 2), rng.choice(["succeeded", "failed"])))
    state.on_countable(finished(500, 0.0))  # clock skew: a lifetime of 0, in the zero bucket
    state.on_jobs_gauge(("team-a", REF, "running"), 3)
    return state


def text_like(families: list[Any]) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """The samples the text format shows for the decoded families (classic buckets, +Inf included)."""
    out = set()
    for family in families:
        for metric in family.metric:
            labels = {pair.name: pair.value for pair in metric.label}
            if metric.HasField("histogram"):
                h = metric.histogram
                for bucket in h.bucket:
                    le = "+Inf" if math.isinf(bucket.upper_bound) else repr(float(bucket.upper_bound))
                    key = tuple(sorted({**labels, "le": le}.items()))
                    out.add((family.name + "_bucket", key, float(bucket.cumulative_count)))
                out.add((family.name + "_count", tuple(sorted(labels.items())), float(h.sample_count)))
                out.add((family.name + "_sum", tuple(sorted(labels.items())), h.sample_sum))
            else:
                value = metric.counter.value if metric.HasField("counter") else metric.gauge.value
                out.add((family.name, tuple(sorted(labels.items())), value))
    return out


def native_counts(h: Any) -> dict[int, int]:
    """Bucket index -> count from spans and deltas, as Prometheus expands them."""
    out: dict[int, int] = {}
    index, count, deltas = 0, 0, iter(h.positive_delta)
    for span in h.positive_span:
        index += span.offset  # the first from 0, each next from the end of the previous span
        for _ in range(span.length):
            count += next(deltas)
            if count:
                out[index] = count
            index += 1
    return out


def test_the_protobuf_body_is_what_a_proto3_encoder_writes_and_says_what_the_text_says() -> None:
    state = busy_state()
    body = state.render_protobuf()
    families = decode_delimited(body)
    assert encode_delimited(families) == body  # byte for byte
    text = {s for s in samples(state.render_text()) if not s[0].startswith("kubeflow_trainer_runtime_info")}
    assert text_like(families) == {(n, tuple(sorted(dict(k).items())), v) for n, k, v in text}
    names = [f.name for f in families]
    assert "kubeflow_trainer_runtime_info" not in names  # no series: no family (Prometheus skips one)
    assert "kubeflow_trainer_trainjob_created_total" in names  # counters by their sample name


def test_native_buckets_hold_every_observation_in_prometheus_buckets() -> None:
    state = TrainerMetricState()
    values = [0.0, 0.5, 1.0, 2.0, 3.0, 59.0, 60.0, 61.0, 3600.0, 86_400.0 * 9, 1e-3]
    for n, v in enumerate(values, 1):
        state.on_countable(finished(n, v))
    (family,) = [f for f in decode_delimited(state.render_protobuf()) if f.name.endswith("lifetime_seconds")]
    h = family.metric[0].histogram
    assert h.schema == native.SCHEMA and h.zero_threshold == native.ZERO_THRESHOLD
    assert h.zero_count == 1 and h.sample_count == len(values) and h.sample_sum == pytest.approx(sum(values))
    counts = native_counts(h)
    assert sum(counts.values()) + h.zero_count == h.sample_count
    expected: dict[int, int] = defaultdict(int)
    base = 2 ** (2**-native.SCHEMA)
    for v in values[1:]:
        index = native.bucket_index(v, native.SCHEMA)
        assert base ** (index - 1) < v <= base**index * (1 + 1e-12)  # (base^(i-1), base^i]
        expected[index] += 1
    assert counts == expected
    assert native.bucket_index(1.0, 3) == 0 and native.bucket_index(2.0, 3) == 8  # powers of 2: bounds


@given(st.floats(min_value=1e-9, max_value=1e12), st.integers(min_value=native.MIN_SCHEMA, max_value=8))
def test_bucket_index_is_prometheus_bucket(value: float, schema: int) -> None:
    index = native.bucket_index(value, schema)
    base = 2.0 ** (2.0**-schema)
    assert base ** (index - 1) < value * (1 + 1e-12) and value <= base**index * (1 + 1e-12)


def test_past_the_bucket_limit_the_series_halves_its_resolution() -> None:
    buckets = native.NativeBuckets()
    observed = [1.0001 * 1.05**i for i in range(600)]  # ~12 decades, more than 160 buckets at schema 3
    for v in observed:
        buckets.observe(v)
    assert buckets.schema < native.SCHEMA and len(buckets.buckets) <= native.BUCKET_LIMIT
    assert sum(buckets.buckets.values()) == len(observed)
    # Merged buckets are the buckets of the lower schema: the same as observing at it from the start.
    again: dict[int, int] = defaultdict(int)
    for v in observed:
        again[native.bucket_index(v, buckets.schema)] += 1
    assert buckets.buckets == again


def test_a_held_series_is_all_zeros_natively_too_with_its_first_exemplar() -> None:
    clock = [100.0]
    state = TrainerMetricState(exemplars=True, zero_hold=5.0, clock=lambda: clock[0])
    state.on_countable(finished(1, 90.0))
    state.on_countable(finished(2, 95.0))
    (held,) = [f for f in decode_delimited(state.render_protobuf()) if f.name.endswith("lifetime_seconds")]
    h = held.metric[0].histogram
    assert h.sample_count == 0 and h.sample_sum == 0 and not h.positive_span and h.zero_count == 0
    assert h.schema == native.SCHEMA and h.zero_threshold > 0  # a native histogram for Prometheus 2.42
    assert {b.cumulative_count for b in h.bucket} == {0}
    (bucket,) = [b for b in h.bucket if b.HasField("exemplar")]
    assert bucket.upper_bound == 300.0 and {p.value for p in bucket.exemplar.label} >= {"job-1", "uid-1"}
    clock[0] += 5.0
    state.render_protobuf()
    (real,) = [f for f in decode_delimited(state.render_protobuf()) if f.name.endswith("lifetime_seconds")]
    h = real.metric[0].histogram
    assert h.sample_count == 2 and sum(native_counts(h).values()) == 2
    (bucket,) = [b for b in h.bucket if b.HasField("exemplar")]
    ex = bucket.exemplar
    assert {p.name: p.value for p in ex.label}["name"] == "job-2" and ex.value == 95.0
    assert ex.timestamp.seconds == int(T0 + 2)


def test_counters_carry_their_exemplar_and_gauges_none() -> None:
    families = {f.name: f for f in decode_delimited(busy_state().render_protobuf())}
    counter = families["kubeflow_trainer_trainjob_created_total"].metric[0].counter
    assert counter.value == 199 and counter.exemplar.value == 1.0
    assert {p.name for p in counter.exemplar.label} == {"name", "namespace", "uid"}
    assert not families["kubeflow_trainer_trainjobs"].metric[0].HasField("counter")
    off = {f.name: f for f in decode_delimited(busy_state(exemplars=False).render_protobuf())}
    assert not off["kubeflow_trainer_trainjob_created_total"].metric[0].counter.HasField("exemplar")
    assert not any(b.HasField("exemplar") for f in off.values() for m in f.metric for b in m.histogram.bucket)


def test_the_protobuf_chunks_are_cached_and_follow_changes() -> None:
    state = busy_state()
    body = state.render_protobuf()
    assert state.render_protobuf() is body  # unchanged state: the same object
    state.on_countable(finished(900, 30.0))
    after = decode_delimited(state.render_protobuf())
    assert encode_delimited(after) == state.render_protobuf()
    text = {s for s in samples(state.render_text()) if not s[0].startswith("kubeflow_trainer_runtime_info")}
    assert text_like(after) == {(n, tuple(sorted(dict(k).items())), v) for n, k, v in text}


def test_self_telemetry_and_per_job_gauges_in_protobuf() -> None:
    telemetry = SelfTelemetry()
    telemetry.set_leader(True)
    body = encode_registry(telemetry.registry)
    families = decode_delimited(body)
    assert encode_delimited(families) == body
    by_name = {f.name: f for f in families}
    assert by_name["trainer_metrics_leader"].metric[0].gauge.value == 1.0
    assert by_name["trainer_metrics_leader_transitions_total"].metric[0].counter.value == 1.0
    assert len(by_name["trainer_metrics_limit_hits_total"].metric) >= 5
    per_job = PerJobSeries()
    state = TrainerMetricState(extra_families=per_job.families)
    per_job.info.set(("team-a", "job-1", REF), 1.0)
    per_job.progress.set(("team-a", "job-1"), 42.5)
    state.extra_changed()
    families = {f.name: f for f in decode_delimited(state.render_protobuf())}
    assert families["kubeflow_trainer_trainjob_status_progress_percent"].metric[0].gauge.value == 42.5


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, Format.TEXT),
        ("*/*", Format.TEXT),  # curl
        ("text/plain;version=0.0.4", Format.TEXT),
        # Prometheus 2.42: default, then --enable-feature=native-histograms.
        (
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
            "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            Format.OPENMETRICS,
        ),
        (NATIVE_ACCEPT_2_42, Format.PROTOBUF),
        # Prometheus 2.49+ scrape_protocols, weights by position (PrometheusProto first; OpenMetrics first;
        # text 1.0.0 first).
        (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,"
            "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,"
            "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=underscores;"
            "q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
            Format.PROTOBUF,
        ),
        (
            "application/openmetrics-text;version=1.0.0;q=0.6,"
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,"
            "*/*;q=0.1",
            Format.OPENMETRICS,
        ),
        ("text/plain;version=1.0.0;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4", Format.TEXT),
        # Protobuf we do not serve (text encodings) or refused.
        (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text",
            Format.TEXT,
        ),
        (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0,"
            "application/openmetrics-text;q=0.1",
            Format.OPENMETRICS,
        ),
        # A tie goes to the richer format.
        (
            "text/plain,application/openmetrics-text,"
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
            Format.PROTOBUF,
        ),
    ],
)
def test_negotiation_by_q_values(accept: str | None, expected: Format) -> None:
    assert negotiate(accept) is expected


def test_exposition_serves_protobuf_gzipped_with_self_telemetry_last() -> None:
    telemetry = SelfTelemetry()
    exposition = MetricsExposition(telemetry.registry)
    follower = exposition.build_metrics_response(NATIVE_ACCEPT_2_42, None)
    assert follower.headers["Content-Type"] == CONTENT_TYPE_PROTOBUF
    assert all(
        f.name.startswith(("trainer_metrics_", "process_", "python_"))
        for f in decode_delimited(follower.body)
    )
    state = busy_state()
    exposition.set_trainer_source(state)
    plain = exposition.build_metrics_response(NATIVE_ACCEPT_2_42, None).body
    zipped = exposition.build_metrics_response(NATIVE_ACCEPT_2_42, "gzip")
    assert zipped.headers["Content-Encoding"] == "gzip"
    unzipped = gzip.decompress(zipped.body)
    assert unzipped.startswith(state.render_protobuf())
    # Self-telemetry changes between scrapes (process CPU, GC): compare the family names.
    assert [f.name for f in decode_delimited(unzipped)] == [f.name for f in decode_delimited(plain)]
    assert len(decode_delimited(unzipped)) > len(decode_delimited(follower.body))


def test_a_protobuf_render_is_a_served_render() -> None:
    """Born at zero and the hand-over read the same holds whatever the format: a protobuf scrape starts and
    ends holds and tells the served listeners (app/handover/served.py) as a text scrape does."""
    clock = [10.0]
    state = TrainerMetricState(zero_hold=1.0, clock=lambda: clock[0])
    served: list[tuple[float, list[Any]]] = []
    state.add_served_listener(lambda now, released: served.append((now, released)))
    event = finished(1, 90.0)
    state.on_countable(event)
    state.render_protobuf()
    assert state.held_series_of(event) is not None and served == [(10.0, [])]
    clock[0] = 11.0
    body = state.render_protobuf()
    assert state.held_series_of(event) is None
    assert {name for name, _ in served[-1][1]} == {
        "kubeflow_trainer_trainjob_finished_total",
        "kubeflow_trainer_trainjob_lifetime_seconds",
    }
    (lifetime,) = [f for f in decode_delimited(body) if f.name.endswith("lifetime_seconds")]
    assert lifetime.metric[0].histogram.sample_count == 1
