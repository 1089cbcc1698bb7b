"""LeaseElector unit tests: an in-memory Lease store and a virtual-time event loop.

The loop's clock only moves when every task is waiting, and then jumps straight to the next timer, so the
timing assertions (stop before takeover, takeover only after the lease duration) are exact and the whole file
runs in well under a second of real time. The elector's ``clock`` is the loop's clock, as in production
(``time.monotonic`` is what the default loop uses).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
import selectors
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from app.kube.elector import LeaseElector
from app.kube.elector_api import ElectorConfig
from app.kube.lease import LeaseRecord, MalformedLease, parse_lease
from app.kube.microtime import format_microtime, parse_microtime
from tests.support.election import Timeline

NS, NAME = "monitoring", "trainer-metrics"
WATERMARK = "trainer-metrics.kubeflow.org/watermark"

# Small but realistic proportions: duration > deadline > 1.2 x retry.
LEASE, DEADLINE, RETRY = 2.0, 1.0, 0.2


# --------------------------------------------------------------------------------------------------
# Virtual time
# --------------------------------------------------------------------------------------------------


class _VirtualSelector(selectors.DefaultSelector):
    """Instead of blocking for ``timeout``, advance the virtual clock by it (nothing else can happen)."""

    def __init__(self, loop_ref: list[VirtualTimeLoop]) -> None:
        super().__init__()
        self._loop_ref = loop_ref

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("virtual-time deadlock: every task waits and no timer is scheduled")
        if timeout > 0:
            self._loop_ref[0].vtime += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        ref: list[VirtualTimeLoop] = []
        self.vtime = 1000.0
        super().__init__(_VirtualSelector(ref))
        ref.append(self)

    def time(self) -> float:
        return self.vtime


def run_virtual(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(main())


def now() -> float:
    return asyncio.get_running_loop().time()


# --------------------------------------------------------------------------------------------------
# In-memory Lease API
# --------------------------------------------------------------------------------------------------


class FakeApiError(Exception):
    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(f"{status} {message}")
        self.status = status


@dataclass
class LeaseStore:
    """One Lease, with the API server's rules: RV preconditions (409), AlreadyExists, MicroTime syntax."""

    lease: dict[str, Any] | None = None
    rv: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    writes: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    conflicts: int = 0

    def get(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    def _validate(self, body: dict[str, Any]) -> None:
        spec = body.get("spec") or {}
        for key in ("acquireTime", "renewTime"):
            if key in spec:
                try:
                    parse_microtime(spec[key])
                except ValueError as exc:
                    raise FakeApiError(400, str(exc)) from None
                assert spec[key].endswith("Z") and len(spec[key]) == 27, spec[key]
        if spec.get("leaseDurationSeconds", 1) <= 0:
            raise FakeApiError(422, "leaseDurationSeconds must be > 0")

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self.lease = obj
        self.writes.append((now(), obj["spec"].get("holderIdentity", ""), copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self._validate(body)
        if self.lease is not None:
            self.conflicts += 1
            raise FakeApiError(409, "AlreadyExists")
        return self._stored(body)

    def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        self._validate(body)
        rv = body["metadata"].get("resourceVersion")
        if not rv:
            raise FakeApiError(422, "metadata.resourceVersion must be specified for an update")
        if self.lease is None:
            raise FakeApiError(404, "NotFound")
        if rv != self.lease["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise FakeApiError(409, "Conflict")
        return self._stored(body)

    def put_raw(self, lease: dict[str, Any]) -> None:
        """Write as another (possibly broken) client would, bypassing validation."""
        obj = copy.deepcopy(lease)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self.rv))
        self.lease = obj


class FakeLeaseClient:
    """One replica's view of the API: its own latency and faults over the shared store."""

    def __init__(self, store: LeaseStore, latency: float = 0.01) -> None:
        self.store = store
        self.latency = latency
        self.hang = False  # every call blocks forever (a stalled connection)
        self.errors: list[Exception] = []  # raised by the next calls, one each
        self.fail_all: Exception | None = None  # raised by every call while set
        self.calls = 0

    async def _call(self, fn: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        await asyncio.sleep(self.latency)
        if self.errors:
            raise self.errors.pop(0)
        if self.fail_all is not None:
            raise self.fail_all
        return fn()

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == (NS, NAME)
        return await self._call(self.store.get)

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        assert body["metadata"]["name"] == NAME and body["metadata"]["namespace"] == NS
        result = await self._call(lambda: self.store.create(body))
        assert result is not None
        return result

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        result = await self._call(lambda: self.store.replace(body))
        assert result is not None
        return result


# --------------------------------------------------------------------------------------------------
# Candidates and the leadership timeline
# --------------------------------------------------------------------------------------------------


class Candidate:
    def __init__(
        self,
        identity: str,
        store: LeaseStore,
        timeline: Timeline,
        *,
        release_on_cancel: bool = True,
        latency: float = 0.01,
        annotations: Callable[[], dict[str, str]] | None = None,
        lease: float = LEASE,
        takeover_delay: float = 0.0,
    ) -> None:
        self.identity = identity
        self.timeline = timeline
        self.client = FakeLeaseClient(store, latency)
        self.new_leaders: list[str | None] = []
        self.transition_hook: list[bool] = []
        self.elector = LeaseElector(
            self.client,
            ElectorConfig(NAME, NS, identity, lease, DEADLINE, RETRY, release_on_cancel=release_on_cancel),
            self,
            annotations=annotations,
            clock=lambda: asyncio.get_running_loop().time(),
            on_transition=self.transition_hook.append,
            takeover_delay=(lambda record: takeover_delay) if takeover_delay else None,
        )
        self.task: asyncio.Task[None] | None = None

    def on_started_leading(self, previous: LeaseRecord | None) -> None:
        self.timeline.started(self.identity, previous)

    def on_stopped_leading(self) -> None:
        self.timeline.stopped(self.identity)

    def on_new_leader(self, identity: str | None) -> None:
        self.new_leaders.append(identity)

    def start(self) -> Candidate:
        self.task = asyncio.create_task(self.elector.run(), name=self.identity)
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task
        assert self.task.cancelled()


async def wait_until(cond: Callable[[], bool], timeout: float = 30.0, step: float = 0.01) -> None:
    deadline = now() + timeout
    while not cond():
        assert now() < deadline, "condition not reached in time"
        await asyncio.sleep(step)


def spec_of(store: LeaseStore) -> dict[str, Any]:
    assert store.lease is not None
    spec: dict[str, Any] = store.lease["spec"]
    return spec


def held_lease(holder: str, *, duration: int = 2, transitions: int = 3, **extra_spec: Any) -> dict[str, Any]:
    t = format_microtime(datetime.now(UTC))
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration,
        "acquireTime": t,
        "renewTime": t,
        "leaseTransitions": transitions,
    }
    spec.update(extra_spec)
    meta = {"name": NAME, "namespace": NS}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


# --------------------------------------------------------------------------------------------------
# MicroTime, parsing, configuration
# --------------------------------------------------------------------------------------------------


def test_microtime_always_has_six_fraction_digits() -> None:
    assert format_microtime(datetime(2025, 3, 1, 10, 0, 0, tzinfo=UTC)) == "2025-03-01T10:00:00.000000Z"
    assert format_microtime(datetime(2025, 3, 1, 10, 0, 0, 7, tzinfo=UTC)) == "2025-03-01T10:00:00.000007Z"
    # naive means UTC (never local time: kubernetes_asyncio's bug)
    assert format_microtime(datetime(2025, 3, 1, 10, 0, 0)) == "2025-03-01T10:00:00.000000Z"


def test_microtime_parse_accepts_offsets_and_rejects_other_layouts() -> None:
    expected = datetime(2025, 3, 1, 10, 5, 2, 123456, tzinfo=UTC)
    assert parse_microtime("2025-03-01T10:05:02.123456Z") == expected
    assert parse_microtime("2025-03-01T10:05:02.123456+00:00") == expected
    assert parse_microtime("2025-03-01T12:05:02.123456+02:00") == expected
    for bad in ("2025-03-01T10:05:02Z", "2025-03-01T10:05:02.123Z", "2025-03-01 10:05:02.123456Z", "", "x"):
        with pytest.raises(ValueError):
            parse_microtime(bad)
    round_trip = format_microtime(parse_microtime("2025-03-01T12:05:02.000000+02:00"))
    assert round_trip == "2025-03-01T10:05:02.000000Z"


def test_parse_lease_defaults_and_malformed_fields() -> None:
    rec = parse_lease({"metadata": {"resourceVersion": "7", "annotations": {WATERMARK: "42", "x": 1}}})
    assert rec == LeaseRecord("", 0, None, None, 0, {WATERMARK: "42"}, "7")
    for spec in (
        {"leaseDurationSeconds": "15"},
        {"leaseDurationSeconds": 1.5},
        {"leaseDurationSeconds": True},
        {"holderIdentity": 7},
        {"renewTime": "2025-03-01T10:05:02Z"},
        {"leaseTransitions": "1"},
    ):
        with pytest.raises(MalformedLease):
            parse_lease({"metadata": {}, "spec": spec})
    bad_objects: list[Any] = [[], {"spec": {}}, {"metadata": {}, "spec": "nope"}]
    for obj in bad_objects:
        with pytest.raises(MalformedLease):
            parse_lease(obj)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"identity": ""}, "identity must not be empty"),
        ({"lease_duration": 10, "renew_deadline": 10}, "lease_duration must be greater"),
        ({"renew_deadline": 2.4, "retry_period": 2}, "renew_deadline must be greater than 1.2"),
        ({"retry_period": 0}, "retry_period must be a positive number"),
        ({"lease_duration": float("inf")}, "lease_duration must be a positive number"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"lease_name": NAME, "lease_namespace": NS, "identity": "a"}
    with pytest.raises(ValueError, match=message):
        ElectorConfig(**(base | kwargs))


