"""ServedLedger: the watermark a leader publishes covers what a scrape has shown to every scraper, not what
it counted (app/handover/served.py). Clock injected; a "scrape" is a served render of the metric state."""

from __future__ import annotations

import asyncio
import signal
from types import SimpleNamespace

import msgspec
import pytest
import uvicorn

from app.handover.journal import CountJournal
from app.handover.served import ServedLedger
from app.metrics.counted import CREATED
from app.metrics.trainer_metrics import TrainerMetricState
from app.serving.graceful import HandOverOnExit
from app.trainer.events import CountableEvent
from tests.metrics.helpers import created, finished

HOLD = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def pipeline(
    hold: float = HOLD, *, max_tracked: int = 1000, by_namespace: bool = False
) -> tuple[CountJournal, ServedLedger, TrainerMetricState, Clock]:
    clock = Clock()
    state = TrainerMetricState(zero_hold=hold, clock=clock)

    def stream_of(event: CountableEvent) -> str:
        return event.namespace if by_namespace else ""

    ledger = ServedLedger(state, hold=hold, stream_of=stream_of, max_tracked=max_tracked, clock=clock)
    journal = CountJournal(ledger, journal_size=1000, stream_of=stream_of)
    return journal, ledger, state, clock


def served(journal: CountJournal, ledger: ServedLedger) -> dict[str, int]:
    return ledger.watermarks(journal.watermarks)


def test_a_count_is_handed_over_once_a_render_showed_it_and_the_hold_passed() -> None:
    journal, ledger, state, clock = pipeline()
    journal.start_leading(100)
    state.render_text()  # an old label set: born and released before the event
    journal.on_countable(created(101))
    clock.now += HOLD
    state.render_text()
    assert journal.watermarks == {"": 101}
    assert served(journal, ledger) == {"": 100}  # counted, not shown yet (its series was born at zero)
    clock.now += HOLD
    state.render_text()  # released: this render shows it
    assert served(journal, ledger) == {"": 100}
    clock.now += HOLD - 0.001
    assert served(journal, ledger) == {"": 100}  # a scraper with interval == hold may not have seen it
    clock.now += 0.001
    assert served(journal, ledger) == {"": 101}
    assert ledger.all_seen()


def test_an_event_in_a_shown_series_is_not_delayed_by_a_newer_series() -> None:
    journal, ledger, state, clock = pipeline()
    journal.start_leading(0)
    journal.on_countable(created(10, ns="old"))
    state.render_text()
    clock.now += HOLD
    state.render_text()
    clock.now += HOLD
    assert served(journal, ledger) == {"": 10}
    journal.on_countable(created(11, ns="new"))  # a new series: shown as 0 until its hold ends
    journal.on_countable(created(12, ns="old"))  # its series is shown: the next render shows it
    state.render_text()
    clock.now += HOLD
    assert ledger.unseen == 1  # rv 12 was seen; rv 11 waits for its series' release
    assert served(journal, ledger) == {"": 10}  # the watermark is a prefix: below rv 11
    state.render_text()  # releases the new series
    clock.now += HOLD
    assert served(journal, ledger) == {"": 12}


def test_an_edge_a_relist_found_holds_the_watermark_at_the_gap_until_it_is_seen() -> None:
    """A relist found the edge on the job as listed at rv 150; it happened after the rv the informer held
    before the gap (since 110). Another replica's watch saw it at its own rv, as low as 111: until a scrape
    has shown this count, the watermark must not pass 110, or that replica skips the edge as counted."""
    journal, ledger, state, clock = pipeline()
    journal.start_leading(100)
    state.render_text()
    journal.on_countable(created(110))
    for _ in range(3):
        state.render_text()
        clock.now += HOLD
    assert served(journal, ledger) == {"": 110}
    journal.on_countable(msgspec.structs.replace(created(150, uid="relisted"), since=110))
    assert served(journal, ledger) == {"": 110}
    state.render_text()
    clock.now += HOLD - 0.001
    assert served(journal, ledger) == {"": 110}
    clock.now += 0.001
    assert served(journal, ledger) == {"": 150}


def test_nothing_is_seen_without_a_scrape() -> None:
    journal, ledger, _, clock = pipeline()
    journal.start_leading(5)
    for rv in range(6, 20):
        journal.on_countable(finished(rv))
    clock.now += 100 * HOLD
    assert served(journal, ledger) == {"": 5}
    assert ledger.unseen == 14 and not ledger.all_seen()


def test_hold_zero_counts_the_render_itself() -> None:
    journal, ledger, state, _ = pipeline(hold=0.0)
    journal.start_leading(0)
    journal.on_countable(created(1))
    state.render_text()  # shows the new series at 0
    assert served(journal, ledger) == {"": 0}
    state.render_text()  # shows its value: seen by the one scraper at once
    assert served(journal, ledger) == {"": 1}


def test_watermarks_are_per_stream() -> None:
    journal, ledger, state, clock = pipeline(by_namespace=True)
    journal.start_leading({"team-a": 10, "team-b": 20})
    state.render_text()
    journal.on_countable(created(11, ns="team-a"))
    journal.on_countable(created(21, ns="team-b"))
    for _ in range(3):
        state.render_text()
        clock.now += HOLD
    assert served(journal, ledger) == {"team-a": 11, "team-b": 21}
    journal.on_countable(created(12, ns="team-a"))
    assert served(journal, ledger) == {"team-a": 11, "team-b": 21}


