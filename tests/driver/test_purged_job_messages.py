"""A message of a job that retention purged comes back: it is dropped, never run again.

Found by the chaos test (issue 22, ``PYPEPPER_CHAOS_SEED=404``): a worker is
SIGKILLed while it runs a job's first step; recovery sends the step again and
another worker completes the job; retention then deletes the row; later the
killed worker's unacknowledged copy of the first message comes back (Dramatiq
requeues a dead worker's messages). Its claim finds no row. The message alone
cannot tell this job from one whose producer could not store its row (which the
worker stores from the message, the heal): the purge's tombstone can
(``IJobStore.was_purged``), asked only when no row is found.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    IJobStore,
    Job,
    JobRecord,
    Status,
    StoreUnavailableError,
    Task,
    Worker,
    Workflow,
    manager,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.step_io import Outcome, StepIO, StepSkipped
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.base import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .conftest import CHANNEL
from .drivers import Driver, InProcessDriver

TIMEOUT = 20.0
#: The conftest fixture that builds each SQL store.
SQL_FIXTURES = {"postgres": "pg_store", "mysql": "mysql_store"}
#: The line a worker logs when it drops such a message (after "job <id>").
DROPPED = "was deleted by retention; its returning message is dropped"

_lock = threading.Lock()
CALLS: dict[str, int] = defaultdict(int)


@workflow_task(name="driver-purged.count")
def count(task: Task, context: Context, key: str) -> str:
    """Counts its calls."""
    with _lock:
        CALLS[key] += 1
    return "counted"


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


class OutageStore(MemoryJobStore):
    """A memory store whose tombstone look-up fails while ``down`` (the store
    unreachable at that very question); every other call works."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed_looks = 0

    def was_purged(self, job_id: str) -> bool:
        if self.down:
            self.failed_looks += 1
            raise StoreUnavailableError("the database is down")
        return super().was_purged(job_id)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def store(request: pytest.FixtureRequest) -> IJobStore:
    if request.param == "memory":
        return MemoryJobStore()
    sql: IJobStore = request.getfixturevalue(SQL_FIXTURES[request.param])
    return sql


def completed_and_purged(store: IJobStore) -> StepMessage:
    """A one-task job run to its end through the step I/O, then purged: its first
    message as its producer sent it."""
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id="steps",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": [{"name": "a", "executor_id": "x", "params": {}}]}]},
    )
    assert store.put(record)
    first = StepMessage(record.id, Position(), record)
    book = StepIO(lambda: store, "worker-b", 30.0)
    book.record(book.claim(first), Outcome(True, 7))
    ended = store.get(record.id)
    assert ended is not None and ended.status is Status.COMPLETED
    assert store.purge(Status.COMPLETED, utcnow() + timedelta(seconds=1), 10) == [record.id]
    return first


