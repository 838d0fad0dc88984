"""``scheduled(connection=...)``: the job is written in the caller's transaction.

Real PostgreSQL and Redis. A rollback leaves no row and sends nothing; a commit
makes the row visible and the job is sent: by the workers' sweep (a plain
``Connection``), or at once when a ``Session`` commits. The caller's transaction
survives a refused key. Bad connections are ``ConfigError``s naming them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from process_state import clean_process_state
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

import pypepper_dramatiq
from pypepper_dramatiq import (
    ChannelFullError,
    ChannelStoppedError,
    ConfigError,
    Context,
    DuplicateJobError,
    Job,
    Status,
    Task,
    Worker,
    Workflow,
    get_job_store,
    manager,
    workflow_task,
)
from pypepper_dramatiq.channels.messages import DISPATCH_KEY
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import JobRecord, utcnow

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

CHANNEL = "in-transaction"
ran: list[str] = []


@workflow_task(name="in-transaction.note")
def note(task: Task, context: Context) -> str:
    ran.append(context.job_id)
    return "noted"


@pytest.fixture
def engine(postgres_uri: str) -> Iterator[Engine]:
    """The application's own engine on the job store's database, with a business table."""
    made = create_engine(postgres_uri)
    with made.begin() as connection:
        connection.execute(text("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)"))
        connection.execute(text("DELETE FROM orders"))
    yield made
    made.dispose()


@pytest.fixture
def queue(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.delete(f"dramatiq:{CHANNEL}", f"dramatiq:{CHANNEL}.msgs")
    yield client
    client.close()


@pytest.fixture
def on_redis(
    redis_url: str, postgres_uri: str, pg_store: object, queue: redis.Redis
) -> Iterator[object]:
    with clean_process_state():
        broker = pypepper_dramatiq.setup(redis_url, postgres_uri, channels={CHANNEL: 0})
        manager.available(CHANNEL).gate.reset()
        yield broker
        manager.available(CHANNEL).gate.reset()
        broker.close()


def job() -> Job:
    made = Job(channel_id=CHANNEL)
    made.workflows.append(Workflow([note.task(name="note")]))
    return made


def queued(client: redis.Redis) -> int:
    return int(client.hlen(f"dramatiq:{CHANNEL}.msgs"))


def stored(job_id: str) -> JobRecord | None:
    return get_job_store().get(job_id)


def sweep(broker: object) -> int:
    sweeper = RecoverySweeper(broker, "test", lease_seconds=30, interval=1)  # type: ignore[arg-type]
    return sweeper.release_due(utcnow())


def order(connection: Connection | Session, order_id: str) -> None:
    connection.execute(text("INSERT INTO orders (id) VALUES (:id)"), {"id": order_id})


def orders(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return [row[0] for row in connection.execute(text("SELECT id FROM orders"))]


def test_a_rolled_back_enqueue_leaves_no_trace(
    on_redis: object, engine: Engine, queue: redis.Redis
) -> None:
    rolled_back = job()
    with engine.connect() as connection:
        transaction = connection.begin()
        order(connection, "o-1")
        assert rolled_back.scheduled(connection=connection) == rolled_back.id
        assert stored(rolled_back.id) is None  # not visible outside the transaction
        transaction.rollback()
    assert stored(rolled_back.id) is None
    assert orders(engine) == []
    assert sweep(on_redis) == 0
    assert queued(queue) == 0


def test_a_committed_enqueue_is_sent_by_the_sweep_with_a_plain_connection(
    on_redis: object, engine: Engine, queue: redis.Redis
) -> None:
    committed = job()
    with engine.begin() as connection:
        order(connection, "o-2")
        committed.scheduled(connection=connection)
        assert queued(queue) == 0  # nothing goes before the commit
    assert orders(engine) == ["o-2"]
    row = stored(committed.id)
    assert row is not None and row.status is Status.SCHEDULED and row.release_at is not None
    assert queued(queue) == 0

    assert sweep(on_redis) == 1
    row = stored(committed.id)
    assert row is not None and row.release_at is None
    assert row.state[DISPATCH_KEY]["message_id"]
    assert queued(queue) == 1


def test_a_session_commit_sends_the_job_at_once(
    on_redis: object, engine: Engine, queue: redis.Redis
) -> None:
    committed = job()
    with Session(engine) as session:
        order(session, "o-3")
        committed.scheduled(connection=session)
        assert queued(queue) == 0
        session.commit()
    assert queued(queue) == 1
    row = stored(committed.id)
    assert row is not None and row.release_at is None
    assert sweep(on_redis) == 0  # nothing left for the relay


def test_a_session_rolled_back_sends_nothing_then_or_at_its_next_commit(
    on_redis: object, engine: Engine, queue: redis.Redis
) -> None:
    with Session(engine) as session:
        job().scheduled(connection=session)
        session.rollback()
        order(session, "o-4")
        session.commit()
    assert queued(queue) == 0
    assert orders(engine) == ["o-4"]


def test_a_delayed_transactional_job_is_released_at_its_planned_start(
    on_redis: object, engine: Engine, queue: redis.Redis
) -> None:
    later = job()
    with engine.begin() as connection:
        later.scheduled(connection=connection, delay=timedelta(hours=1))
    assert sweep(on_redis) == 0  # not due yet
    row = stored(later.id)
    assert row is not None and row.release_at == row.not_before
    assert queued(queue) == 0


def test_a_refused_key_leaves_the_callers_transaction_usable(
    on_redis: object, engine: Engine
) -> None:
    holder = job()
    holder.scheduled(unique_key="nightly")
    second, third = job(), job()
    with engine.begin() as connection:
        with pytest.raises(DuplicateJobError) as refused:
            second.scheduled(connection=connection, unique_key="nightly", on_conflict="raise")
        assert refused.value.existing_id == holder.id
        assert third.scheduled(connection=connection, unique_key="nightly") == holder.id
        order(connection, "o-5")  # PostgreSQL would refuse this in an aborted transaction
    assert orders(engine) == ["o-5"]
    assert stored(second.id) is None and stored(third.id) is None


def test_a_transactional_job_may_wait_for_a_parent(on_redis: object, engine: Engine) -> None:
    parent, child = job(), job()
    with engine.begin() as connection:
        parent.scheduled(connection=connection)
        child.scheduled(connection=connection, after=[parent])  # the parent is seen in it
    row = stored(child.id)
    assert row is not None and row.waits is not None and row.waits["parents"] == [parent.id]


def test_a_stopped_or_full_channel_refuses_at_once_and_writes_nothing(
    on_redis: object, engine: Engine
) -> None:
    manager.resize(CHANNEL, 1)
    job().scheduled()  # the one slot
    refused = job()
    with engine.begin() as connection:
        with pytest.raises(ChannelFullError):
            refused.scheduled(connection=connection)
        manager.resize(CHANNEL, 0)
        manager.available(CHANNEL).request_stop()
        with pytest.raises(ChannelStoppedError):
            refused.scheduled(connection=connection)
        order(connection, "o-6")
    assert stored(refused.id) is None
    assert orders(engine) == ["o-6"]


def test_a_connection_to_another_database_is_refused(
    on_redis: object, empty_postgres_uri: str
) -> None:
    other = create_engine(empty_postgres_uri)
    try:
        with other.connect() as connection, pytest.raises(ConfigError, match="not the job store"):
            job().scheduled(connection=connection)
    finally:
        other.dispose()


def test_something_else_than_a_connection_is_refused(on_redis: object) -> None:
    with pytest.raises(ConfigError, match="Connection or Session, got str"):
        job().scheduled(connection="postgresql://somewhere")


def test_the_memory_store_cannot_write_in_a_transaction(engine: Engine) -> None:
    with clean_process_state():
        pypepper_dramatiq.setup()
        with engine.connect() as connection, pytest.raises(ConfigError, match="MemoryJobStore"):
            job().scheduled(connection=connection)


def test_in_process_a_plain_connection_is_refused_and_a_session_runs_the_job(
    postgres_uri: str, pg_store: object, engine: Engine
) -> None:
    ran.clear()
    with clean_process_state():
        pypepper_dramatiq.setup(store_uri=postgres_uri)
        committed = job()
        with engine.connect() as connection, pytest.raises(ConfigError, match="Session"):
            committed.scheduled(connection=connection)
        with Session(engine) as session:
            committed.scheduled(connection=session)
            session.commit()
        worker = Worker(manager.available(CHANNEL))
        assert asyncio.run(worker.run_once()) is not None
        row = stored(committed.id)
        assert row is not None and row.status is Status.COMPLETED
        assert ran == [committed.id]


@pytest.mark.mysql
def test_on_mariadb_too_a_rollback_leaves_nothing_and_a_refused_key_keeps_the_transaction(
    redis_url: str, mysql_uri: str, mysql_store: object, queue: redis.Redis
) -> None:
    business = create_engine(mysql_uri)
    with business.begin() as connection:
        connection.execute(text("CREATE TABLE IF NOT EXISTS orders (id varchar(40) PRIMARY KEY)"))
        connection.execute(text("DELETE FROM orders"))
    try:
        with clean_process_state():
            broker = pypepper_dramatiq.setup(redis_url, mysql_uri, channels={CHANNEL: 0})
            manager.available(CHANNEL).gate.reset()
            rolled_back, holder, refused, committed = job(), job(), job(), job()
            with business.connect() as connection:
                transaction = connection.begin()
                rolled_back.scheduled(connection=connection)
                transaction.rollback()
            holder.scheduled(unique_key="k")
            with business.begin() as connection:
                with pytest.raises(DuplicateJobError):
                    refused.scheduled(connection=connection, unique_key="k", on_conflict="raise")
                committed.scheduled(connection=connection)
                order(connection, "o-7")
            assert stored(rolled_back.id) is None and stored(refused.id) is None
            assert orders(business) == ["o-7"]
            assert sweep(broker) == 1
            row = stored(committed.id)
            assert row is not None and row.release_at is None
            broker.close()
    finally:
        business.dispose()
