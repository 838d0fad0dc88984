"""Poison text and refused writes, on both drivers and every store.

A task's exception text and progress note are the task's own: a NUL or a lone
surrogate in them is stored escaped, and the job runs its retry table to the
end (PostgreSQL once refused the outcome write, and the step ran again after
each lapsed lease, forever). A write the store refuses for its content is
recorded as a failed attempt naming the refusal; a claim or heal refused so
dead-letters its message instead of deferring it forever.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from refusals import HALVES, POISON, refusing

from pypepper_dramatiq import (
    Context,
    IJobStore,
    Job,
    JobRecord,
    Status,
    Task,
    Worker,
    Workflow,
    get_job_store,
    manager,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.step_io import StepIO
from pypepper_dramatiq.errors import StoreDataError
from pypepper_dramatiq.limits.storable import ERROR_LENGTH
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.base import StepClaim, utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .conftest import CHANNEL
from .drivers import Driver, make_job, run

#: Runs of each job's task body, by job id.
RUNS: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()

#: The fixtures of each SQL store: the store, and its database's URI.
SQL = {"postgres": ("pg_store", "postgres_uri"), "mysql": ("mysql_store", "mysql_uri")}
#: retry_count=2: three attempts, then the job fails.
ATTEMPTS = 3


def _ran(context: Context) -> None:
    with _lock:
        RUNS[context.job_id] += 1


@workflow_task(name="data-errors.poison-text", retry_count=ATTEMPTS - 1)
def poison_text(task: Task, context: Context, *, in_note: bool = False) -> None:
    """Fails every attempt; a NUL and a lone surrogate in its error (or its note)."""
    _ran(context)
    if in_note:
        context.progress(1, 2, note="half\x00way \udc80")
        raise RuntimeError("planned failure")
    raise RuntimeError("bad\x00byte, lone \udc80")


#: An error text of 70,000 characters of two bytes each: 140,000 bytes, more than
#: MySQL's TEXT column holds (65,535 bytes).
LONG_ERROR = "é" * 70_000


@workflow_task(name="data-errors.long-error", retry_count=ATTEMPTS - 1)
def long_error(task: Task, context: Context) -> None:
    """Fails every attempt with an error far longer than a row's error column holds."""
    _ran(context)
    raise RuntimeError(LONG_ERROR)


def poison_hook(task: Task, context: Context, error: str) -> None:
    """An ``on_final_failure`` hook whose own error holds a NUL."""
    raise RuntimeError("hook\x00failed")


@workflow_task(name="data-errors.fails-with-hook", on_final_failure=poison_hook)
def fails_with_hook(task: Task, context: Context) -> None:
    """Fails its one attempt; its hook is :func:`poison_hook`."""
    _ran(context)
    raise RuntimeError("task failed")


@workflow_task(name="data-errors.refused-result", retry_count=ATTEMPTS - 1)
def refused_result(task: Task, context: Context, *, first: str, second: str) -> str:
    """Returns text the database refuses (while ``refusing`` is in force)."""
    _ran(context)
    return first + second


