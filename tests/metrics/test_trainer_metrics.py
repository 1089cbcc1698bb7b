"""TrainerMetricState: the metric contract (docs/design/product.md §3) and the cached text rendering."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from app.metrics import cached_family, series_cache
from app.metrics.counted import (
    ACCELERATOR_BUCKETS,
    CREATED,
    LIFETIME_BUCKETS,
    NODES_BUCKETS,
    REQUESTED_NODES,
)
from app.metrics.formatting import escape_label_value
from app.metrics.trainer_metrics import TrainerMetricState
from app.trainer.events import RuntimeInfo

from .helpers import (
    REF,
    admitted,
    created,
    families,
    feed,
    finished,
    pod_failed,
    reference_openmetrics,
    reference_text,
    sample_count,
    samples,
    started,
    value,
)

RUNTIME = RuntimeInfo(
    "", "torch-distributed", "trainer.kubeflow.org", "ClusterTrainingRuntime", "torch", "none", "torch"
)

EXPECTED = {
    # family name (as the text parser reports it) -> (type, label names without le)
    "kubeflow_trainer_runtime_info": (
        "gauge",
        {"namespace", "name", "api_group", "kind", "ml_policy", "pod_group_policy", "framework"},
    ),
    "kubeflow_trainer_trainjob_created": ("counter", {"namespace", "runtime_ref"}),
    "kubeflow_trainer_trainjob_finished": ("counter", {"result", "reason", "runtime_ref"}),
    "kubeflow_trainer_trainjob_lifetime_seconds": ("histogram", {"result", "runtime_ref"}),
    "kubeflow_trainer_trainjob_requested_training_nodes_per_job": ("histogram", {"runtime_ref"}),
    "kubeflow_trainer_trainjob_requested_accelerators": ("histogram", {"accelerator_class", "runtime_ref"}),
    "kubeflow_trainer_trainjob_startup_seconds": ("histogram", {"runtime_ref"}),
    "kubeflow_trainer_trainjob_admission_wait_seconds": ("histogram", {"runtime_ref"}),
    "kubeflow_trainer_trainjob_pod_failures": ("counter", {"namespace", "runtime_ref", "reason"}),
    "kubeflow_trainer_trainjobs": ("gauge", {"namespace", "runtime_ref", "state"}),
}


def full_state() -> TrainerMetricState:
    state = TrainerMetricState(lambda: [RUNTIME])
    state.on_runtimes_changed()
    feed(state, [created(1, nodes=2, accel_class="nvidia.com/gpu", accel=16), finished(2, lifetime=90.0)])
    feed(state, [admitted(3, seconds=45.0), started(4, seconds=61.5), pod_failed(5, reason="Evicted")])
    state.on_jobs_gauge(("team-a", REF, "running"), 3)
    return state


def test_names_types_and_label_sets_are_the_contract() -> None:
    text = full_state().render_text()
    fams = families(text)
    assert set(fams) == set(EXPECTED)
    for name, (mtype, labels) in EXPECTED.items():
        fam = fams[name]
        assert fam.type == mtype, name
        assert fam.samples, name
        for s in fam.samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)
    # Counters are exposed with _total in the text format, HELP/TYPE included.
    assert b"# TYPE kubeflow_trainer_trainjob_created_total counter\n" in text
    assert b"# TYPE kubeflow_trainer_trainjob_finished_total counter\n" in text
    assert (
        value(
            text,
            "kubeflow_trainer_runtime_info",
            namespace="",
            name="torch-distributed",
            api_group="trainer.kubeflow.org",
            kind="ClusterTrainingRuntime",
            ml_policy="torch",
            pod_group_policy="none",
            framework="torch",
        )
        == 1.0
    )


def test_bucket_boundaries() -> None:
    assert LIFETIME_BUCKETS[0] == 60 and LIFETIME_BUCKETS[-1] == 7 * 86400
    assert list(NODES_BUCKETS) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert list(ACCELERATOR_BUCKETS) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    text = full_state().render_text()
    fams = families(text)

    def les(name: str) -> list[str]:
        return [s.labels["le"] for s in fams[name].samples if s.name.endswith("_bucket")]

    assert les("kubeflow_trainer_trainjob_requested_training_nodes_per_job") == [
        *(f"{float(2**i)}" for i in range(11)),
        "+Inf",
    ]
    assert les("kubeflow_trainer_trainjob_requested_accelerators")[:3] == ["0.0", "1.0", "2.0"]
    assert les("kubeflow_trainer_trainjob_lifetime_seconds")[-2:] == ["604800.0", "+Inf"]


def _bucket(text: bytes, name: str, le: str, **labels: str) -> float | None:
    return value(text, name + "_bucket", le=le, **labels)


@pytest.mark.parametrize(
    ("nodes", "first_le"),
    [(1, "1.0"), (2, "2.0"), (3, "4.0"), (1024, "1024.0"), (1025, "+Inf"), (0, "1.0")],
)
def test_bucket_upper_bound_is_inclusive(nodes: int, first_le: str) -> None:
    state = TrainerMetricState()
    state.on_countable(created(1, nodes=nodes))
    text = state.render_text()
    name = "kubeflow_trainer_trainjob_requested_training_nodes_per_job"
    les = ["1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "+Inf"]
    got = [_bucket(text, name, le, runtime_ref=REF) for le in les]
    expected = [0.0 if les.index(le) < les.index(first_le) else 1.0 for le in les]
    assert got == expected
    assert value(text, name + "_sum", runtime_ref=REF) == float(nodes)
    assert value(text, name + "_count", runtime_ref=REF) == 1.0


def test_zero_accelerators_land_in_the_zero_bucket() -> None:
    state = TrainerMetricState()
    state.on_countable(created(1, accel_class="none", accel=0))
    state.on_countable(created(2, accel_class="nvidia.com/gpu", accel=4096))
    text = state.render_text()
    name = "kubeflow_trainer_trainjob_requested_accelerators"
    assert _bucket(text, name, "0.0", accelerator_class="none", runtime_ref=REF) == 1.0
    assert _bucket(text, name, "2048.0", accelerator_class="nvidia.com/gpu", runtime_ref=REF) == 0.0
    assert _bucket(text, name, "4096.0", accelerator_class="nvidia.com/gpu", runtime_ref=REF) == 1.0


def test_lifetime_observed_with_finished_only_when_known() -> None:
    state = TrainerMetricState()
    feed(
        state,
        [
            finished(1, lifetime=60.0),  # boundary: le=60
            finished(2, lifetime=None),  # counted finished, no observation
            finished(3, lifetime=-5.0),  # clock skew: observed as 0
            finished(4, lifetime=math.nan),  # never poisons the sum
            finished(5, result="failed", reason="DeadlineExceeded", lifetime=700000.0),
        ],
    )
    text = state.render_text()
    name = "kubeflow_trainer_trainjob_lifetime_seconds"
    ok = {"result": "succeeded", "runtime_ref": REF}
    assert value(text, "kubeflow_trainer_trainjob_finished_total", reason="none", **ok) == 4.0
    assert value(text, name + "_count", **ok) == 2.0
    assert value(text, name + "_sum", **ok) == 60.0
    assert _bucket(text, name, "60.0", **ok) == 2.0
    bad = {"result": "failed", "runtime_ref": REF}
    assert _bucket(text, name, "604800.0", **bad) == 0.0
    assert _bucket(text, name, "+Inf", **bad) == 1.0


def test_jobs_gauge_zero_removes_the_series() -> None:
    state = TrainerMetricState()
    key = ("team-a", REF, "pending")
    state.on_jobs_gauge(key, 2)
    assert (
        value(
            state.render_text(),
            "kubeflow_trainer_trainjobs",
            namespace="team-a",
            runtime_ref=REF,
            state="pending",
        )
        == 2.0
    )
    state.on_jobs_gauge(key, 0)
    text = state.render_text()
    assert b"kubeflow_trainer_trainjobs{" not in text
    assert b"# TYPE kubeflow_trainer_trainjobs gauge" in text  # the family stays, empty
    state.on_jobs_gauge(key, 0)  # removing an absent series is a no-op
    state.on_jobs_gauge(key, 5)
    assert text != state.render_text() == reference_text(state)


def test_a_series_that_comes_back_reuses_its_rendered_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a watch firehose a state's count falls to 0 and rises again between publishes: its labels are
    # not escaped and sorted again (cached_family._GONE_PREFIXES), and the text stays what it must be.
    state = TrainerMetricState()
    family = type(state.trainjobs)
    keys = [(f"team-{i}", REF, "running") for i in range(cached_family._GONE_PREFIXES + 10)]
    rendered: list[object] = []
    real = family._labelstr

    def counting(self: cached_family.Family, key: tuple[str, ...]) -> str:
        if key in keys:
            rendered.append(key)
        return real(self, key)

    monkeypatch.setattr(family, "_labelstr", counting)
    for key in keys:
        state.on_jobs_gauge(key, 1)
    state.render_text()
    assert len(rendered) == len(keys)
    for key in keys:
        state.on_jobs_gauge(key, 0)
    state.render_text()
    for key in keys:
        state.on_jobs_gauge(key, 3)
    assert state.render_text() == reference_text(state)
    # Only the series dropped before the last _GONE_PREFIXES were rendered again: the kept prefixes are
    # bounded, oldest out first.
    assert sorted(rendered[len(keys) :]) == sorted(keys[:10])


def test_runtime_info_is_read_only_when_signalled() -> None:
    calls = 0
    runtimes = [RUNTIME]

    def provider() -> list[RuntimeInfo]:
        nonlocal calls
        calls += 1
        return list(runtimes)

    state = TrainerMetricState(provider)
    state.render_text()
    state.render_text()
    assert calls == 1  # initial read
    runtimes.append(
        RuntimeInfo("team-a", "mine", "trainer.kubeflow.org", "TrainingRuntime", "jax", "volcano", "")
    )
    assert b'name="mine"' not in state.render_text()  # no signal, no re-read
    state.on_runtimes_changed()
    state.on_runtimes_changed()
    text = state.render_text()
    assert calls == 2 and b'name="mine"' in text
    runtimes.clear()
    state.on_runtimes_changed()
    assert b"kubeflow_trainer_runtime_info{" not in state.render_text()


def test_text_is_cached_until_something_changes() -> None:
    state = full_state()
    first = state.render_text()
    assert state.render_text() is first
    state.on_jobs_gauge(("team-a", REF, "running"), 3)  # same value: nothing changes
    assert state.render_text() is first
    state.on_countable(created(10))
    second = state.render_text()
    assert second is not first and second == reference_text(state)


def test_label_values_are_escaped() -> None:
    nasty = 'a"b\\c\nd'
    assert escape_label_value(nasty) == 'a\\"b\\\\c\\nd'
    state = TrainerMetricState()
    state.on_countable(created(1, ns=nasty, ref=nasty, accel_class=nasty))
    text = state.render_text()
    assert text == reference_text(state)
    assert state.render_openmetrics() == reference_openmetrics(state)
    assert b'namespace="a\\"b\\\\c\\nd"' in text
    assert value(text, "kubeflow_trainer_trainjob_created_total", namespace=nasty, runtime_ref=nasty) == 1.0
    assert (
        value(
            text,
            "kubeflow_trainer_trainjob_requested_accelerators_bucket",
            le="0.0",
            accelerator_class=nasty,
            runtime_ref=nasty,
        )
        == 1.0
    )


def test_large_values_use_go_float_formatting() -> None:
    state = TrainerMetricState()
    state.on_countable(created(1, nodes=3))
    state.on_countable(finished(2, lifetime=1234567.891))
    state.render_text()
    # Reach the exponent range of Go's float formatting without a million events.
    state.counter(CREATED).values[("team-a", REF)] = 12_345_678
    state.counter(CREATED).touch(("team-a", REF))
    state.histogram(REQUESTED_NODES).counts[(REF,)][2] = 2_000_000
    state.histogram(REQUESTED_NODES).touch((REF,))
    state.on_jobs_gauge(("team-a", REF, "running"), 1_000_000)
    text = state.render_text()
    assert text == reference_text(state)
    assert b"kubeflow_trainer_trainjob_created_total" in text and b"1.2345678e+07" in text


def test_openmetrics_parses_and_names_counters_without_total() -> None:
    state = full_state()
    body = state.render_openmetrics()
    assert not body.endswith(b"# EOF\n")
    assert b"# TYPE kubeflow_trainer_trainjob_created counter\n" in body
    assert b"kubeflow_trainer_trainjob_created_total{" in body
    parsed = {f.name: f for f in parse_openmetrics((body + b"# EOF\n").decode())}
    assert set(parsed) == set(EXPECTED)
    assert state.render_openmetrics() is body  # cached until a change
    assert body == reference_openmetrics(state)


# --- equivalence with prometheus_client on random states ---------------------------------------------

_label = st.one_of(
    st.sampled_from(["", "team-a", REF, "nvidia.com/gpu", "unknown"]),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8),
    st.text(alphabet='ab"\\\n{}=,', max_size=6),
)
_op = st.one_of(
    st.tuples(st.just("created"), _label, _label, st.integers(0, 5000), _label, st.integers(0, 10000)),
    st.tuples(
        st.just("finished"),
        st.sampled_from(["succeeded", "failed"]),
        _label,
        _label,
        st.one_of(st.none(), st.floats(-10, 2e6, allow_nan=False)),
    ),
    st.tuples(
        st.just("gauge"), _label, _label, st.sampled_from(["pending", "running", "failed"]), st.integers(0, 3)
    ),
    st.tuples(st.just("runtimes"), st.lists(st.tuples(_label, _label), max_size=4)),
    st.tuples(st.just("render")),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, max_size=40), st.sampled_from([0, 1, 3, 32]))
def test_render_text_equals_prometheus_client(ops: list[tuple[object, ...]], flush_every: int) -> None:
    runtimes: list[RuntimeInfo] = []
    state = TrainerMetricState(lambda: runtimes, flush_every=flush_every, publish_interval=0.0)
    for rv, op in enumerate(ops, start=1):
        kind = op[0]
        if kind == "created":
            _, ns, ref, nodes, cls, accel = op
            state.on_countable(
                created(
                    rv,
                    ns=str(ns),
                    ref=str(ref),
                    nodes=int(str(nodes)),
                    accel_class=str(cls),
                    accel=int(str(accel)),
                )
            )
        elif kind == "finished":
            _, result, reason, ref, lifetime = op
            state.on_countable(
                finished(
                    rv,
                    result=str(result),
                    reason=str(reason),
                    ref=str(ref),
                    lifetime=lifetime if isinstance(lifetime, float) else None,
                )
            )
        elif kind == "gauge":
            _, ns, ref, job_state, n = op
            state.on_jobs_gauge((str(ns), str(ref), str(job_state)), int(str(n)))
        elif kind == "runtimes":
            pairs = op[1]
            assert isinstance(pairs, list)
            runtimes[:] = [
                RuntimeInfo(ns, name, "trainer.kubeflow.org", "TrainingRuntime", "torch", "none", "")
                for ns, name in pairs
            ]
            state.on_runtimes_changed()
        else:
            state.render_text()  # exercise partial re-rendering from the cache
    text = state.render_text()
    reference = reference_text(state)
    assert samples(text) == samples(reference)
    assert sample_count(text) == sample_count(reference)
    assert text == reference  # and byte for byte
    assert state.render_openmetrics() == reference_openmetrics(state)
    parse_openmetrics((state.render_openmetrics() + b"# EOF\n").decode())


def test_many_series_across_blocks_with_removals_keep_prometheus_client_order() -> None:
    rng = random.Random(7)
    state = TrainerMetricState(flush_every=5, publish_interval=0.0)
    keys = [(f"ns-{i % 17}", f"{REF}-{i % 23}", state_) for i in range(400) for state_ in ("running",)]
    for step in range(3000):
        key = rng.choice(keys)
        state.on_jobs_gauge(key, rng.choice([0, 0, 1, 2, 3]))  # removals empty blocks, re-adds go last
        if step % 3 == 0:
            state.on_countable(created(step, ns=key[0], ref=key[1], nodes=rng.randint(0, 2000)))
        if step % 250 == 0:
            assert state.render_text() == reference_text(state)
    assert state.render_text() == reference_text(state)
    assert state.series_count == sum(len(f) for f in state.families)


def test_changed_series_are_rendered_at_most_once_per_publish_interval() -> None:
    """Under a firehose the counters move on many events: their series are re-rendered once per
    ``publish_interval`` (checked every ``flush_every`` changes), never per change; a scrape renders the
    rest."""
    now = [0.0]
    state = TrainerMetricState(flush_every=1, publish_interval=0.05, clock=lambda: now[0])
    state.render_text()  # a scrape asked for the text format: its chunks are kept rendered from now on
    pending = state.counter(CREATED)._dirty  # the series waiting for their next render
    state.on_countable(created(1, ns="ns"))
    assert not pending  # the first change after the interval: published at once
    for rv in range(2, 40):
        now[0] += 0.001
        state.on_countable(created(rv, ns="ns"))
    assert pending == {("ns", REF)}  # 38 changes within the interval: not rendered yet
    assert b'{namespace="ns",runtime_ref="%s"} 39' % REF.encode() in state.render_text()
    assert not pending
    state.on_countable(created(40, ns="ns"))
    assert pending  # a scrape does not start a new interval: still within the one published at 0
    now[0] = 0.06
    state.on_countable(created(41, ns="ns"))
    assert not pending


def test_gauge_moves_wait_for_the_next_publish_or_render_as_one_value_per_series() -> None:
    """A TrainJob's state change moves two gauge series: the moves are kept as each series' latest value
    and applied when a body is built or at the next publish (they count towards it like any change, the
    clock looked at every ``flush_every`` of them, at most once per ``publish_interval``), never per move."""
    now = [0.0]
    flush_every = 8
    state = TrainerMetricState(flush_every=flush_every, publish_interval=0.05, clock=lambda: now[0])
    first = state.render_text()
    key = ("ns", REF, "running")
    for count in range(1, 6):
        state.on_jobs_gauge(key, count)
    assert key not in state.trainjobs.values  # 5 moves, one waiting value, nothing rendered
    body = state.render_text()
    assert body is not first
    assert b'{namespace="ns",runtime_ref="%s",state="running"} 5' % REF.encode() in body
    assert not state.trainjobs._dirty
    state.on_jobs_gauge(key, 4)
    state.on_jobs_gauge(key, 5)  # moved back: the cached body still holds
    assert state.render_text() is body
    assert state.trainjobs.values[key] == 5  # 7 moves since the start

    # The moves reach flush_every: published (applied and rendered) without a scrape.
    state.on_jobs_gauge(key, 8)
    assert state.trainjobs.values[key] == 8
    assert not state.trainjobs._dirty
    # Within the publish interval they wait again, however many they are.
    for count in range(100, 100 + 3 * flush_every):
        now[0] += 0.0001
        state.on_jobs_gauge(key, count)
    assert state.trainjobs.values[key] == 8
    now[0] = 0.06
    for _ in range(flush_every):
        state.on_jobs_gauge(("other", REF, "running"), 1)
    assert state.trainjobs.values == {key: 99 + 3 * flush_every, ("other", REF, "running"): 1}
    # A counter's publish applies them too.
    state.on_jobs_gauge(key, 7)
    now[0] = 0.12
    for rv in range(flush_every):
        state.on_countable(created(rv, ns="ns"))
    assert state.trainjobs.values[key] == 7


def test_a_deferred_publish_runs_as_steps_of_its_own_a_budget_of_gauge_moves_each() -> None:
    """With ``defer_publish`` (the service's: app/kube/priority.py ``call_after_due_timers``) a due publish
    does not run inside the change that made it due, which under a watch firehose is an ingestion slice a
    due timer or a scrape waits for (bench P5): it is scheduled once, and applies the kept gauge moves
    ``_STEP_BUDGET`` per step, rescheduling itself until none is left; a render meanwhile applies all."""
    scheduled: list[Callable[[], None]] = []
    now = [0.0]
    state = TrainerMetricState(
        flush_every=1, publish_interval=0.05, clock=lambda: now[0], defer_publish=scheduled.append
    )
    state.render_text()
    moves = series_cache._STEP_BUDGET * 2 + 5
    for n in range(moves):
        state.on_jobs_gauge((f"ns-{n}", REF, "running"), 1)
    assert len(scheduled) == 1  # due at the first move, scheduled once however many follow
    assert not state.trainjobs.values  # nothing applied inside the moves
    steps = 0
    while scheduled:
        scheduled.pop()()
        steps += 1
        assert len(state.trainjobs.values) == min(moves, steps * series_cache._STEP_BUDGET)
    assert steps == 3 and not state.trainjobs._dirty  # the last step flushed what the moves rendered

    now[0] = 1.0
    for n in range(moves):
        state.on_jobs_gauge((f"ns-{n}", REF, "running"), 2)
    assert len(scheduled) == 1
    body = state.render_text()  # a scrape before the publish's steps: applies every move itself
    assert body.count(b',state="running"} 2') == moves
    scheduled.pop()()
    assert not scheduled and state.render_text() is body  # the late publish found nothing left


def test_a_deferred_publish_ends_after_its_step_limit_while_moves_keep_coming() -> None:
    """Under a firehose the moves may come in as fast as the steps take them: the publish flushes after
    ``_MAX_STEPS`` steps and leaves what is still kept for the next publish or render, so it ends."""
    scheduled: list[Callable[[], None]] = []
    state = TrainerMetricState(
        flush_every=1, publish_interval=10.0, clock=lambda: 0.0, defer_publish=scheduled.append
    )
    state.render_text()
    fresh = iter(range(10**6))
    for _ in range(series_cache._STEP_BUDGET + 1):
        state.on_jobs_gauge((f"ns-{next(fresh)}", REF, "running"), 1)
    steps = 0
    while scheduled:
        scheduled.pop()()
        steps += 1
        for _ in range(series_cache._STEP_BUDGET + 1):  # one more than a step takes
            state.on_jobs_gauge((f"ns-{next(fresh)}", REF, "running"), 1)
    assert steps == series_cache._MAX_STEPS
    assert state._pending_gauges  # left for the next publish
    body = state.render_text()  # which a render applies in full
    assert body.count(b'state="running"} 1') == next(fresh)
