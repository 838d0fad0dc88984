"""The Dramatiq driver on the stub broker with PostgreSQL coordinating its processes
(:class:`PostgresTransport` installed with ``set_broker``): two transports on two
engines stand for two processes.

A bounded channel refuses across them, a notice one sends wakes the other's
waiter (``Job.wait()``, the poll pushed out of reach), a job's end notice keeps
being published although PostgreSQL cannot say who heard it, ``setup()`` picks
the transport for a RabbitMQ broker on a PostgreSQL store, and a plain job costs
three PostgreSQL statements of the transport.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import Engine, create_engine, event, text

import pypepper_dramatiq
from pypepper_dramatiq import (
    ChannelFullError,
    Context,
    Job,
    Status,
    Task,
    Workflow,
    manager,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels import end_notices
from pypepper_dramatiq.channels.broker import get_transport, set_broker
from pypepper_dramatiq.channels.end_notices import audience, listening, publish_ended, waiters
from pypepper_dramatiq.drivers.dramatiq.cancel_listener import CancelListener
from pypepper_dramatiq.engine.running import InFlight
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.sql.store import SqlJobStore
from pypepper_dramatiq.transport import LocalTransport, Topic, transport_for
from pypepper_dramatiq.transport.postgres import PostgresTransport

pytestmark = pytest.mark.postgres

JOB_TIMEOUT = 30.0


@workflow_task(name="pg-coordination.noop")
def noop(task: Task, context: Context) -> int:
    return 1


class RabbitmqBroker(StubBroker):
    """Stands for Dramatiq's RabbitMQ broker where pika is not installed: the transport
    knows that broker by its class's name and module, never by importing it."""


RabbitmqBroker.__module__ = "dramatiq.brokers.rabbitmq"


@dataclass
class TwoProcesses:
    broker: StubBroker
    one: PostgresTransport
    other: PostgresTransport

    def become(self, transport: PostgresTransport) -> None:
        """This process is now the one coordinating through ``transport``."""
        set_broker(self.broker, transport)
        manager.clear()


@pytest.fixture
def processes(pg_store: SqlJobStore, postgres_uri: str) -> Iterator[TwoProcesses]:
    set_job_store(pg_store)
    broker = pypepper_dramatiq.setup(broker=StubBroker())
    assert isinstance(broker, StubBroker)
    second = create_engine(postgres_uri, isolation_level="AUTOCOMMIT")
    one, other = PostgresTransport(pg_store.engine, broker), PostgresTransport(second, broker)
    set_broker(broker, one)
    yield TwoProcesses(broker, one, other)
    end_notices.stop_listening()
    one.close()
    other.close()
    second.dispose()


def unique_channel() -> str:
    return f"pg-coord-{uuid.uuid4().hex[:8]}"