@pytest.fixture(
    params=[
        "memory",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def store(request: pytest.FixtureRequest) -> IJobStore:
    """The job store the driver's workers use, installed after ``setup()``.

    A SQL store is set up before the driver, so that it is closed only after the
    driver's worker and background threads stopped using it.
    """
    found: IJobStore = (
        MemoryJobStore()
        if request.param == "memory"
        else request.getfixturevalue(SQL[request.param][0])
    )
    request.getfixturevalue("driver")
    return set_job_store(found)


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def refusing_store(request: pytest.FixtureRequest) -> Iterator[IJobStore]:
    """A SQL store whose database refuses rows holding ``POISON`` during the test
    (set up before the driver, as ``store``)."""
    store_fixture, uri_fixture = SQL[request.param]
    found: IJobStore = request.getfixturevalue(store_fixture)
    uri = str(request.getfixturevalue(uri_fixture))
    request.getfixturevalue("driver")
    set_job_store(found)
    with refusing(uri):
        yield found


@pytest.mark.parametrize("where", ["error", "note"])
def test_poison_text_is_stored_escaped_and_the_job_ends_after_its_retries(
    store: IJobStore, driver: Driver, where: str
) -> None:
    job = make_job([poison_text.task(name="poison", in_note=where == "note")])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert RUNS[job.id] == ATTEMPTS
    assert record.state["attempts"]["0.0"] == ATTEMPTS
    entries = record.state["history"]["0.0"]
    assert len(entries) == ATTEMPTS
    if where == "error":
        assert record.error == "task poison failed: RuntimeError: bad\\x00byte, lone \\udc80"
        assert entries[-1]["message"] == "bad\\x00byte, lone \\udc80"
        assert "bad\\x00byte" in entries[-1]["traceback"]
    else:
        assert record.progress["0.0"]["note"] == "half\\x00way \\udc80"


def test_an_error_longer_than_the_column_is_stored_clipped_and_the_job_ends(
    store: IJobStore, driver: Driver
) -> None:
    # MySQL refused the 140,000-byte error ("Data too long for column 'error'"), and
    # the in-process worker tried the write again until its test timed out.
    job = make_job([long_error.task(name="long")])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert RUNS[job.id] == ATTEMPTS
    assert record.error is not None and len(record.error) == ERROR_LENGTH
    assert record.error.startswith("task long failed: RuntimeError: ééé")
    assert record.error.endswith("é...")
    assert record.state["history"]["0.0"][-1]["message"].startswith("ééé")


def test_a_hook_error_with_a_nul_is_stored_escaped(store: IJobStore, driver: Driver) -> None:
    job = make_job([fails_with_hook.task(name="hooked")])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    done = record.state["hooks_done"]["0.0"]
    assert done["error"] == "RuntimeError: hook\\x00failed"
    assert not record.state.get("hooks")  # marked done: it does not run again


def test_an_outcome_the_store_refuses_is_recorded_as_a_failed_attempt(
    refusing_store: IJobStore, driver: Driver
) -> None:
    job = make_job([refused_result.task(name="refused", first=HALVES[0], second=HALVES[1])])

    [record] = run(driver, job)

    # Each attempt's result was refused: each is a failure naming the refusal,
    # the retry table ran out, and nothing waited for a lease.
    assert record.status is Status.FAILED
    assert RUNS[job.id] == ATTEMPTS
    assert record.state["attempts"]["0.0"] == ATTEMPTS
    assert "0.0" not in record.state.get("results", {})
    assert "refused" not in job.context.results  # the job as its worker knows it
    assert record.error is not None
    assert "the job store refused this attempt's result" in record.error
    assert "://" not in record.error  # the database's words, not where it is
    assert POISON not in str(record.state)
    assert [e["error_type"] for e in record.state["history"]["0.0"]] == [
        "StoreDataError"
    ] * ATTEMPTS


def _poisoned_job() -> Job:
    """A job whose row the refusing database cannot take (never stored)."""
    job = Job(category="data-errors", channel_id=CHANNEL)
    job.workflows.append(Workflow([refused_result.task(name="t", first=POISON, second="")]))
    return job


@pytest.mark.postgres
def test_a_claim_batch_refused_for_one_row_still_claims_the_others(
    pg_store: IJobStore, postgres_uri: str
) -> None:
    # One multi-row UPDATE claims a batch of steps (group commit): a row the
    # database refuses fails it whole. Only that row's claim may meet the refusal.
    payload = {"workflows": [{"tasks": [{"name": "t", "executor_id": "x", "params": {}}]}]}
    good, bad = (
        JobRecord(
            id=uuid.uuid4().hex,
            channel_id=CHANNEL,
            status=Status.SCHEDULED,
            payload=payload,
            state=state,
        )
        for state in ({}, {"note": POISON})
    )
    assert pg_store.put(good) and pg_store.put(bad)
    now = utcnow()
    lease = now + timedelta(seconds=30)
    book = StepIO(lambda: pg_store, "worker-a", 30.0)
    with refusing(postgres_uri, existing=True):  # the poisoned row may no longer be written
        answers = book._claim_batch(
            [StepClaim(r.id, [0, 0, 0, 0], "worker-a", now, lease, True) for r in (good, bad)]
        )
    claimed, refused = answers
    assert isinstance(claimed, JobRecord) and claimed.lease_owner == "worker-a"
    assert isinstance(refused, StoreDataError)
    assert pg_store.delete(bad.id)  # no later CHECK may meet it


@pytest.mark.postgres
def test_a_refused_heal_dead_letters_the_message(
    pg_store: IJobStore,
    postgres_uri: str,
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
) -> None:
    # A first message whose row could not be stored by its producer: the worker
    # heals the row from the message, and the store refuses it for its content.
    set_job_store(pg_store)
    job = _poisoned_job()
    with refusing(postgres_uri):
        message = StepMessage(job.id, Position(), job.to_record()).to_message(CHANNEL)
        stub_broker.enqueue(message)
        start_worker()
        deadline = time.monotonic() + 30
        while not stub_broker.dead_letters:
            assert time.monotonic() < deadline, "the message was never dead-lettered"
            time.sleep(0.02)
        stub_broker.join(CHANNEL, timeout=30_000, fail_fast=False)
    [dead] = stub_broker.dead_letters
    assert dead.message_id == message.message_id
    assert stub_broker.queues[CHANNEL].qsize() == 0  # not deferred: not sent again
    assert RUNS[job.id] == 0
    assert pg_store.get(job.id) is None


@pytest.mark.postgres
def test_a_refused_start_fails_the_job_in_process_instead_of_requeuing_it(
    pg_store: IJobStore, postgres_uri: str, stub_broker: StubBroker
) -> None:
    set_job_store(pg_store)
    job = _poisoned_job()
    channel = manager.available(CHANNEL)
    job.scheduled()
    # Its row gone (purged, a restored database): the worker heals it from the job.
    assert pg_store.delete(job.id)
    with refusing(postgres_uri):
        channel.request_stop()
        # Drains and returns: no JobRequeuedError, no endless re-offer.
        asyncio.run(Worker(channel).run_forever())
    assert job.status is Status.FAILED
    assert job.error is not None and "refused" in job.error
    assert "://" not in job.error  # the database's words, not where it is
    assert RUNS[job.id] == 0
    assert get_job_store().get(job.id) is None
