"""A worker's copy of the paused set (:class:`PausedSet`): read at most once per
``every`` seconds whatever the number of steps asked about, kept through a store
outage, read again at once after this process paused or resumed."""

from __future__ import annotations

from pypepper_dramatiq.engine.pausing import PAUSE_READ_SECONDS, PausedSet, why_held
from pypepper_dramatiq.errors import StoreUnavailableError
from pypepper_dramatiq.records.pauses import CHANNEL, TASK
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore


class CountingStore(MemoryJobStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.down = False

    def paused(self) -> frozenset[tuple[str, str]]:
        self.reads += 1
        if self.down:
            raise StoreUnavailableError("down")
        return super().paused()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_many_steps_within_a_second_cost_one_read() -> None:
    store, clock = CountingStore(), Clock()
    pauses = PausedSet(lambda: store, clock=clock)
    for _ in range(1000):
        assert pauses.holds("emails", "send") is None
    assert store.reads == 1
    clock.now += PAUSE_READ_SECONDS - 0.01
    pauses.holds("emails", "send")
    assert store.reads == 1
    clock.now += 0.02
    pauses.holds("emails", "send")
    assert store.reads == 2


def test_a_pause_is_seen_after_the_bound_or_at_once_when_forgotten() -> None:
    store, clock = CountingStore(), Clock()
    pauses = PausedSet(lambda: store, clock=clock)
    assert pauses.holds("emails", "send") is None
    store.pause(TASK, "send", utcnow())
    assert pauses.holds("emails", "send") is None  # the copy is under a second old
    clock.now += PAUSE_READ_SECONDS
    assert pauses.holds("emails", "send") == "task send is paused"
    store.resume(TASK, "send")
    pauses.forget()
    assert pauses.holds("emails", "send") is None


def test_an_outage_keeps_the_last_copy() -> None:
    store, clock = CountingStore(), Clock()
    store.pause(CHANNEL, "emails", utcnow())
    pauses = PausedSet(lambda: store, clock=clock)
    assert pauses.holds("emails", None) == "channel emails is paused"
    store.down = True
    clock.now += PAUSE_READ_SECONDS
    assert pauses.holds("emails", None) == "channel emails is paused"
    assert store.reads == 2


def test_why_held_names_the_channel_before_the_task() -> None:
    pairs = frozenset({(CHANNEL, "a"), (TASK, "t")})
    assert why_held(pairs, "a", "t") == "channel a is paused"
    assert why_held(pairs, "b", "t") == "task t is paused"
    assert why_held(pairs, "b", None) is None
    assert why_held(pairs, "t", "a") is None  # a channel is no task, and back