def test_the_first_message_of_a_purged_job_does_not_run_it_again(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    first = completed_and_purged(store)

    # The killed worker's copy of the same message comes back.
    with (
        caplog.at_level(logging.INFO, logger="pypepper_dramatiq"),
        pytest.raises(StepSkipped) as info,
    ):
        StepIO(lambda: store, "worker-c", 30.0).claim(first)
    assert not info.value.dead and info.value.retry_at is None  # acknowledged, not dead-lettered
    assert store.get(first.job_id) is None
    [line] = [r for r in caplog.records if getattr(r, "action", None) == "drop_purged"]
    assert line.levelno == logging.INFO
    assert line.getMessage() == f"job {first.job_id} {DROPPED}"


def test_a_purge_between_the_heals_tombstone_question_and_its_insert_is_not_undone(
    store: IJobStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The first message finds no row and no tombstone (its producer has not stored
    # the row yet); before the heal's insert, the producer stores it, another worker
    # runs the job to its end and retention deletes it. The insert must not bring
    # it back: the store refuses the purged id, and the message is dropped.
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id="steps",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": [{"name": "a", "executor_id": "x", "params": {}}]}]},
    )
    first = StepMessage(record.id, Position(), record)
    asked = store.was_purged

    def answer_then_run_and_purge(job_id: str) -> bool:
        answer = asked(job_id)
        monkeypatch.undo()  # once
        assert store.put(record)
        other = StepIO(lambda: store, "worker-b", 30.0)
        other.record(other.claim(first), Outcome(True, 7))
        assert store.purge(Status.COMPLETED, utcnow() + timedelta(seconds=1), 10) == [record.id]
        return answer

    monkeypatch.setattr(store, "was_purged", answer_then_run_and_purge)
    book = StepIO(lambda: store, "worker-c", 30.0)
    with (
        caplog.at_level(logging.INFO, logger="pypepper_dramatiq"),
        pytest.raises(StepSkipped) as info,
    ):
        book.claim(first)

    assert not info.value.dead and info.value.retry_at is None
    assert store.get(record.id) is None
    assert [r.action for r in caplog.records if hasattr(r, "action")] == ["drop_purged"]


def test_a_later_step_message_of_a_purged_job_is_dropped_not_dead_lettered() -> None:
    store = MemoryJobStore()
    first = completed_and_purged(store)
    later = StepMessage(first.job_id, Position(0, 0, 1))  # a retry's message: no record
    with pytest.raises(StepSkipped) as info:
        StepIO(lambda: store, "worker-c", 30.0).claim(later)
    assert not info.value.dead


def test_a_job_never_stored_is_still_healed_from_its_first_message() -> None:
    # No row and no tombstone: the producer could not store it; the message stores it.
    store = MemoryJobStore()
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id="steps",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": [{"name": "a", "executor_id": "x", "params": {}}]}]},
    )
    claim = StepIO(lambda: store, "worker-b", 30.0).claim(
        StepMessage(record.id, Position(), record)
    )
    assert claim.record.status is Status.IN_PROGRESS
    assert not store.was_purged(record.id)


def test_the_store_down_at_the_tombstone_question_is_an_outage_not_a_drop() -> None:
    store = OutageStore()
    first = completed_and_purged(store)
    store.down = True
    book = StepIO(lambda: store, "worker-c", 30.0)
    with pytest.raises(StoreUnavailableError):  # the drivers defer the message on this
        book.claim(first)
    assert store.failed_looks >= 1 and store.get(first.job_id) is None
    store.down = False
    with pytest.raises(StepSkipped):
        book.claim(first)
    assert store.get(first.job_id) is None


# -- the drivers ------------------------------------------------------------------------------


def counting_job(key: str) -> Job:
    job = Job(category="purged", channel_id=CHANNEL)
    job.workflows.append(Workflow([count.task(name="count", key=key)]))
    return job


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def ended(store: IJobStore, job: Job) -> bool:
    record = store.get(job.id)
    return record is not None and record.status is Status.COMPLETED


def purge_now(store: IJobStore, job: Job) -> None:
    assert store.purge(Status.COMPLETED, utcnow() + timedelta(seconds=1), 10) == [job.id]


def test_the_dramatiq_driver_acknowledges_a_purged_jobs_returning_message_unrun(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = set_job_store(MemoryJobStore())
    key = f"{uuid.uuid4().hex[:8]}:dramatiq"
    job = counting_job(key)
    job.scheduled()
    sent = StepMessage(job.id, Position(), job.to_record())  # its first message, as sent
    start_worker()
    wait_for(lambda: ended(store, job), "the job to complete")
    stub_broker.join(CHANNEL, timeout=int(TIMEOUT * 1000))
    purge_now(store, job)

    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        stub_broker.enqueue(sent.to_message(CHANNEL))
        stub_broker.join(CHANNEL, timeout=int(TIMEOUT * 1000))

    assert calls(key) == 1
    assert store.get(job.id) is None
    assert stub_broker.dead_letters == []
    assert [r.getMessage() for r in caplog.records if r.getMessage().endswith(DROPPED)] == [
        f"job {job.id} {DROPPED}"
    ]


def test_the_dramatiq_driver_defers_the_message_while_the_store_cannot_answer(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker]
) -> None:
    store = set_job_store(OutageStore())
    assert isinstance(store, OutageStore)
    key = f"{uuid.uuid4().hex[:8]}:outage"
    job = counting_job(key)
    job.scheduled()
    sent = StepMessage(job.id, Position(), job.to_record())
    start_worker()
    wait_for(lambda: ended(store, job), "the job to complete")
    stub_broker.join(CHANNEL, timeout=int(TIMEOUT * 1000))
    purge_now(store, job)

    store.down = True
    stub_broker.enqueue(sent.to_message(CHANNEL))
    wait_for(lambda: store.failed_looks >= 2, "the message to be tried again")
    assert stub_broker.dead_letters == [] and calls(key) == 1
    store.down = False
    stub_broker.join(CHANNEL, timeout=int(TIMEOUT * 1000))

    assert calls(key) == 1
    assert store.get(job.id) is None
    assert stub_broker.dead_letters == []


def test_the_inprocess_driver_does_not_run_a_purged_job_that_comes_back(
    stub_broker: StubBroker, caplog: pytest.LogCaptureFixture
) -> None:
    store = set_job_store(MemoryJobStore())
    key = f"{uuid.uuid4().hex[:8]}:inprocess"
    job = counting_job(key)
    job.scheduled()
    sent = job.to_record()  # the job as its producer sent it
    channel = manager.available(CHANNEL)
    assert asyncio.run(Worker(channel).run_once()) is not None
    assert ended(store, job) and calls(key) == 1
    purge_now(store, job)

    # Its first message comes back to the channel's queue (as a broker restored it).
    stub_broker.enqueue(StepMessage(job.id, Position(), sent).to_message(CHANNEL))
    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        back = asyncio.run(Worker(channel).run_once())

    assert back is not None and back.id == job.id
    assert calls(key) == 1
    assert store.get(job.id) is None
    [line] = [r for r in caplog.records if getattr(r, "action", None) == "drop_purged"]
    assert line.levelno == logging.INFO and line.getMessage() == f"job {job.id} {DROPPED}"


# -- the producer's own Scheduled save, landing after the job ended and was purged ------------


class ProducerHeldStore(MemoryJobStore):
    """A memory store whose writes from the ``producer`` thread wait, once the
    test says so, until it lets them through: a producer whose own Scheduled
    save is slow (a database outage, a stalled connection) while the workers,
    faster, heal the row from the message, run the job, and retention deletes it."""

    def __init__(self) -> None:
        super().__init__()
        self.producer: int | None = None
        self.held = threading.Event()
        self.go_on = threading.Event()

    def put(self, record: JobRecord) -> bool:
        if threading.get_ident() == self.producer:
            self.held.set()
            assert self.go_on.wait(TIMEOUT), "the test did not let the producer's save through"
        return super().put(record)


def test_a_producers_save_landing_after_the_purge_does_not_bring_the_job_back(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    if isinstance(driver, InProcessDriver):
        pytest.skip(
            "in one process the in-process worker runs the producer's own Job, whose "
            "writes wait for the save held here (its write lock): they cannot overtake it"
        )
    store = set_job_store(ProducerHeldStore())
    assert isinstance(store, ProducerHeldStore)
    key = f"{uuid.uuid4().hex[:8]}:late-save"
    job = counting_job(key)

    def schedule() -> None:
        store.producer = threading.get_ident()
        job.scheduled()  # sends the message, then saves the row (held here)

    producer = threading.Thread(target=schedule, name="producer")
    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        producer.start()
        assert store.held.wait(TIMEOUT), "the producer did not save"
        driver.start()
        wait_for(lambda: ended(store, job), "the worker to heal the row and run the job")
        [healed] = driver.wait(job)  # and the broker to settle
        assert healed.status is Status.COMPLETED and calls(key) == 1
        purge_now(store, job)

        store.go_on.set()  # the producer's save lands now
        producer.join(TIMEOUT)
        assert not producer.is_alive()

    assert store.get(job.id) is None  # no fresh Scheduled row for the sweep to send
    assert calls(key) == 1
    saved = [r for r in caplog.records if getattr(r, "action", None) == "save_purged"]
    assert [r.getMessage() for r in saved] == [
        f"job {job.id}: not saved, retention deleted it already"
    ]