def job_on(channel: str) -> Job:
    job = Job(category="pg-coordination", channel_id=channel)
    job.workflows.append(Workflow([noop.task(name="t")]))
    return job


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def test_a_bounded_channel_refuses_across_two_processes(processes: TwoProcesses) -> None:
    channel = unique_channel()
    manager.new(channel, 1)
    first = job_on(channel)
    first.scheduled()

    processes.become(processes.other)
    manager.new(channel)  # no bound given: the stored one holds
    with pytest.raises(ChannelFullError):
        job_on(channel).scheduled()
    processes.one.gate(channel).release(first.id)  # the first job was taken
    job_on(channel).scheduled()
    assert processes.other.gate(channel).waiting() == 1


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a notice can wake a wait during the test (the poll comes after a minute)."""
    monkeypatch.setattr(end_notices, "POLL_SECONDS", 60.0)


@pytest.mark.parametrize("topic", [Topic.CANCEL, Topic.ENDED])
def test_a_notice_from_the_other_process_wakes_a_waiter(
    processes: TwoProcesses, no_poll: None, topic: Topic
) -> None:
    channel = unique_channel()
    manager.new(channel)
    job = job_on(channel)
    job.scheduled()  # no worker runs it: the other process ends it by hand
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(job.wait(timeout=JOB_TIMEOUT)))
    waiter.start()
    listener = listening()
    assert listener is not None and listener.ready.wait(10)
    eventually(lambda: len(waiters) == 1, "the waiter registered")
    time.sleep(3 * end_notices.SETTLE_SECONDS)  # the listener's own wake-ups are done

    store = pypepper_dramatiq.get_job_store()
    record = store.get(job.id)
    assert record is not None
    assert store.advance(record.evolve(status=Status.CANCELLED, updated=utcnow()))
    processes.other.publish(topic, job.id)  # NOTIFY, from the other "process"
    waiter.join(JOB_TIMEOUT + 5)
    assert [record.status for record in answers] == [Status.CANCELLED]


def test_job_ends_keep_being_published_although_nobody_is_counted(
    processes: TwoProcesses,
) -> None:
    # A worker hearing the listeners' announcements goes quiet after a PUBLISH that
    # reached nobody; NOTIFY cannot say how many heard it, so it never goes quiet.
    audience.hearing(True)
    try:
        assert publish_ended("job-1", processes.one)
        assert not audience.quiet
        assert publish_ended("job-2", processes.one)
    finally:
        audience.hearing(False)


# -- which transport ----------------------------------------------------------------------


def test_a_rabbitmq_broker_on_a_postgresql_store_is_coordinated_by_postgresql(
    pg_store: SqlJobStore,
) -> None:
    transport = transport_for(RabbitmqBroker(), pg_store)
    assert isinstance(transport, PostgresTransport) and transport.engine is pg_store.engine
    assert transport.shared and transport.carries_notices
    assert transport.messages_exist([("q", "m")]) is None
    assert transport.queues_held_by_dead_workers() == set()
    # Without a PostgreSQL store there is nothing to coordinate it: this process alone.
    assert isinstance(transport_for(RabbitmqBroker(), MemoryJobStore()), LocalTransport)
    assert isinstance(transport_for(RabbitmqBroker()), LocalTransport)
    assert isinstance(transport_for(StubBroker(), pg_store), LocalTransport)


def test_setup_gives_a_rabbitmq_broker_the_postgresql_transport(postgres_uri: str) -> None:
    setup_broker = pypepper_dramatiq.setup(
        broker=RabbitmqBroker(), store_uri=postgres_uri, migrate=True
    )
    transport = get_transport()
    store = pypepper_dramatiq.get_job_store()
    assert isinstance(store, SqlJobStore)
    assert isinstance(transport, PostgresTransport) and transport.engine is store.engine
    assert transport.broker is setup_broker


def test_a_rabbitmq_broker_installed_by_hand_gets_the_postgresql_transport(
    pg_store: SqlJobStore,
) -> None:
    set_job_store(pg_store)
    broker = RabbitmqBroker()
    set_broker(broker)  # no transport given: made next to the installed store
    transport = get_transport()
    assert isinstance(transport, PostgresTransport) and transport.engine is pg_store.engine


def test_a_cancel_from_the_other_process_reaches_a_running_attempt(
    processes: TwoProcesses,
) -> None:
    seen: list[str] = []

    class SeenCancels(InFlight):
        def cancel(self, job_id: str) -> bool:
            seen.append(job_id)
            return super().cancel(job_id)

    listener = CancelListener(processes.one, SeenCancels(), reconnect_delay=0.1)
    listener.start()
    try:
        assert listener.ready.wait(10)
        processes.other.publish(Topic.CANCEL, "running-job")
        eventually(lambda: seen == ["running-job"], "the cancel was heard")
    finally:
        listener.stop()
        listener.join(5)
        audience.hearing(False)


def test_the_real_rabbitmq_broker_is_recognised() -> None:
    rabbitmq = pytest.importorskip("dramatiq.brokers.rabbitmq", reason="pika is not installed")
    from pypepper_dramatiq.transport import is_rabbitmq_broker

    broker = rabbitmq.RabbitmqBroker(url="amqp://127.0.0.1:1")  # connects on first use
    assert is_rabbitmq_broker(broker)


# -- what a plain job costs ---------------------------------------------------------------


def statements_naming(engine: Engine, job_id: str) -> Counter[str]:
    """Count, from now on, the statements sent on ``engine`` with ``job_id`` among their
    parameters, by their first words."""
    counted: Counter[str] = Counter()

    def count(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        values = parameters.values() if isinstance(parameters, dict) else parameters or ()
        if job_id in [v for v in values if isinstance(v, str)]:
            counted[" ".join(statement.split()[:2])] += 1

    event.listen(engine, "before_cursor_execute", count)
    return counted


def test_a_plain_job_costs_three_statements_of_the_transport(
    processes: TwoProcesses, postgres_uri: str
) -> None:
    # The transport on an engine of its own, so that its statements are its own.
    engine = create_engine(postgres_uri, isolation_level="AUTOCOMMIT")
    transport = PostgresTransport(engine, processes.broker)
    set_broker(processes.broker, transport)
    channel = unique_channel()
    manager.new(channel, 10)
    job = job_on(channel)
    counted = statements_naming(engine, job.id)
    worker = dramatiq.Worker(processes.broker, worker_timeout=50)
    processes.broker.emit_after("process_boot")
    worker.start()
    try:
        job.scheduled()
        record = job.wait(timeout=JOB_TIMEOUT)
        assert record.status is Status.COMPLETED
        eventually(lambda: sum(counted.values()) >= 3, "the end notice was sent")
    finally:
        worker.stop()
        transport.close()
    # Admit, release, the end notice: one statement each.
    assert counted == Counter(
        {
            "SELECT pypepper_channel_admit(%(channel)s,": 1,
            "DELETE FROM": 1,
            "SELECT pg_notify(%(channel)s,": 1,
        }
    )
    engine.dispose()


# -- the recovery sweep --------------------------------------------------------------------


def test_the_sweep_leads_and_gives_back_the_slots_of_jobs_that_left(
    processes: TwoProcesses,
) -> None:
    from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
    from pypepper_dramatiq.records.record import JobRecord

    store = pypepper_dramatiq.get_job_store()
    served, elsewhere = unique_channel(), unique_channel()
    manager.new(served, 3)
    gate, other = manager.available(served).gate, processes.other.gate(elsewhere, 1)
    for job_id, status in (("done", Status.COMPLETED), ("running", Status.IN_PROGRESS)):
        job_id = f"{served}-{job_id}"
        assert gate.admit(job_id) == "ok"
        assert store.put(JobRecord(id=job_id, channel_id=served, status=status))
    assert gate.admit(f"{served}-no-row-yet") == "ok"
    assert other.admit(f"{elsewhere}-ended") == "ok"  # a channel this process does not serve
    assert store.put(JobRecord(id=f"{elsewhere}-ended", channel_id=elsewhere, status=Status.FAILED))

    sweeper = RecoverySweeper(processes.broker, "pg-sweep", lease_seconds=30, interval=1)
    assert sweeper.lead()
    assert not RecoverySweeper(processes.broker, "pg-other", lease_seconds=30, interval=1).lead()
    assert sweeper.reclaim_slots(utcnow()) == 3
    assert gate.waiting_ids(0, 100) == (0, [f"{served}-no-row-yet"])
    assert other.waiting() == 0


def test_the_sweep_prunes_the_rate_limit_keys_idle_for_long_and_keeps_the_live_ones(
    processes: TwoProcesses,
) -> None:
    # Rows of keys idle past IDLE_KEEP_SECONDS (their newest start and last time
    # told both older) go; a key asked just now stays, and so does an old key whose
    # told time is recent (a backlog still coming back) or whose newest start is.
    from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
    from pypepper_dramatiq.limits.rates import IDLE_KEEP_SECONDS, Rate

    tag = uuid.uuid4().hex[:8]
    live = [f"key:live-{tag}-{n}" for n in range(3)]
    for key in live:
        assert processes.other.ask_start(key, Rate(5, 3600.0)) == 0.0
    engine = processes.one.engine
    old = f"extract(epoch FROM clock_timestamp()) - {IDLE_KEEP_SECONDS + 60}"
    recent = "extract(epoch FROM clock_timestamp()) - 60"
    rows = {
        f"key:stale-{tag}-a": (f"ARRAY[{old} - 5, {old}]", "0"),
        f"key:stale-{tag}-b": ("'{}'", old),
        f"key:told-{tag}": (f"ARRAY[{old}]", recent),
        f"key:started-{tag}": (f"ARRAY[{old}, {recent}]", "0"),
    }
    with engine.begin() as connection:
        for key, (starts, tail) in rows.items():
            connection.execute(
                text(
                    "INSERT INTO scheduler_rate_turns (key, starts, tail_at, rate_limit)"
                    f" VALUES (:key, {starts}::float8[], {tail}, '5/h')"
                ),
                {"key": key},
            )

    def kept() -> set[str]:
        with engine.connect() as connection:
            found = connection.execute(
                text("SELECT key FROM scheduler_rate_turns WHERE key LIKE :tag"),
                {"tag": f"%{tag}%"},
            )
            return {row[0] for row in found}

    assert len(kept()) == 7
    sweeper = RecoverySweeper(processes.broker, "pg-prune", lease_seconds=30, interval=1)
    assert sweeper.lead()
    sweeper.sweep(full=True)  # the duty runs in a full pass
    assert kept() == {*live, f"key:told-{tag}", f"key:started-{tag}"}
    assert sweeper.health().failing == ()
    # A key forgotten is asked afresh: its row is made again and the start counted.
    assert processes.one.ask_start(f"key:stale-{tag}-a", Rate(1, 3600.0)) == 0.0
    assert processes.one.ask_start(f"key:stale-{tag}-a", Rate(1, 3600.0)) > 0.0


def test_a_start_asking_while_its_key_is_pruned_is_counted_on_a_new_row(
    processes: TwoProcesses,
) -> None:
    # The prune deletes a row a start found but had not locked yet: the function
    # (migration 0016) makes the row again rather than grant the start uncounted
    # (0015's found no row to lock, granted, and counted nothing).
    from pypepper_dramatiq.limits.rates import Rate

    key = f"key:raced-{uuid.uuid4().hex[:8]}"
    rate = Rate(1, 3600.0)
    assert processes.one.ask_start(key, rate) == 0.0
    second = create_engine(str(processes.other.engine.url), isolation_level="AUTOCOMMIT")
    with processes.one.engine.connect() as deleting:
        deleting.execute(text("BEGIN"))
        lock = "SELECT key FROM scheduler_rate_turns WHERE key = :k FOR UPDATE"
        deleting.execute(text(lock), {"k": key})
        asked: list[float] = []
        asking = threading.Thread(target=lambda: asked.append(processes.other.ask_start(key, rate)))
        asking.start()  # it finds the row, then waits for its lock
        eventually(lambda: waiting_on_a_lock(second), "the start to wait for the row's lock")
        deleting.execute(text("DELETE FROM scheduler_rate_turns WHERE key = :k"), {"k": key})
        deleting.execute(text("COMMIT"))
    asking.join(JOB_TIMEOUT)
    assert asked == [0.0]  # the window is empty again: granted, and counted
    assert processes.one.ask_start(key, rate) > 0.0
    second.dispose()


def waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as connection:
        waiting = connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE '%pypepper_rate_ask%'"
            )
        )
        return bool(waiting.scalar())
