"""``Job.wait()``: waiting for a job's outcome, on both drivers (the ``driver`` fixture).

Where a test says ``no_poll``, the fallback poll is pushed out to a minute, so
that only the notice the job's end sends (here, in this process: the stub
broker has no Redis) can wake the wait within the test's time. The last test
sends no notice at all and relies on the poll.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq import (
    AmbiguousTaskNameError,
    Context,
    Job,
    JobCancellationError,
    JobRecord,
    NoTaskResultError,
    PypepperError,
    Status,
    Task,
    UnknownJobError,
    WaitInsideJobError,
    WaitTimeoutError,
    get_job_store,
    workflow_task,
)
from pypepper_dramatiq.channels import end_notices as notices
from pypepper_dramatiq.records.record import utcnow

from .drivers import JOB_TIMEOUT, Driver, make_job

_lock = threading.Lock()
#: Signals from tasks to the test ("<key>:started"), per key.
EVENTS: dict[str, threading.Event] = defaultdict(threading.Event)


def _event(key: str) -> threading.Event:
    with _lock:
        return EVENTS[key]


@workflow_task(name="driver-wait.work", retry_count=0)
def work(
    task: Task, context: Context, key: str, seconds: float = 0.0, fail: bool = False, value: Any = 1
) -> Any:
    """Says it started, works ``seconds``, then fails or returns ``value``."""
    _event(f"{key}:started").set()
    time.sleep(seconds)
    if fail:
        raise RuntimeError(f"{key} failed as planned")
    return value


@workflow_task(name="driver-wait.until-cancelled")
def until_cancelled(task: Task, context: Context, key: str) -> str:
    _event(f"{key}:started").set()
    deadline = time.monotonic() + JOB_TIMEOUT
    while not context.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    return "stopped"


@workflow_task(name="driver-wait.quit")
def quit_job(task: Task, context: Context, key: str) -> None:
    time.sleep(0.3)
    raise JobCancellationError(f"{key}: nothing to do")


def _outcome(call: Any) -> dict[str, Any]:
    try:
        record = call()
    except PypepperError as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"status": record.status.value}


@workflow_task(name="driver-wait.waits")
def waits(task: Task, context: Context, job_id: str | None = None) -> dict[str, Any]:
    """Waits (1 s at most) for job ``job_id``, or its own job; says what happened."""
    target = job_id or context.job_id
    return _outcome(lambda: Job.wait_saved(target, timeout=1))


@workflow_task(name="driver-wait.waits-async")
async def waits_async(task: Task, context: Context) -> dict[str, Any]:
    """An async task awaiting its own job."""
    try:
        record = await Job.wait_saved_async(context.job_id or "", timeout=1)
    except PypepperError as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"status": record.status.value}


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for key in [k for k in EVENTS if k.startswith(value)]:
            del EVENTS[key]


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a notice can wake a wait during the test (the poll comes after a minute)."""
    monkeypatch.setattr(notices, "POLL_SECONDS", 60.0)


def _since(record: JobRecord) -> float:
    """Seconds from the job's stored end to now."""
    return (utcnow() - record.updated).total_seconds()


# -- how it ended -----------------------------------------------------------------------------


def test_wait_returns_the_record_of_a_completed_job(
    driver: Driver, prefix: str, no_poll: None
) -> None:
    job = make_job(
        [
            work.task(name="fetch", key=f"{prefix}fetch", seconds=0.3, value={"rows": 3}),
            work.task(name="load", key=f"{prefix}load", value="loaded"),
        ]
    )
    job.scheduled()
    driver.start()
    record = job.wait(timeout=JOB_TIMEOUT)
    late = _since(record)

    assert record.status is Status.COMPLETED
    assert record.results_by_name() == {"fetch": {"rows": 3}, "load": "loaded"}
    assert record.error is None
    assert late < 1.0  # woken by the job's end, not by the (minute-long) poll
    assert job.result("load") == "loaded" and job.result("fetch") == {"rows": 3}
    [stored] = driver.wait(job)
    assert stored.version == record.version


def test_wait_returns_the_record_of_a_failed_job(
    driver: Driver, prefix: str, no_poll: None
) -> None:
    job = make_job(
        [
            work.task(name="fetch", key=f"{prefix}fetch", value=7),
            work.task(name="load", key=f"{prefix}load", seconds=0.3, fail=True),
        ]
    )
    job.scheduled()
    driver.start()
    record = Job.wait_saved(job.id, timeout=JOB_TIMEOUT)

    assert record.status is Status.FAILED
    assert record.error is not None and "failed as planned" in record.error
    assert "failed as planned" in record.state["errors"]["0.1"]
    assert record.result("fetch") == 7
    with pytest.raises(NoTaskResultError, match="it failed"):
        job.result("load")
    assert _since(record) < 1.0
    driver.wait(job)


