"""``schedule_many`` and ``scheduled()`` on Redis: what they send and how many calls it takes.

The broker's Redis client is wrapped to record every command it sends: the
admission and the enqueue of a whole list of jobs is one ``EVALSHA`` (one Lua
script), and so is a single ``scheduled()``'s. The messages it queues are
Dramatiq's own: a Redis broker consumer reads them back as it reads
``actor.send()``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, timedelta, timezone
from typing import Any
from unittest.mock import ANY

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from process_state import clean_process_state

import pypepper_dramatiq
from pypepper_dramatiq import (
    BrokerUnavailableError,
    ChannelFullError,
    ChannelStoppedError,
    Context,
    Job,
    Status,
    Task,
    Workflow,
    get_job_store,
    manager,
    schedule_many,
    workflow_task,
)
from pypepper_dramatiq.channels.broker import get_transport
from pypepper_dramatiq.channels.messages import DISPATCH_KEY, StepMessage
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import utcnow

pytestmark = pytest.mark.redis

CHANNEL = "many-jobs"
OTHER = "many-jobs-other"


@workflow_task(name="schedule-many-redis.noop")
def noop(task: Task, context: Context) -> None:
    return None


def _clear(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    for name in (CHANNEL, OTHER):
        client.delete(f"dramatiq:{name}", f"dramatiq:{name}.msgs")
    client.close()


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    _clear(redis_url)
    with clean_process_state():
        made = pypepper_dramatiq.setup(redis_url, channels={CHANNEL: 0, OTHER: 0})
        assert isinstance(made, RedisBroker)
        for name in (CHANNEL, OTHER):
            manager.available(name).gate.reset()
            manager.available(name).connect()
        yield made
        for name in (CHANNEL, OTHER):
            manager.available(name).gate.reset()
        made.close()
    _clear(redis_url)


class Recorder:
    """Records every command the broker's client sends on its pooled connections:
    through the client's own call, or straight on a connection (the one script call
    of ``scheduled()`` and ``schedule_many()``)."""

    def __init__(self, client: Any) -> None:
        self.commands: list[str] = []
        self.calls: list[tuple[Any, ...]] = []
        wrapped: set[int] = set()
        pool = client.connection_pool
        get_connection = pool.get_connection

        def recording(*args: Any, **options: Any) -> Any:
            connection = get_connection(*args, **options)
            if id(connection) not in wrapped:
                wrapped.add(id(connection))
                send = connection.send_packed_command

                # Every command goes through here, packed by redis-py or by hand.
                def send_packed_command(packed: Any, *more: Any, **sent: Any) -> Any:
                    command = unpacked(packed)
                    self.commands.append(command[0].decode().upper())
                    self.calls.append(command)
                    return send(packed, *more, **sent)

                connection.send_packed_command = send_packed_command
            return connection

        pool.get_connection = recording


def unpacked(packed: Any) -> tuple[bytes, ...]:
    """The arguments of one command in Redis's protocol (bytes, or a list of pieces)."""
    data = packed if isinstance(packed, bytes) else b"".join(bytes(part) for part in packed)
    head, rest = data.split(b"\r\n", 1)
    assert head.startswith(b"*")
    args = []
    for _ in range(int(head[1:])):
        size, rest = rest.split(b"\r\n", 1)
        assert size.startswith(b"$")
        length = int(size[1:])
        args.append(rest[:length])
        rest = rest[length + 2 :]
    assert rest == b""
    return tuple(args)


def job(channel: str = CHANNEL) -> Job:
    made = Job(channel_id=channel)
    made.workflows.append(Workflow([noop.task(name="noop")]))
    return made


def queued(broker: RedisBroker, channel: str = CHANNEL) -> list[StepMessage]:
    """The messages waiting in ``channel``'s queue, read as a worker reads them."""
    consumer = broker.consume(channel, prefetch=1000, timeout=100)
    found = []
    for message in consumer:
        if message is None:
            break
        found.append(StepMessage.from_message(message))
        consumer.ack(message)
    consumer.close()
    return found


