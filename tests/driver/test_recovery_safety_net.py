"""The safety nets of recovery for steps no lease covers, against a real Redis.

* a Scheduled row whose first message is gone from the broker gets a new one;
* a delayed step message stranded in a live worker's ack set is put back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from queue import PriorityQueue
from types import SimpleNamespace
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker

from pypepper_dramatiq import JobRecord, Status, set_job_store
from pypepper_dramatiq.channels.messages import DISPATCH_KEY, STEP_ACTOR, StepMessage, dispatch_of
from pypepper_dramatiq.drivers.dramatiq.orphans import AckKeeper
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.base import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore

pytestmark = pytest.mark.redis

QUEUE = "safety"


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    """A Redis broker in a namespace of its own (nothing else sees its keys)."""
    broker = RedisBroker(url=redis_url, namespace=f"t-{uuid.uuid4().hex[:8]}")  # type: ignore[no-untyped-call]
    broker.declare_queue(QUEUE)
    yield broker
    keys = broker.client.keys(f"{broker.namespace}:*")
    if keys:
        broker.client.delete(*keys)
    broker.close()


def _scheduled(store: MemoryJobStore, *, age: float, dispatch: dict[str, Any] | None) -> JobRecord:
    when = utcnow() - timedelta(seconds=age)
    state = {} if dispatch is None else {DISPATCH_KEY: dispatch}
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id=QUEUE,
        status=Status.SCHEDULED,
        created=when,
        updated=when,
        state=state,
    )
    assert store.put(record)
    stored = store.get(record.id)
    assert stored is not None
    return stored


def _queued_job_ids(broker: RedisBroker, queue: str = QUEUE) -> list[str]:
    ids = broker.client.lrange(f"{broker.namespace}:{queue}", 0, -1)
    data = broker.client.hmget(f"{broker.namespace}:{queue}.msgs", ids) if ids else []
    return [StepMessage.from_message(Message.decode(raw)).job_id for raw in data]


def test_a_scheduled_job_whose_message_is_gone_gets_a_new_one(broker: RedisBroker) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    sweeper = RecoverySweeper(broker, "me", lease_seconds=1, interval=1, dispatch_seconds=10)

    live_message = broker.enqueue(StepMessage("x", Position()).to_message(QUEUE))
    alive = _scheduled(store, age=60, dispatch=dispatch_of(live_message))
    delayed_message = broker.enqueue(StepMessage("y", Position()).to_message(QUEUE), delay=60_000)
    delayed = _scheduled(store, age=60, dispatch=dispatch_of(delayed_message))
    lost = _scheduled(store, age=60, dispatch={"queue": QUEUE, "message_id": "gone"})
    unrecorded = _scheduled(store, age=60, dispatch=None)
    young = _scheduled(store, age=1, dispatch={"queue": QUEUE, "message_id": "gone-too"})

    resent = sweeper.resend_lost_first_steps(utcnow())

    assert resent == 2
    queued = _queued_job_ids(broker)
    assert sorted(queued) == sorted(["x", lost.id, unrecorded.id])
    for record in (lost, unrecorded):
        row = store.get(record.id)
        assert row is not None and row.status is Status.SCHEDULED
        queue, message_id = row.state[DISPATCH_KEY]["queue"], row.state[DISPATCH_KEY]["message_id"]
        assert queue == QUEUE and broker.client.hexists(
            f"{broker.namespace}:{QUEUE}.msgs", message_id
        )
    # Untouched: a live message (waiting or delayed), and a row too young to judge.
    for record in (alive, delayed, young):
        assert store.get(record.id) == record
    # Sent again once: the new message is alive and the row was touched.
    assert sweeper.resend_lost_first_steps(utcnow()) == 0


def test_scheduled_rows_are_looked_at_in_batches_that_wrap_around(broker: RedisBroker) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    sweeper = RecoverySweeper(
        broker, "me", lease_seconds=1, interval=1, dispatch_seconds=10, batch=2
    )
    rows = [_scheduled(store, age=100 - i, dispatch=None) for i in range(5)]

    counts = [sweeper.resend_lost_first_steps(utcnow()) for _ in range(3)]

    assert counts == [2, 2, 1]
    assert sorted(_queued_job_ids(broker)) == sorted(r.id for r in rows)


class _ConsumerThread:
    """What AckKeeper reads of a Dramatiq consumer thread: its delay queue and cache."""

    def __init__(self) -> None:
        self.delay_queue: PriorityQueue[Any] = PriorityQueue()
        self.consumer = SimpleNamespace(message_cache=[])


def test_a_delayed_step_message_no_consumer_holds_is_put_back(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fetch two delayed messages into this "worker's" ack set, as its delay-queue
    # consumer does; it keeps one in memory and loses the other (a reconnect).
    dq = f"{QUEUE}.DQ"
    step = broker.enqueue(StepMessage("job-1", Position()).to_message(QUEUE), delay=1)
    kept = broker.enqueue(StepMessage("job-2", Position()).to_message(QUEUE), delay=1)
    plain = broker.enqueue(
        Message(queue_name=QUEUE, actor_name="plain", args=(), kwargs={}, options={}), delay=1
    )
    fetched = broker.do_fetch(dq, 10)
    assert len(fetched) == 3
    thread = _ConsumerThread()
    thread.delay_queue.put(
        SimpleNamespace(
            message=Message.decode(
                broker.client.hget(
                    f"{broker.namespace}:{dq}.msgs", kept.options["redis_message_id"]
                )
            )
        )
    )
    worker = SimpleNamespace(consumers={QUEUE: object(), dq: thread})
    keeper = AckKeeper(broker, worker, interval=1)
    clock = [1000.0]
    monkeypatch.setattr(
        "pypepper_dramatiq.drivers.dramatiq.orphans.time.monotonic", lambda: clock[0]
    )

    assert keeper.check() == 0  # missing only now: maybe in transit
    clock[0] += 3
    assert keeper.check() == 1

    acks = broker.client.smembers(f"{broker.namespace}:__acks__.{broker.broker_id}.{dq}")
    assert {a.decode() for a in acks} == {
        kept.options["redis_message_id"],
        plain.options["redis_message_id"],
    }  # the kept one is held; a plain actor's message is not ours to resend
    assert _queued_job_ids(broker, dq) == ["job-1"]
    assert step.actor_name == STEP_ACTOR


def test_a_held_job_is_released_to_arrive_at_its_planned_start(broker: RedisBroker) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    sweeper = RecoverySweeper(broker, "me", lease_seconds=1, interval=1, dispatch_seconds=10)
    now = utcnow()
    soon = now + timedelta(seconds=1.5)
    due = JobRecord(
        id="due", channel_id=QUEUE, status=Status.SCHEDULED, not_before=soon, release_at=soon
    )
    later = JobRecord(
        id="later",
        channel_id=QUEUE,
        status=Status.SCHEDULED,
        not_before=now + timedelta(minutes=5),
        release_at=now + timedelta(minutes=5),
    )
    assert store.put(due) and store.put(later)

    assert sweeper.release_due(now) == 1

    assert _queued_job_ids(broker) == []  # not in the queue yet: delayed to its start
    [delayed] = _queued_job_ids(broker, f"{QUEUE}.DQ")
    assert delayed == "due"
    raw = broker.client.hvals(f"{broker.namespace}:{QUEUE}.DQ.msgs")[0]
    eta_ms = Message.decode(raw).options["eta"]
    assert abs(eta_ms / 1000 - soon.timestamp()) < 0.5
    row = store.get("due")
    assert row is not None and row.release_at is None and row.state[DISPATCH_KEY]
    assert sweeper.release_due(now) == 0  # released once
    kept = store.get("later")
    assert kept is not None and kept.release_at == later.release_at  # not due yet


def test_the_sweep_cancels_a_job_nobody_started_by_its_deadline(broker: RedisBroker) -> None:
    store = MemoryJobStore()
    set_job_store(store)
    sweeper = RecoverySweeper(broker, "me", lease_seconds=1, interval=1)
    now = utcnow()
    late = JobRecord(
        id="late",
        channel_id=QUEUE,
        status=Status.SCHEDULED,
        start_deadline=now - timedelta(seconds=3),
    )
    in_time = JobRecord(
        id="in-time",
        channel_id=QUEUE,
        status=Status.SCHEDULED,
        start_deadline=now + timedelta(seconds=30),
    )
    assert store.put(late) and store.put(in_time)

    assert sweeper.cancel_overdue(now) == 1

    row = store.get("late")
    assert row is not None and row.status is Status.CANCELLED
    assert row.error is not None and "start deadline passed" in row.error
    assert "3.0s late" in row.error
    kept = store.get("in-time")
    assert kept is not None and kept.status is Status.SCHEDULED


def test_one_pass_releases_every_due_job_batch_after_batch(broker: RedisBroker) -> None:
    # Many jobs may share one eta: a pass must not leave some for the next one.
    store = MemoryJobStore()
    set_job_store(store)
    sweeper = RecoverySweeper(broker, "me", lease_seconds=1, interval=1, batch=2)
    now = utcnow()
    for i in range(5):
        assert store.put(
            JobRecord(
                id=f"j{i}",
                channel_id=QUEUE,
                status=Status.SCHEDULED,
                not_before=now,
                release_at=now,
            )
        )

    assert sweeper.release_due(now) == 5

    assert sorted(_queued_job_ids(broker)) == [f"j{i}" for i in range(5)]
    assert all(r.release_at is None for r in store.list())