@pytest.mark.parametrize("how", ["cancel", "cancel_saved", "task"])
def test_wait_returns_when_the_job_is_cancelled(
    driver: Driver, prefix: str, no_poll: None, how: str
) -> None:
    key = f"{prefix}long"
    if how == "task":  # the task raises JobCancellationError
        job = make_job([quit_job.task(name="quit", key=key)])
    else:
        job = make_job([until_cancelled.task(name="long", key=key)])
    job.scheduled()
    driver.start()
    if how != "task":
        assert _event(f"{key}:started").wait(JOB_TIMEOUT)
        cancel = job.cancel if how == "cancel" else (lambda: Job.cancel_saved(job.id))
        threading.Timer(0.3, cancel).start()
    record = job.wait(timeout=JOB_TIMEOUT)

    assert record.status is Status.CANCELLED
    assert _since(record) < 1.0
    driver.wait(job)


def test_wait_returns_when_a_parent_failure_ends_the_job(
    driver: Driver, prefix: str, no_poll: None
) -> None:
    parent = make_job([work.task(name="p", key=f"{prefix}p", seconds=0.3, fail=True)])
    child = make_job([work.task(name="c", key=f"{prefix}c")])
    parent.scheduled()
    child.scheduled(after=[parent])
    driver.start()
    record = child.wait(timeout=JOB_TIMEOUT)

    assert record.status is Status.FAILED
    assert record.error is not None and parent.id in record.error
    assert _since(record) < 1.0
    driver.wait(parent, child)


def test_wait_returns_when_the_start_deadline_cancels_the_job(
    driver: Driver, prefix: str, no_poll: None
) -> None:
    job = make_job([work.task(name="late", key=f"{prefix}late")])
    job.scheduled(delay=0.5, max_start_delay=0)
    driver.start()
    record = job.wait(timeout=JOB_TIMEOUT)

    assert record.status is Status.CANCELLED
    assert record.error is not None and "start deadline passed" in record.error
    assert not _event(f"{prefix}late:started").is_set()
    assert _since(record) < 1.0
    driver.wait(job)


# -- the calls themselves ---------------------------------------------------------------------


def test_a_wait_on_an_ended_job_returns_at_once_with_one_read(
    driver: Driver, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job([work.task(name="t", key=f"{prefix}t")])
    job.scheduled()
    driver.start()
    driver.wait(job)
    store = get_job_store()
    reads: list[str] = []
    get = store.get

    def counted(job_id: str) -> JobRecord | None:
        reads.append(job_id)
        return get(job_id)

    monkeypatch.setattr(store, "get", counted)
    started = time.monotonic()
    record = job.wait(timeout=0)  # no time at all is needed
    elapsed = time.monotonic() - started

    assert record.status is Status.COMPLETED
    assert reads == [job.id]
    assert elapsed < 0.1
    assert asyncio.run(job.wait_async()).status is Status.COMPLETED
    assert reads == [job.id, job.id]


def test_wait_gives_up_after_its_timeout(driver: Driver, prefix: str) -> None:
    job = make_job([work.task(name="t", key=f"{prefix}t")])
    job.scheduled()  # no worker runs it

    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as raised:
        job.wait(timeout=0.3)
    elapsed = time.monotonic() - started

    assert 0.3 <= elapsed < 1.0
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, PypepperError)
    assert raised.value.job_id == job.id and raised.value.status == "Scheduled"
    assert job.id in str(raised.value)
    with pytest.raises(TimeoutError):
        Job.wait_saved(job.id, timeout=timedelta(0))
    with pytest.raises(TimeoutError):
        asyncio.run(job.wait_async(timeout=0.1))
    with pytest.raises(ValueError, match="timeout"):
        job.wait(timeout=-1)
    with pytest.raises(TypeError, match="timeout"):
        job.wait(timeout="1")  # type: ignore[arg-type]


def test_an_unknown_or_vanished_job_raises_unknown_job_error(driver: Driver, prefix: str) -> None:
    missing = f"{prefix}missing"
    with pytest.raises(UnknownJobError, match="missing"):
        Job.wait_saved(missing)
    with pytest.raises(UnknownJobError):
        asyncio.run(Job.wait_saved_async(missing))
    with pytest.raises(UnknownJobError):
        Job(id=missing).result("t")

    job = make_job([work.task(name="t", key=f"{prefix}t")])
    job.scheduled()  # no worker runs it
    store = get_job_store()
    threading.Timer(0.2, store.delete, [job.id]).start()  # as retention would, unannounced
    started = time.monotonic()
    with pytest.raises(UnknownJobError):
        job.wait(timeout=JOB_TIMEOUT)
    assert time.monotonic() - started < notices.POLL_SECONDS + 1