def test_config_writes_whole_seconds_rounded_up() -> None:
    assert ElectorConfig(NAME, NS, "a", 1.5, 1.0, 0.2).lease_duration_seconds == 2
    assert ElectorConfig(NAME, NS, "a").lease_duration_seconds == 15


# --------------------------------------------------------------------------------------------------
# Election behaviour
# --------------------------------------------------------------------------------------------------


def test_single_candidate_creates_and_keeps_the_lease() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl, annotations=lambda: {WATERMARK: "17"}).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        assert tl.intervals[0][3] is None  # created the Lease: nothing taken over
        spec = spec_of(store)
        assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 2
        assert spec["leaseTransitions"] == 0
        first_acquire = spec["acquireTime"]
        await asyncio.sleep(5 * LEASE)
        spec = spec_of(store)
        assert tl.leaders() == ["a"] and len(tl.intervals) == 1
        assert spec["acquireTime"] == first_acquire and spec["leaseTransitions"] == 0
        assert spec["renewTime"] > first_acquire
        assert store.lease is not None and store.lease["metadata"]["annotations"] == {WATERMARK: "17"}
        # renews every retry period (fast path: one PUT, no GET)
        assert len(store.writes) >= 5 * LEASE / (RETRY + 0.011) - 2
        st = a.elector.status()
        assert (st.is_leader, st.holder, st.lease_transitions, st.transitions_seen) == (True, "a", 0, 1)
        assert st.annotations == {WATERMARK: "17"} and st.last_change is not None
        assert a.new_leaders[-1] == "a" and a.transition_hook == [True]
        await a.stop()
        assert tl.leaders() == [] and a.transition_hook == [True, False]
        spec = spec_of(store)
        assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
        assert spec["leaseTransitions"] == 0

    run_virtual(main)