def test_a_list_of_jobs_costs_one_redis_call_for_admission_and_enqueue(
    broker: RedisBroker,
) -> None:
    job().scheduled()  # the script is loaded once (SCRIPT LOAD after a NOSCRIPT)
    recorder = Recorder(broker.client)
    batch = [job(CHANNEL if i % 2 else OTHER) for i in range(20)]

    assert schedule_many(batch) == [j.id for j in batch]

    assert recorder.commands == ["EVALSHA"]
    assert manager.available(CHANNEL).length() == 11
    assert manager.available(OTHER).length() == 10
    # Each channel's four keys go once, then four arguments a job.
    _, _, numkeys, *rest = recorder.calls[0]
    assert int(numkeys) == 8
    assert len(rest) == 8 + 4 * 20


def test_a_single_scheduled_costs_one_redis_call(broker: RedisBroker) -> None:
    job().scheduled()
    recorder = Recorder(broker.client)
    job().scheduled()
    assert recorder.commands == ["EVALSHA"]


def test_the_messages_are_the_redis_brokers_own_and_the_rows_name_them(
    broker: RedisBroker,
) -> None:
    batch = [job() for _ in range(5)]
    schedule_many(batch)
    steps = queued(broker)
    assert [step.job_id for step in steps] == [j.id for j in batch]  # in order
    for step, scheduled in zip(steps, batch, strict=True):
        assert step.record is not None and step.record.status is Status.SCHEDULED
        record = get_job_store().get(scheduled.id)
        assert record is not None and record.status is Status.SCHEDULED
        assert record.state[DISPATCH_KEY]["queue"] == CHANNEL
        assert record.state[DISPATCH_KEY]["message_id"]
        assert scheduled.state[DISPATCH_KEY] == record.state[DISPATCH_KEY]


def test_each_message_carries_the_job_as_stored_but_for_its_dispatch(
    broker: RedisBroker,
) -> None:
    batch = [job() for _ in range(3)]
    schedule_many(batch)
    for step in queued(broker):
        row = get_job_store().get(step.job_id)
        assert row is not None and step.record is not None
        assert DISPATCH_KEY not in step.record.state  # known only once the message is
        healed = step.record.evolve(state={**step.record.state, DISPATCH_KEY: ANY}, version=1)
        assert healed == row


class EnqueueHooks(Middleware):
    """Records the messages its enqueue hooks see: (redis message id, delay)."""

    def __init__(self) -> None:
        self.before: list[tuple[str, int | None]] = []
        self.after: list[tuple[str, int | None]] = []

    def before_enqueue(self, broker: Any, message: Any, delay: int | None) -> None:
        self.before.append((message.options["redis_message_id"], delay))

    def after_enqueue(self, broker: Any, message: Any, delay: int | None) -> None:
        self.after.append((message.options["redis_message_id"], delay))


def test_the_brokers_enqueue_hooks_run_for_each_message_as_its_enqueue_runs_them(
    broker: RedisBroker,
) -> None:
    hooks = EnqueueHooks()
    broker.add_middleware(hooks)
    try:
        manager.available(OTHER).request_stop()
        batch = [job(), job(OTHER), job()]
        results = schedule_many(batch)
    finally:
        broker.middleware.remove(hooks)
    assert isinstance(results[1], ChannelStoppedError)
    sent = [(j.state[DISPATCH_KEY]["message_id"], None) for j in (batch[0], batch[2])]
    assert hooks.after == sent
    # The refused job's message was prepared (before_enqueue), never queued.
    assert len(hooks.before) == 3 and [hooks.before[0], hooks.before[2]] == sent
    assert [step.job_id for step in queued(broker)] == [batch[0].id, batch[2].id]


def test_a_bounded_channel_takes_the_first_jobs_and_refuses_the_rest(
    broker: RedisBroker,
) -> None:
    manager.resize(CHANNEL, 3)
    batch = [job() for _ in range(6)]
    results = schedule_many(batch)
    assert results[:3] == [j.id for j in batch[:3]]
    assert all(isinstance(r, ChannelFullError) for r in results[3:])
    store = get_job_store()
    assert [store.get(j.id) is not None for j in batch] == [True] * 3 + [False] * 3
    assert [step.job_id for step in queued(broker)] == [j.id for j in batch[:3]]


