"""The completion thread (``claim_fetched``) on the stub broker: the worker threads
leave their outcomes to it; it records many in one store call, then acknowledges
their messages. A store that fails the record tells each job and loses none; a
cancel that comes while an outcome waits wins over it (the attempt kept in the
Cancelled row); a message redelivered after its outcome was recorded is dropped
unrun.

A SIGKILLed worker with outcomes queued, on Redis, is in
``tests/integration/test_claims_ahead_processes.py``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    Job,
    JobRecord,
    Status,
    StoreUnavailableError,
    Task,
    Workflow,
    get_job_store,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.drivers.dramatiq.completion import Completions
from pypepper_dramatiq.engine.step_io import StepIO
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .conftest import CHANNEL, workflow_middleware

JOBS = 12
TIMEOUT_MS = 20_000
#: Long enough for a lease to lapse and the sweep to send the step again.
RECOVERY_SECONDS = 30.0

_lock = threading.Lock()
RUNS: Counter[str] = Counter()


@workflow_task(name="driver-completion.count")
def count(task: Task, context: Context, key: str) -> None:
    with _lock:
        RUNS[key] += 1


@pytest.fixture
def setup_options() -> dict[str, Any]:
    return {"claim_fetched": True}


class WriterThreads(MemoryJobStore):
    """A memory store that remembers which threads wrote outcomes in batches, and
    whose first ``failures`` batch writes raise, as an outage would."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.threads: Counter[str] = Counter()
        self.rows: list[int] = []

    def advance_each(self, records: Sequence[JobRecord]) -> list[bool | Exception]:
        with _lock:
            self.threads[threading.current_thread().name] += 1
            self.rows.append(len(records))
            if self.failures > 0:
                self.failures -= 1
                raise StoreUnavailableError("the database went away mid-batch")
        return super().advance_each(records)


def schedule(n: int = JOBS) -> tuple[list[str], list[Job]]:
    keys = [uuid.uuid4().hex for _ in range(n)]
    jobs = []
    for key in keys:
        job = Job(category="completion", channel_id=CHANNEL)
        job.workflows.append(Workflow([count.task(name="count", key=key)]))
        job.scheduled()
        jobs.append(job)
    return keys, jobs


def statuses(jobs: list[Job]) -> list[Status | None]:
    rows = [get_job_store().get(job.id) for job in jobs]
    return [row.status if row else None for row in rows]


def wait_until_ended(jobs: list[Job]) -> list[Status | None]:
    """The jobs' statuses once none is InProgress or Scheduled (or the time is up)."""
    deadline = time.monotonic() + RECOVERY_SECONDS
    while time.monotonic() < deadline:
        found = statuses(jobs)
        if all(status is Status.COMPLETED for status in found):
            break
        time.sleep(0.1)
    return statuses(jobs)


def test_the_worker_threads_leave_their_outcomes_to_the_completion_thread(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker]
) -> None:
    store = set_job_store(WriterThreads())
    assert isinstance(store, WriterThreads)
    keys, jobs = schedule()
    start_worker()
    stub_broker.join(CHANNEL, timeout=TIMEOUT_MS, fail_fast=True)

    # Joined on the queue: every message was acknowledged, so every outcome recorded.
    assert statuses(jobs) == [Status.COMPLETED] * JOBS
    assert [RUNS[key] for key in keys] == [1] * JOBS
    # Every outcome was written by the completion thread; no worker thread wrote one.
    assert set(store.threads) == {"pypepper-completion"}
    assert workflow_middleware(stub_broker).book.outcomes.stats.calls == 0
    assert sum(store.rows) == JOBS


def test_a_store_down_while_recording_tells_each_job_and_loses_none(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="pypepper_dramatiq")
    middleware = workflow_middleware(stub_broker)
    # Every try of the first batch fails: its jobs are not recorded.
    store = set_job_store(WriterThreads(failures=middleware.book.write_attempts))
    assert isinstance(store, WriterThreads)
    keys, jobs = schedule()
    start_worker()
    stub_broker.join(CHANNEL, timeout=TIMEOUT_MS, fail_fast=True)

    assert store.failures == 0
    told = {
        record.job_id  # type: ignore[attr-defined]
        for record in caplog.records
        if getattr(record, "action", None) == "outcome_not_recorded"
    }
    # The first batch's jobs were each told (its size: the first batch write's rows).
    assert len(told) == store.rows[0] >= 1
    # None lost: the lease of each step whose outcome was never recorded lapses, and
    # recovery runs it again; the others ran once.
    assert wait_until_ended(jobs) == [Status.COMPLETED] * JOBS
    assert {job.id: RUNS[key] for job, key in zip(jobs, keys, strict=True)} == {
        job.id: 2 if job.id in told else 1 for job in jobs
    }


def test_a_store_blip_while_recording_is_retried_in_one_batch_none_run_twice(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker]
) -> None:
    store = set_job_store(WriterThreads(failures=2))
    assert isinstance(store, WriterThreads)
    keys, jobs = schedule()
    start_worker()
    stub_broker.join(CHANNEL, timeout=TIMEOUT_MS, fail_fast=True)

    assert store.failures == 0
    assert statuses(jobs) == [Status.COMPLETED] * JOBS
    assert [RUNS[key] for key in keys] == [1] * JOBS


def test_a_message_redelivered_after_its_record_finds_its_step_done(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if the worker died between the record and the acknowledgement: the broker
    # delivers each message again (here: a copy, enqueued before the ack).
    acknowledge = Completions._acknowledge
    copies: list[str] = []

    def redelivered(self: Completions, consumer: Any, messages: list[Any]) -> None:
        for message in messages:
            if message.message_id not in copies:
                copies.append(message.message_id)
                stub_broker.enqueue(Message(**message.asdict()))
        acknowledge(self, consumer, messages)

    monkeypatch.setattr(Completions, "_acknowledge", redelivered)
    keys, jobs = schedule()
    start_worker()
    stub_broker.join(CHANNEL, timeout=TIMEOUT_MS, fail_fast=True)

    assert len(copies) == JOBS
    assert statuses(jobs) == [Status.COMPLETED] * JOBS
    # Each copy's claim found the step done: dropped unrun, nothing dead-lettered.
    assert [RUNS[key] for key in keys] == [1] * JOBS
    assert stub_broker.dead_letters == []


def test_a_cancel_while_the_outcome_waits_wins_and_keeps_the_attempt(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting, go_on = threading.Event(), threading.Event()
    record_outcomes = StepIO.record_outcomes

    def held(self: StepIO, finished: Any) -> Any:
        waiting.set()
        go_on.wait(TIMEOUT_MS / 1000)
        return record_outcomes(self, finished)

    monkeypatch.setattr(StepIO, "record_outcomes", held)
    [key], [job] = schedule(1)
    start_worker()
    assert waiting.wait(TIMEOUT_MS / 1000)
    # The task ran; its outcome waits in the completion thread.
    assert RUNS[key] == 1
    assert Job.cancel_saved(job.id)
    go_on.set()
    stub_broker.join(CHANNEL, timeout=TIMEOUT_MS, fail_fast=True)

    record = get_job_store().get(job.id)
    assert record is not None
    assert record.status is Status.CANCELLED
    assert RUNS[key] == 1
    # The outcome lost its compare-and-set to the cancel; the attempt is kept.
    [entry] = record.state["history"]["0.0"]
    assert entry["outcome"] == "cancelled"