def test_a_new_term_forgets_the_previous_terms_events() -> None:
    journal, ledger, state, _ = pipeline()
    journal.start_leading(0)
    journal.on_countable(created(1))
    journal.stop_leading(seen=served(journal, ledger))
    state.reset_counts()
    ledger.start_term()
    journal.start_leading(0)  # the event was counted and never shown: this term counts it again
    assert ledger.unseen == 1
    assert state.counter(CREATED).values == {("team-a", created(1).runtime_ref): 1}


def test_an_entry_a_scrape_showed_is_not_shown_again_by_a_later_term() -> None:
    """Term 1 counts rv 1 (shown to every scraper) and rv 2 (never shown). A later term of the same replica
    with a floor below both counts rv 2 again (its first count died with term 1's series), never rv 1."""
    journal, ledger, state, _clock = pipeline(hold=0.0)
    journal.start_leading(0)
    journal.on_countable(created(1))
    state.render_text()
    state.render_text()
    journal.on_countable(created(2))
    journal.stop_leading(seen=served(journal, ledger))
    state.reset_counts()
    ledger.start_term()
    assert journal.start_leading(0) == 1
    assert sum(state.counter(CREATED).values.values()) == 1


def test_too_many_unseen_events_keep_the_watermark_below_them_until_a_render_shows_them_all() -> None:
    """Forgotten over ``max_tracked`` (a take-over replaying a full journal, a burst while scrapes lag), the
    events hold the watermark below them until the first render in which none of their series is held
    shows them all, and the hold passes: not for the rest of the term, or the next leader would count again
    what the scrapes showed."""
    journal, ledger, state, clock = pipeline(max_tracked=5)
    journal.start_leading(0)
    for rv in range(1, 8):
        journal.on_countable(created(rv))  # one new series, held at zero: rv 1-6 forgotten parked in it
    assert served(journal, ledger) == {"": 0}
    state.render_text()  # shows the series at zero: nothing forgotten is shown yet
    clock.now += 100 * HOLD
    assert served(journal, ledger) == {"": 0}
    state.render_text()  # releases the series: shows rv 1-7
    clock.now += HOLD - 0.001
    assert served(journal, ledger) == {"": 0}
    clock.now += 0.001
    assert served(journal, ledger) == {"": 7}
    assert ledger.all_seen()


def test_forgotten_events_of_a_series_still_held_keep_the_watermark_down() -> None:
    journal, ledger, state, clock = pipeline(max_tracked=2)
    journal.start_leading(0)
    state.render_text()
    journal.on_countable(created(1, ns="old"))
    for _ in range(2):
        state.render_text()
        clock.now += HOLD
    assert served(journal, ledger) == {"": 1}
    journal.on_countable(created(2, ns="old"))
    journal.on_countable(created(3, ns="new"))  # held at zero
    journal.on_countable(created(4, ns="old"))  # over max_tracked: rv 2-4 forgotten
    state.render_text()  # shows rv 2 and 4, not rv 3: its series is still held
    clock.now += 100 * HOLD
    assert served(journal, ledger) == {"": 1}
    state.render_text()  # releases "new": every forgotten event is shown
    clock.now += HOLD
    assert served(journal, ledger) == {"": 4}


def test_the_hold_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="hold"):
        ServedLedger(TrainerMetricState(), hold=-1.0, stream_of=lambda e: "")


async def test_wait_change_returns_at_the_next_render() -> None:
    _journal, ledger, state, _ = pipeline()
    waiter = asyncio.create_task(ledger.wait_change(5.0))
    await asyncio.sleep(0)
    state.render_text()
    await asyncio.wait_for(waiter, 1.0)
    assert ledger.last_render is not None


class _FakeService:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.handed_over = False

    async def hand_over(self) -> bool:
        await self.release.wait()
        self.handed_over = True
        return True


async def test_the_first_sigterm_hands_over_before_the_server_shuts_down() -> None:
    """app/serving/graceful.py: uvicorn would stop serving at once; the first signal runs Service.hand_over()
    with the server still up, and only then lets uvicorn exit (re-raising the signal at the end, as usual); a
    second signal during the wait exits at once."""

    class Server(HandOverOnExit, uvicorn.Server):
        pass

    service = _FakeService()
    app = SimpleNamespace(state=SimpleNamespace(service=service))
    server = Server(uvicorn.Config(app, lifespan="off"))
    server.handle_exit(signal.SIGTERM, None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert server._hand_over_task is not None and not server.should_exit  # still serving: handing over
    service.release.set()
    await server._hand_over_task
    assert service.handed_over and server.should_exit
    assert server._captured_signals == [signal.SIGTERM]

    impatient = Server(uvicorn.Config(SimpleNamespace(state=SimpleNamespace(service=_FakeService()))))
    impatient.handle_exit(signal.SIGTERM, None)
    await asyncio.sleep(0)
    impatient.handle_exit(signal.SIGTERM, None)  # a second signal: no more waiting
    assert impatient.should_exit
    assert impatient._hand_over_task is not None
    impatient._hand_over_task.cancel()