@pytest.mark.parametrize("n", [2, 3])
def test_several_candidates_exactly_one_leader_through_handovers(n: int) -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        cands = [Candidate(f"c{i}", store, tl, latency=0.003 * (i + 1)).start() for i in range(n)]

        async def sampler() -> None:
            while True:
                assert len(tl.leaders()) <= 1, tl.leaders()
                await asyncio.sleep(0.01)

        sampling = asyncio.create_task(sampler())
        await wait_until(lambda: len(tl.leaders()) == 1)
        await asyncio.sleep(3 * LEASE)
        assert len(tl.intervals) == 1  # nobody steals a healthy lease
        # hand over n-1 times: graceful stop, then a killed leader
        alive = list(cands)
        for round_ in range(n - 1):
            leader = next(c for c in alive if c.identity == tl.leaders()[0])
            if round_ == 1:
                leader.client.fail_all = FakeApiError(503)  # dies without a release
            await leader.stop()
            alive.remove(leader)
            await wait_until(lambda: len(tl.leaders()) == 1)
            await asyncio.sleep(LEASE)
        assert not sampling.done()
        sampling.cancel()
        tl.assert_no_overlap()
        transitions = [w[2]["spec"]["leaseTransitions"] for w in store.writes if w[1]]
        assert transitions == sorted(transitions) and transitions[-1] == n - 1
        for c in alive:
            await c.stop()

    run_virtual(main)