def test_a_stopped_channel_refuses_its_jobs_and_another_channel_takes_its_own(
    broker: RedisBroker,
) -> None:
    manager.available(CHANNEL).request_stop()
    batch = [job(CHANNEL), job(OTHER), job(CHANNEL)]
    results = schedule_many(batch)
    assert isinstance(results[0], ChannelStoppedError)
    assert results[1] == batch[1].id
    assert isinstance(results[2], ChannelStoppedError)
    assert get_job_store().get_many([batch[0].id, batch[2].id]) == []
    assert queued(broker) == []
    assert [step.job_id for step in queued(broker, OTHER)] == [batch[1].id]


def test_rows_whose_messages_were_not_sent_are_sent_by_the_sweep(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(offers: object) -> list[str]:
        raise BrokerUnavailableError("Redis unreachable (test)")

    monkeypatch.setattr(get_transport(), "admit_and_enqueue", unreachable)
    batch = [job() for _ in range(3)]
    assert schedule_many(batch) == [j.id for j in batch]  # stored: they will be sent
    assert queued(broker) == []
    monkeypatch.undo()

    sweep = RecoverySweeper(broker, "test-sweeper", lease_seconds=30, interval=1)
    assert sweep.resend_lost_first_steps(utcnow() + timedelta(minutes=5)) == 3
    assert sorted(step.job_id for step in queued(broker)) == sorted(j.id for j in batch)


def test_each_channel_of_one_call_keeps_its_own_bound(broker: RedisBroker) -> None:
    manager.resize(CHANNEL, 2)
    manager.resize(OTHER, 1)
    batch = [job(CHANNEL if i % 2 == 0 else OTHER) for i in range(6)]
    results = schedule_many(batch)
    admitted = [isinstance(result, str) for result in results]
    # CHANNEL's jobs are 0, 2, 4 (bound 2); OTHER's are 1, 3, 5 (bound 1).
    assert admitted == [True, True, True, False, False, False]
    assert manager.available(CHANNEL).length() == 2
    assert manager.available(OTHER).length() == 1


def test_each_row_stored_is_the_record_of_its_job_as_scheduled(broker: RedisBroker) -> None:
    # The rows are made from the records checked before anything was done, copied as
    # Scheduled: each must be the job's own record once scheduled, field for field.
    batch = [job() for _ in range(3)]
    batch[1].priority = 7
    batch[2].category = "copied"
    assert schedule_many(batch) == [j.id for j in batch]
    store = pypepper_dramatiq.get_job_store()
    for made in batch:
        assert made.status is Status.SCHEDULED and made.version == 1
        assert store.get(made.id) == made.to_record()


def test_a_single_scheduled_stores_and_sends_the_record_of_its_job(
    broker: RedisBroker,
) -> None:
    # scheduled() makes the job's record once, checks it, and sends and stores
    # copies of it: each must be the job's own record, field for field.
    made = job()
    made.category = "once"
    made.scheduled(priority=6, rate_key="tenant-1", concurrency_key="c-1", max_start_delay=60)
    row = get_job_store().get(made.id)
    assert made.version == 1 and row == made.to_record()
    (step,) = queued(broker, row.state[DISPATCH_KEY]["queue"])  # the queue of priority 6
    assert step.record is not None
    assert sent_as(step.record, row) == row
    assert step.record.start_deadline is not None and step.record.payload == row.payload


def test_an_eta_in_another_offset_is_sent_and_stored_in_utc(broker: RedisBroker) -> None:
    made = job()
    eta = (utcnow() + timedelta(seconds=2)).astimezone(timezone(timedelta(hours=2)))
    made.scheduled(eta=eta, max_start_delay=30)
    row = get_job_store().get(made.id)
    assert row == made.to_record()
    assert row.not_before == eta and row.not_before.tzinfo is UTC
    (step,) = queued(broker, f"{CHANNEL}.DQ")  # Dramatiq's delayed queue
    assert step.record is not None
    assert step.record.not_before is not None and step.record.not_before.tzinfo is UTC
    assert sent_as(step.record, row) == row


def sent_as(record: Any, row: Any) -> Any:
    """The record a message carried as the row stores it: its dispatch is known only
    once the message is, and the row has its version and time of writing."""
    assert record.updated <= row.updated
    return record.evolve(state={**record.state, DISPATCH_KEY: ANY}, version=1, updated=row.updated)