def test_result_reads_one_task_of_the_stored_row(driver: Driver, prefix: str) -> None:
    job = make_job(
        [
            work.task(name="fetch", key=f"{prefix}f0", value="first"),
            work.options(optional=True).task(name="extra", key=f"{prefix}x", fail=True),
        ],
        [work.task(name="fetch", key=f"{prefix}f1", value="second")],
    )
    job.scheduled()
    with pytest.raises(NoTaskResultError, match="not produced a result yet"):
        job.result("fetch", workflow=0)  # the row as it is now: not run yet
    driver.start()
    record = job.wait(timeout=JOB_TIMEOUT)

    assert record.status is Status.COMPLETED
    assert job.result("fetch", workflow=0) == "first"
    assert job.result("fetch", workflow=1) == "second"
    with pytest.raises(AmbiguousTaskNameError, match="workflow="):
        job.result("fetch")
    with pytest.raises(NoTaskResultError, match="skipped"):
        job.result("extra")
    with pytest.raises(NoTaskResultError, match="no task named 'nope'"):
        job.result("nope")
    driver.wait(job)


def test_wait_async_does_not_block_the_event_loop(
    driver: Driver, prefix: str, no_poll: None
) -> None:
    jobs = [
        make_job([work.task(name="t", key=f"{prefix}{i}", seconds=0.3, value=i)]) for i in range(3)
    ]
    for job in jobs:
        job.scheduled()
    driver.start()

    async def late(wait: Any) -> tuple[JobRecord, float]:
        record = await wait
        return record, _since(record)

    async def main() -> tuple[list[tuple[JobRecord, float]], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        running = asyncio.create_task(ticker())
        records = await asyncio.gather(
            late(jobs[0].wait_async(timeout=JOB_TIMEOUT)),
            late(jobs[1].wait_async(timeout=JOB_TIMEOUT)),
            late(Job.wait_saved_async(jobs[2].id, timeout=JOB_TIMEOUT)),
        )
        done.set()
        await running
        with pytest.raises(RuntimeError, match="wait_async"):
            jobs[0].wait()  # the blocking call is refused inside the loop
        return list(records), ticks

    started = time.monotonic()
    timed, ticks = asyncio.run(main())
    elapsed = time.monotonic() - started
    records = [record for record, _ in timed]

    assert [r.status for r in records] == [Status.COMPLETED] * 3
    assert [r.result("t") for r in records] == [0, 1, 2]
    assert max(late for _, late in timed) < 1.0  # each woken by its job's end
    assert ticks >= elapsed / 0.01 / 3  # the loop kept running while it waited
    driver.wait(*jobs)


def test_a_task_may_not_wait_for_its_own_job(driver: Driver, prefix: str) -> None:
    other = make_job([work.task(name="t", key=f"{prefix}other")])
    other.scheduled()
    job = make_job(
        [
            waits.task(name="other", job_id=other.id),
            waits.task(name="own"),
            waits.options(round_timeout=10).task(name="own-in-pool"),
            waits_async.task(name="own-async"),
        ]
    )
    job.scheduled()
    driver.start()
    record = job.wait(timeout=JOB_TIMEOUT)

    assert record.status is Status.COMPLETED
    assert record.result("other") == {"status": "Completed"}  # another job: allowed
    for name in ("own", "own-in-pool", "own-async"):
        outcome = record.result(name)
        assert outcome["raised"] == "WaitInsideJobError", (name, outcome)
        assert job.id in outcome["message"]
    assert issubclass(WaitInsideJobError, PypepperError)
    driver.wait(other, job)


def test_wait_returns_when_no_notice_is_published(driver: Driver, prefix: str) -> None:
    job = make_job([work.task(name="t", key=f"{prefix}t")])
    job.scheduled()  # no worker runs it: the row is ended below, by hand
    store = get_job_store()
    ended_at: list[float] = []

    def end_silently() -> None:
        record = store.get(job.id)
        assert record is not None
        ended_at.append(time.monotonic())
        assert store.advance(record.evolve(status=Status.CANCELLED, updated=utcnow()))

    threading.Timer(0.3, end_silently).start()
    record = job.wait(timeout=JOB_TIMEOUT)
    returned = time.monotonic()

    assert record.status is Status.CANCELLED
    assert ended_at and returned - ended_at[0] <= notices.POLL_SECONDS + 0.5