def test_racing_candidates_conflict_and_one_wins() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        # identical latency: all three GET 404 and POST at the same instant
        cands = [Candidate(f"c{i}", store, tl, latency=0.01).start() for i in range(3)]
        await wait_until(lambda: len(tl.leaders()) == 1)
        assert store.conflicts == 2
        await asyncio.sleep(2 * LEASE)
        assert len(tl.intervals) == 1
        # all of them agree on the holder
        for c in cands:
            assert c.new_leaders[-1] == tl.leaders()[0]
        # a released Lease is raced for too: again exactly one winner (409 for the others' PUTs)
        leader = next(c for c in cands if c.identity == tl.leaders()[0])
        await leader.stop()
        await wait_until(lambda: len(tl.leaders()) == 1)
        await asyncio.sleep(LEASE)
        tl.assert_no_overlap()
        for c in cands:
            if c is not leader:
                await c.stop()

    run_virtual(main)


def test_graceful_release_hands_over_within_a_retry_period() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl, annotations=lambda: {WATERMARK: "99"}).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        b = Candidate("b", store, tl).start()
        await asyncio.sleep(LEASE)
        stop_at = now()
        await a.stop()
        assert tl.intervals[0][2] == pytest.approx(stop_at)  # stopped before the release PUT returned
        await wait_until(lambda: tl.leaders() == ["b"])
        b_interval = tl.intervals[1]
        # JitterUntil sleeps retry * [1, 2.2]; plus the GET and PUT latencies
        assert b_interval[1] - stop_at <= (1 + 1.2) * RETRY + 0.1
        previous: LeaseRecord = b_interval[3]
        assert previous.holder_identity == "" and previous.annotations[WATERMARK] == "99"
        assert spec_of(store)["leaseTransitions"] == 1
        tl.assert_no_overlap()
        await b.stop()

    run_virtual(main)


def test_release_with_a_stale_cached_lease_rereads_and_still_releases() -> None:
    """A renew cut short by the shutdown can reach the server while its answer is lost: the leader's cached
    resourceVersion is then stale and the release PUT conflicts. It reads the Lease again and, still the
    holder, releases it, so a follower takes over within a retry period instead of a lease duration."""

    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        b = Candidate("b", store, tl).start()
        await asyncio.sleep(LEASE)
        # The server has a newer version of a's own Lease than a has seen (same holder, new RV).
        lease = store.get()
        assert lease is not None
        store.put_raw(lease)
        conflicts_before = store.conflicts
        stop_at = now()
        await a.stop()
        assert store.conflicts == conflicts_before + 1  # the first release PUT conflicted
        assert spec_of(store)["holderIdentity"] == ""  # ... and the second one released it
        await wait_until(lambda: tl.leaders() == ["b"])
        assert tl.intervals[1][1] - stop_at <= (1 + 1.2) * RETRY + 0.1
        tl.assert_no_overlap()
        await b.stop()

    run_virtual(main)


def test_killed_leader_is_replaced_only_after_the_lease_duration() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl, release_on_cancel=False).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        b = Candidate("b", store, tl).start()
        await asyncio.sleep(LEASE)
        await a.stop()  # no release: the Lease still names a
        last_renew_written = max(t for t, holder, _ in store.writes if holder == "a")
        assert spec_of(store)["holderIdentity"] == "a"
        await wait_until(lambda: tl.leaders() == ["b"])
        taken = tl.intervals[1][1]
        assert taken >= last_renew_written + LEASE
        # b saw that record at its next poll, and takes over at the first poll after it expired
        assert taken <= last_renew_written + LEASE + 2 * (2.2 * RETRY + 0.02)
        previous: LeaseRecord = tl.intervals[1][3]
        assert previous.holder_identity == "a"
        assert spec_of(store)["leaseTransitions"] == 1 and b.new_leaders[-1] == "b"
        await b.stop()

    run_virtual(main)


