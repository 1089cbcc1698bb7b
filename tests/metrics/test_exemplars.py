"""Exemplars: the TrainJob behind each Trainer histogram bucket and the created/finished counters, in
OpenMetrics (byte for byte what prometheus_client prints for the same exemplars), within the 128-character
label limit, the first one shown on a series held at zero, never in the text format nor on gauges,
per-TrainJob or self-telemetry families, and off with ``exemplars=False``."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from app.metrics.exemplars import MAX_LABEL_CHARACTERS, TRUNCATED, exemplar_labels
from app.metrics.exposition import MetricsExposition
from app.metrics.per_job import PerJobSeries
from app.metrics.telemetry import SelfTelemetry
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import JobAdmitted, JobCreated, JobFinished, JobStarted

from .helpers import REF, reference_openmetrics, reference_text

UID = "0f5b2c1e-3d4a-4b5c-8d9e-0a1b2c3d4e5f"
T0 = 1_750_000_000.0
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class Source:
    def __init__(self, key: str, uid: str = UID, at: float | None = T0) -> None:
        self.key, self.uid, self.at = key, uid, at


def created(
    n: int, *, ns: str = "team-a", name: str | None = None, nodes: int = 2, gpus: int = 8
) -> JobCreated:
    return JobCreated(
        n, f"uid-{n}", ns, REF, nodes, "nvidia.com/gpu", gpus, key=f"{ns}/{name or f'job-{n}'}", at=T0 + n
    )


def finished(n: int, lifetime: float, *, result: str = "succeeded", name: str | None = None) -> JobFinished:
    return JobFinished(
        n, f"uid-{n}", result, "none", REF, lifetime, "team-a", key=f"team-a/{name or f'job-{n}'}", at=T0 + n
    )


def exemplar_lines(body: bytes) -> list[str]:
    return [line for line in body.decode().splitlines() if " # {" in line]


# --- the label-set limit ----------------------------------------------------------------------------------


def test_short_labels_are_kept_whole_and_sorted() -> None:
    assert exemplar_labels(Source("team-a/llama-sft")) == (
        ("name", "llama-sft"),
        ("namespace", "team-a"),
        ("uid", UID),
    )


def test_a_long_name_is_cut_to_fit_and_marked() -> None:
    namespace = "n" * 63  # the longest namespace: uid and namespace take 111 of the 128 characters
    labels = dict(exemplar_labels(Source(f"{namespace}/{'x' * 63}")))
    assert labels["uid"] == UID and labels["namespace"] == namespace
    assert labels["name"] == "x" * 12 + TRUNCATED
    assert sum(len(k) + len(v) for k, v in labels.items()) == MAX_LABEL_CHARACTERS


def test_what_cannot_fit_whole_is_dropped_uid_first_kept() -> None:
    # A uid is never cut (a cut uid names nothing); a non-UUID uid too long to fit is dropped.
    assert dict(exemplar_labels(Source("ns/job", uid="u" * 200))) == {"namespace": "ns", "name": "job"}
    # A namespace that cannot fit beside the uid is dropped; the name takes the room left.
    labels = dict(exemplar_labels(Source(f"{'n' * 100}/job")))
    assert labels == {"uid": UID, "name": "job"}


@given(st.text(max_size=300), st.text(max_size=300), st.text(max_size=300))
def test_the_limit_holds_for_any_labels(namespace: str, name: str, uid: str) -> None:
    labels = dict(exemplar_labels(Source(f"{namespace.replace('/', '')}/{name}", uid=uid)))
    assert sum(len(k) + len(v) for k, v in labels.items()) <= MAX_LABEL_CHARACTERS
    if uid and len(uid) + 3 <= MAX_LABEL_CHARACTERS:
        assert labels["uid"] == uid  # first in the rule: kept whenever it fits
    if "name" in labels and labels["name"] != name:
        assert labels["name"].endswith(TRUNCATED) and name.startswith(labels["name"][:-1])


# --- in the exposition -------------------------------------------------------------------------------------


def state_with_jobs(*, exemplars: bool = True) -> TrainerMetricState:
    state = TrainerMetricState(exemplars=exemplars)
    state.on_countable(created(1))
    state.on_countable(created(2, nodes=4, gpus=32))
    state.on_countable(created(3, name="a-very-long-trainjob-name-" + "x" * 60))
    state.on_countable(finished(1, 90.0))
    state.on_countable(finished(2, 7000.0, result="failed"))
    state.on_countable(JobStarted(4, "uid-1", REF, 12.5, "team-a", key="team-a/job-1", at=T0 + 20))
    state.on_countable(JobAdmitted(5, "uid-2", REF, 300.0, "team-a", key="team-a/job-2", at=T0 + 30))
    state.on_jobs_gauge(("team-a", REF, "running"), 2)
    return state


def test_openmetrics_with_exemplars_is_what_prometheus_client_prints() -> None:
    state = state_with_jobs()
    body = state.render_openmetrics()
    assert body == reference_openmetrics(state)
    assert state.render_text() == reference_text(state)  # the text format has no exemplars
    assert b" # {" not in state.render_text()
    # OpenMetrics parses, and every exemplar names a job with its event time.
    families = {f.name: f for f in parse_openmetrics((body + b"# EOF\n").decode())}
    lifetime = families["kubeflow_trainer_trainjob_lifetime_seconds"]
    found = {
        (s.labels["le"], s.exemplar.labels["name"], s.exemplar.value) for s in lifetime.samples if s.exemplar
    }
    assert found == {("300.0", "job-1", 90.0), ("7200.0", "job-2", 7000.0)}
    created_total = families["kubeflow_trainer_trainjob_created"].samples[0]
    assert created_total.exemplar is not None
    assert created_total.exemplar.value == 1.0 and float(created_total.exemplar.timestamp) == T0 + 3


def test_each_bucket_carries_the_last_job_that_landed_in_it() -> None:
    state = TrainerMetricState(exemplars=True)
    state.on_countable(created(1, nodes=2))
    state.on_countable(created(2, nodes=2))
    state.on_countable(created(3, nodes=16))
    lines = [
        line for line in exemplar_lines(state.render_openmetrics()) if "requested_training_nodes" in line
    ]
    assert len(lines) == 2
    assert 'le="2.0"' in lines[0] and 'name="job-2"' in lines[0] and lines[0].endswith(f" 2.0 {T0 + 2}")
    assert 'le="16.0"' in lines[1] and 'name="job-3"' in lines[1]


def test_exemplars_only_on_trainer_buckets_and_counters() -> None:
    per_job = PerJobSeries()
    state = TrainerMetricState(exemplars=True, extra_families=per_job.families)
    state.on_countable(created(1))
    state.on_countable(finished(1, 90.0))
    state.on_jobs_gauge(("team-a", REF, "running"), 1)
    exposition = MetricsExposition(SelfTelemetry().registry)
    exposition.set_trainer_source(state)
    body = exposition.build_metrics_response(OPENMETRICS, None).body
    lines = exemplar_lines(body)
    assert lines
    pattern = r"kubeflow_trainer_trainjob_((created|finished)_total|[a-z_]+_bucket)\{"
    assert all(re.match(pattern, line) for line in lines), lines


def test_the_setting_turns_them_off() -> None:
    state = state_with_jobs(exemplars=False)
    assert exemplar_lines(state.render_openmetrics()) == []
    assert state.render_openmetrics() == reference_openmetrics(state)


def test_a_held_series_shows_its_first_exemplars_then_the_last_ones() -> None:
    clock = [1000.0]
    state = TrainerMetricState(exemplars=True, zero_hold=10.0, clock=lambda: clock[0])
    state.on_countable(finished(1, 90.0))
    state.on_countable(finished(2, 100.0))  # same bucket: the held series keeps showing job-1
    first = state.render_openmetrics()
    lines = [line for line in exemplar_lines(first) if "lifetime" in line]
    assert len(lines) == 1 and 'le="300.0"' in lines[0] and 'name="job-1"' in lines[0]
    assert ' 0.0 # {name="job-1"' in lines[0]  # the zero value, the first real exemplar
    # A first observation in another bucket while held: its exemplar shows at once, the values stay 0.
    state.on_countable(finished(3, 5000.0))
    held = [line for line in exemplar_lines(state.render_openmetrics()) if "lifetime" in line]
    assert [('name="job-1"' in h, 'name="job-3"' in h) for h in held] == [(True, False), (False, True)]
    assert all(" 0.0 # {" in h for h in held)
    clock[0] += 10.0
    state.render_openmetrics()  # the release: real values, the last exemplars
    released = [line for line in exemplar_lines(state.render_openmetrics()) if "lifetime" in line]
    assert [bool(re.search(r'} 2\.0 # \{name="job-2"', line)) for line in released] == [True, False]
    assert 'name="job-3"' in released[1]
    assert state.render_openmetrics() == reference_openmetrics(state)
