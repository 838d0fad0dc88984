"""Retries keep the job's start deadline (``max_start_delay``), on both drivers and
every store.

A retry (the next attempt of a task whose previous attempt failed) picked up
after the deadline ends the job Cancelled before the task runs again; one picked
up in time runs; an attempt that is running when the deadline passes is not cut
short (its own retry, if it fails, comes too late).
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta

import pytest

from pypepper_dramatiq import Context, Job, Status, Task, set_job_store, workflow_task
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .drivers import Driver, make_job

_lock = threading.Lock()
CALLS: dict[str, int] = defaultdict(int)
#: How long a task that outlives the deadline waits for it at most (a hang, not a speed).
DEADLINE_WAIT = 20.0


@workflow_task(name="retry-deadlines.flaky")
def flaky(
    task: Task, context: Context, *, key: str, fail_first: int = 1, outlive: bool = False
) -> str:
    """Fails its first ``fail_first`` calls; with ``outlive``, each call first waits
    until the job's start deadline has passed (read from its row)."""
    with _lock:
        CALLS[key] += 1
        call = CALLS[key]
    if outlive:
        record = Job.get_saved(str(context.job_id))
        assert record is not None and record.start_deadline is not None
        cancel = context.cancel_event
        assert cancel is not None
        give_up = utcnow() + timedelta(seconds=DEADLINE_WAIT)
        while utcnow() <= record.start_deadline and utcnow() < give_up:
            cancel.wait(0.01)
    if call <= fail_first:
        raise RuntimeError(f"{key}: planned failure {call}")
    return "ok"


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


@pytest.fixture
def key() -> Iterator[str]:
    value = uuid.uuid4().hex[:8]
    yield value
    with _lock:
        CALLS.pop(value, None)


SQL = {"postgres": "pg_store", "mysql": "mysql_store"}


@pytest.fixture(
    params=[
        "memory",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def store(request: pytest.FixtureRequest) -> IJobStore:
    """The job store the driver's workers use, installed after ``setup()`` (a SQL
    store is built before the driver, so that it closes after the driver stopped)."""
    found: IJobStore = (
        MemoryJobStore()
        if request.param == "memory"
        else request.getfixturevalue(SQL[request.param])
    )
    request.getfixturevalue("driver")
    return set_job_store(found)


def _run(driver: Driver, job: Job, max_start_delay: float) -> Job:
    job.scheduled(max_start_delay=max_start_delay)
    driver.start()
    driver.wait(job)
    return job


def test_a_retry_picked_up_after_the_deadline_cancels_the_job_unrun(
    driver: Driver, store: IJobStore, key: str
) -> None:
    # The retry cannot come before 1.5s; the deadline is 0.5s after the start.
    job = make_job([flaky.options(retry_count=3, retry_delay=1.5).task(name="t", key=key)])

    _run(driver, job, max_start_delay=0.5)

    record = store.get(job.id)
    assert record is not None and record.status is Status.CANCELLED, record
    assert calls(key) == 1
    assert record.error is not None
    assert record.error.startswith("start deadline passed: the retry of task t was not picked up")
    assert record.state["attempts"] == {"0.0": 1}
    assert record.lease_owner is None


def test_a_retry_picked_up_in_time_runs(driver: Driver, store: IJobStore, key: str) -> None:
    job = make_job([flaky.options(retry_count=3, retry_delay=0.05).task(name="t", key=key)])

    _run(driver, job, max_start_delay=60)

    record = store.get(job.id)
    assert record is not None and record.status is Status.COMPLETED, record
    assert calls(key) == 2


def test_an_attempt_running_past_the_deadline_is_not_interrupted(
    driver: Driver, store: IJobStore, key: str
) -> None:
    # Two tasks: the first runs across the deadline and succeeds; the second's first
    # attempt is no retry, and runs; its retry (no delay) comes after the deadline.
    job = make_job(
        [
            flaky.task(name="across", key=f"{key}:across", fail_first=0, outlive=True),
            flaky.options(retry_count=3).task(name="next", key=f"{key}:next"),
        ]
    )

    # 2 s, not less: the deadline counts from the submit, before the driver's worker
    # boots, and a busy machine's RabbitMQ worker missed 0.3 s (the task waits for the
    # deadline whatever it is).
    _run(driver, job, max_start_delay=2.0)

    record = store.get(job.id)
    assert record is not None and record.status is Status.CANCELLED, record
    assert calls(f"{key}:across") == 1 and calls(f"{key}:next") == 1
    assert record.error is not None and "the retry of task next" in record.error
    assert record.state["results"] == {"0.0": "ok"}