@pytest.mark.parametrize("seed", range(8))
def test_a_deferring_candidate_lets_the_others_take_a_dead_leaders_lease_first(seed: int) -> None:
    """A candidate with a takeover delay (its journal cannot replay what the dead leader left: app/handover/
    coverage.py) loses the race to one without, whatever the jitter; without the delay either may win."""

    async def main() -> None:
        random.seed(seed)
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl, release_on_cancel=False).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        cold = Candidate("cold", store, tl, takeover_delay=3 * RETRY).start()
        warm = Candidate("warm", store, tl).start()
        await asyncio.sleep(LEASE)
        await a.stop()
        await wait_until(lambda: len(tl.intervals) == 2)
        assert [i[0] for i in tl.intervals] == ["a", "warm"]
        await wait_until(lambda: cold.new_leaders[-1] == "warm")  # and it follows, not competes
        await warm.stop()
        await cold.stop()

    run_virtual(main)


@pytest.mark.parametrize("released", [False, True], ids=["killed", "released"])
def test_a_deferring_candidate_alone_takes_over_its_delay_after_the_lease_became_free(released: bool) -> None:
    """The delay postpones a takeover, never prevents one: with nobody else, the deferring candidate leads
    its delay after the Lease became free: released, or expired by its clock a lease duration after the
    dead holder's last renew."""

    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl, release_on_cancel=released).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        delay = 3 * RETRY
        cold = Candidate("cold", store, tl, takeover_delay=delay).start()
        await asyncio.sleep(LEASE)
        await a.stop()
        if released:
            assert store.writes[-1][1] == ""
            free = store.writes[-1][0]
        else:
            free = max(t for t, holder, _ in store.writes if holder == "a") + LEASE
        await wait_until(lambda: tl.leaders() == ["cold"])
        taken = tl.intervals[1][1]
        assert free + delay <= taken <= free + delay + 2 * (2.2 * RETRY + 0.02)
        await cold.stop()

    run_virtual(main)


def test_hung_api_calls_stop_the_leader_before_the_follower_may_take_over() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        b = Candidate("b", store, tl).start()
        await asyncio.sleep(LEASE + 0.05)

        # a's connection stalls: requests in flight and new ones never answer
        sent: list[float] = []
        orig_replace = a.client.replace

        async def recording_replace(namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
            sent.append(now())
            return await orig_replace(namespace, name, body)

        a.client.replace = recording_replace  # type: ignore[method-assign]
        await asyncio.sleep(0.5)
        a.client.hang = True
        last_good_renew_sent = sent[-1] if sent else None
        await wait_until(lambda: tl.leaders() != ["a"])
        a_stop = tl.intervals[0][2]
        assert last_good_renew_sent is not None
        # a stops no later than renew_deadline after sending its last successful renew …
        assert a_stop <= last_good_renew_sent + DEADLINE + 1e-6
        await wait_until(lambda: tl.leaders() == ["b"])
        # … which is before b, judging by its own observation, may take the Lease
        b_start = tl.intervals[1][1]
        assert b_start >= a_stop + (LEASE - DEADLINE) - 0.05
        tl.assert_no_overlap()
        # a stays a (hung) candidate; it never leads again while hung
        await asyncio.sleep(3 * LEASE)
        assert tl.leaders() == ["b"] and not a.task.done()  # type: ignore[union-attr]
        a.client.hang = False
        await asyncio.sleep(3 * LEASE)
        assert tl.leaders() == ["b"]
        assert a.elector.status().holder == "b"
        await a.stop()
        await b.stop()

    run_virtual(main)


def test_cancel_with_hung_release_is_bounded_by_renew_deadline() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        a.client.hang = True
        t0 = now()
        await a.stop()
        assert tl.leaders() == [] and tl.intervals[0][2] == pytest.approx(t0)
        assert now() - t0 <= DEADLINE + 1e-6

    run_virtual(main)


def test_transient_429_and_5xx_during_renew_are_ridden_out() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        # a burst of failures shorter than the renew deadline: leadership survives
        a.client.errors = [FakeApiError(429), FakeApiError(500), FakeApiError(503), FakeApiError(504)]
        await asyncio.sleep(LEASE)
        assert not a.client.errors and len(tl.intervals) == 1 and tl.leaders() == ["a"]
        # other exception types than the API's own are failed attempts too
        a.client.errors = [ConnectionResetError("reset"), TimeoutError(), ValueError("bad json")]
        await asyncio.sleep(LEASE)
        assert len(tl.intervals) == 1 and tl.leaders() == ["a"]

        # a lasting outage: stop within the renew deadline, re-acquire (own Lease) when it ends
        a.client.fail_all = FakeApiError(503)
        t0 = now()
        await wait_until(lambda: tl.leaders() == [])
        assert tl.intervals[0][2] - t0 <= DEADLINE + RETRY
        assert a.elector.status().is_leader is False
        await asyncio.sleep(DEADLINE)  # let the (failing) release attempt finish first
        a.client.fail_all = None
        await wait_until(lambda: tl.leaders() == ["a"])
        assert spec_of(store)["holderIdentity"] == "a"
        assert spec_of(store)["leaseTransitions"] == 0  # same holder again: not a transition
        assert a.elector.transitions_seen == 3
        await a.stop()

    run_virtual(main)


def test_lease_deleted_under_the_leader_is_recreated_without_a_gap() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        await asyncio.sleep(LEASE)
        acquire = spec_of(store)["acquireTime"]
        store.lease = None  # kubectl delete lease
        await asyncio.sleep(LEASE)
        assert store.lease is not None and spec_of(store)["holderIdentity"] == "a"
        assert spec_of(store)["acquireTime"] == acquire and spec_of(store)["leaseTransitions"] == 0
        assert len(tl.intervals) == 1 and tl.leaders() == ["a"]
        await a.stop()

    run_virtual(main)


def test_lease_deleted_while_its_leader_is_cut_off_is_recreated_only_after_expiry() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl, annotations=lambda: {WATERMARK: "7"}).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        b = Candidate("b", store, tl).start()
        await asyncio.sleep(LEASE)
        a.client.hang = True  # a cannot recreate it and does not know it is gone
        deleted_at = now()
        store.lease = None
        await wait_until(lambda: tl.leaders() == ["b"])
        # b treats the last record it saw as in force for a lease duration after it noticed the deletion
        # (client-go would create at once, while a may still be leading)
        assert tl.intervals[1][1] >= deleted_at + LEASE
        assert tl.intervals[1][1] <= deleted_at + LEASE + 2 * (2.2 * RETRY + 0.02)
        previous: LeaseRecord = tl.intervals[1][3]
        assert previous.holder_identity == "a" and previous.annotations == {WATERMARK: "7"}
        tl.assert_no_overlap()
        a.client.hang = False
        await asyncio.sleep(2 * LEASE)
        assert tl.leaders() == ["b"]
        await a.stop()
        await b.stop()

    run_virtual(main)


@pytest.mark.parametrize(
    "bad_spec",
    [
        {"leaseDurationSeconds": "15"},
        {"leaseDurationSeconds": 2.5},
        {"renewTime": "2025-03-01T10:05:02Z"},
        {"acquireTime": 12},
        {"holderIdentity": ["x"]},
        {"leaseTransitions": None, "leaseDurationSeconds": {}},
    ],
)
def test_malformed_lease_is_respected_for_a_lease_duration_then_overwritten(bad_spec: dict[str, Any]) -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        store.put_raw(held_lease("ghost", **bad_spec))
        a = Candidate("a", store, tl).start()
        await asyncio.sleep(0.05)
        first_seen = now()
        await wait_until(lambda: tl.leaders() == ["a"])
        # unreadable: treated as held, for one (our) lease duration since it was last seen to change
        assert tl.intervals[0][1] >= first_seen + LEASE - 0.1
        assert tl.intervals[0][3] is None
        spec = spec_of(store)
        assert parse_lease(store.lease).holder_identity == "a" and spec["leaseDurationSeconds"] == 2
        await a.stop()

    run_virtual(main)


def test_malformed_lease_written_under_the_leader_stops_it_safely() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        await asyncio.sleep(0.5)
        broken = copy.deepcopy(store.lease)
        assert broken is not None
        broken["spec"]["leaseDurationSeconds"] = "forever"
        corrupted_at = now()
        store.put_raw(broken)
        await wait_until(lambda: tl.leaders() == [])
        assert tl.intervals[0][2] - corrupted_at <= DEADLINE + 0.01
        assert a.elector.status().holder is None
        await wait_until(lambda: tl.leaders() == ["a"])
        assert tl.intervals[1][1] - corrupted_at >= LEASE - 0.05
        assert parse_lease(store.lease).lease_transitions == 1  # unreadable holder: counted as a transition
        await a.stop()

    run_virtual(main)


@pytest.mark.parametrize(
    "lease",
    [
        {"metadata": {"name": NAME, "namespace": NS}},  # no spec: an empty (free) spec
        {"metadata": {"name": NAME, "namespace": NS}, "spec": {"holderIdentity": "ghost"}},  # no duration
    ],
)
def test_lease_without_spec_fields_is_free(lease: dict[str, Any]) -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        store.put_raw(lease)
        a = Candidate("a", store, tl).start()
        await wait_until(lambda: tl.leaders() == ["a"], timeout=0.5)
        assert spec_of(store)["leaseTransitions"] == 1
        await a.stop()

    run_virtual(main)


def test_annotations_are_merged_and_published_on_every_write() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        lease = held_lease("", duration=1)
        lease["metadata"]["annotations"] = {"team": "ml", WATERMARK: "1"}
        lease["metadata"]["labels"] = {"app": "trainer-metrics"}
        lease["spec"]["strategy"] = "OldestEmulationVersion"
        store.put_raw(lease)
        watermark = [5]
        a = Candidate("a", store, tl, annotations=lambda: {WATERMARK: str(watermark[0])}).start()
        await wait_until(lambda: tl.leaders() == ["a"])
        previous: LeaseRecord = tl.intervals[0][3]
        assert previous.annotations == {"team": "ml", WATERMARK: "1"}
        assert store.lease is not None
        assert store.lease["metadata"]["annotations"] == {"team": "ml", WATERMARK: "5"}
        assert store.lease["metadata"]["labels"] == {"app": "trainer-metrics"}  # PUT keeps the rest
        assert store.lease["spec"]["strategy"] == "OldestEmulationVersion"
        watermark[0] = 9
        await asyncio.sleep(2 * RETRY)
        assert store.lease["metadata"]["annotations"][WATERMARK] == "9"
        watermark[0] = 12
        await a.stop()
        assert store.lease["metadata"]["annotations"] == {"team": "ml", WATERMARK: "12"}
        assert store.lease["spec"]["holderIdentity"] == ""

    run_virtual(main)


def test_failing_callbacks_and_annotation_provider_do_not_break_the_election() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()

        def boom() -> dict[str, str]:
            raise RuntimeError("watermark provider bug")

        a = Candidate("a", store, tl, annotations=boom)

        def bad_started(previous: LeaseRecord | None) -> None:
            tl.started("a", previous)
            raise RuntimeError("callback bug")

        def bad_new_leader(identity: str | None) -> None:
            raise RuntimeError("callback bug")

        a.on_started_leading = bad_started  # type: ignore[method-assign]
        a.on_new_leader = bad_new_leader  # type: ignore[method-assign]
        a.start()
        await wait_until(lambda: tl.leaders() == ["a"])
        await asyncio.sleep(LEASE)
        assert len(tl.intervals) == 1 and spec_of(store)["holderIdentity"] == "a"
        await a.stop()
        assert tl.leaders() == []

    run_virtual(main)


def test_run_only_ever_raises_cancelled_error() -> None:
    async def main() -> None:
        store, tl = LeaseStore(), Timeline()
        a = Candidate("a", store, tl)
        a.client.fail_all = RuntimeError("anything at all")
        a.start()
        await asyncio.sleep(2 * LEASE)
        assert a.task is not None and not a.task.done()
        assert tl.intervals == []
        await a.stop()
        assert a.client.calls > 5

    run_virtual(main)
