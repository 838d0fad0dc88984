"""``async def`` tasks on both drivers: the in-process Worker and the Dramatiq middleware.

Each scenario schedules a job of async ``@workflow_task`` functions (or an
async Dramatiq actor) and lets a driver run it to the end. The coroutines
record what happened to them (ran, finished, were cancelled) in module-level
tables under a lock, so a test sees that the body really ran, or that it was
stopped rather than left running.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import Context, Job, Status, Task, actor_task, workflow_task

from .drivers import (
    JOB_TIMEOUT,
    DramatiqDriver,
    Driver,
    make_job,
    run,
)

_lock = threading.Lock()
#: What happened to each coroutine, per key: "start", "end", "cancelled", "finally".
TRACE: dict[str, list[str]] = defaultdict(list)
#: What a task saw, per key.
SEEN: dict[str, Any] = {}
#: Set when a coroutine starts, per key.
STARTED: dict[str, threading.Event] = defaultdict(threading.Event)


def _note(key: str, what: str) -> int:
    """Record ``what`` for ``key``; returns how many "start"s ``key`` has had."""
    with _lock:
        TRACE[key].append(what)
        if what == "start":
            STARTED[key].set()
        return TRACE[key].count("start")


def trace(key: str) -> list[str]:
    with _lock:
        return list(TRACE[key])


def _started(key: str) -> threading.Event:
    with _lock:
        return STARTED[key]


# -- the tasks ------------------------------------------------------------------------------


@workflow_task(name="driver-async.compute")
async def compute(task: Task, context: Context, key: str, n: int) -> dict[str, Any]:
    """Awaits, then returns a value that depends on its params."""
    _note(key, "start")
    await asyncio.sleep(0.01)
    _note(key, "end")
    return {"n": n * 2, "job": context.job_id}


@workflow_task(name="driver-async.read")
def read(task: Task, context: Context, key: str, source: str) -> Any:
    """A plain task after an async one: reads the result the async task returned."""
    with _lock:
        SEEN[key] = context.results.get(source)
    return "read"


@workflow_task(name="driver-async.sleepy")
async def sleepy(
    task: Task, context: Context, key: str, seconds: float, slow_calls: int = 1
) -> str:
    """``await asyncio.sleep(seconds)`` on its first ``slow_calls`` calls; quick after."""
    call = _note(key, "start")
    if call > slow_calls:
        return "quick"
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _note(key, "cancelled")
        raise
    finally:
        _note(key, "finally")
    _note(key, "end")
    return "slept"


@workflow_task(name="driver-async.broken")
async def broken(task: Task, context: Context, key: str) -> None:
    """Raises after an await."""
    call = _note(key, "start")
    await asyncio.sleep(0)
    raise ValueError(f"{key}: async failure {call}")


@workflow_task(name="driver-async.hog")
async def hog(task: Task, context: Context, key: str, seconds: float) -> str:
    """Blocks its event loop (no await) for ``seconds``: only a thread interrupt stops it."""
    _note(key, "start")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(0.01)
    except BaseException as exc:
        _note(key, f"interrupted:{type(exc).__name__}")
        raise
    _note(key, "end")
    return "hogged"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix for this test's keys; its traces are dropped afterwards."""
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for table in (TRACE, SEEN, STARTED):
            for key in [k for k in table if k.startswith(value)]:
                del table[key]


def stored_results(record: Any) -> dict[str, Any]:
    """Results the Dramatiq driver stored in the row, by ``workflow.task``."""
    results = record.state.get("results", {})
    assert isinstance(results, dict)
    return results


# -- (a) the body runs and its value is the result ------------------------------------------


def test_an_async_task_runs_and_returns_its_value(driver: Driver, prefix: str) -> None:
    job = make_job(
        [
            compute.task(name="compute", key=f"{prefix}compute", n=21),
            read.task(name="read", key=f"{prefix}read", source="compute"),
        ]
    )

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    assert trace(f"{prefix}compute") == ["start", "end"]
    assert SEEN[f"{prefix}read"] == {"n": 42, "job": job.id}
    if isinstance(driver, DramatiqDriver):
        assert stored_results(record)["0.0"] == {"n": 42, "job": job.id}


@dramatiq.actor(actor_name="driver-async-actor", broker=StubBroker())
async def async_actor(key: str, n: int) -> int:
    """A plain async Dramatiq actor (declared on a throwaway broker: only its function runs)."""
    _note(key, "start")
    await asyncio.sleep(0.01)
    _note(key, "end")
    return n + 1


def test_an_async_dramatiq_actor_runs_as_a_task(driver: Driver, prefix: str) -> None:
    """No AsyncIO middleware is set up: the step runs the actor's coroutine itself."""
    job = make_job(
        [
            actor_task(async_actor, name="actor", key=f"{prefix}actor", n=41),
            read.task(name="read", key=f"{prefix}read", source="actor"),
        ]
    )

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED, record.error
    assert trace(f"{prefix}actor") == ["start", "end"]
    assert SEEN[f"{prefix}read"] == 42


# -- (b) round_timeout -----------------------------------------------------------------------


def test_an_async_task_past_round_timeout_is_stopped_and_retried(
    driver: Driver, prefix: str
) -> None:
    """The first attempt awaits 30 s under round_timeout=1; it is cancelled, the retry is quick."""
    key = f"{prefix}sleepy"
    job = make_job(
        [sleepy.options(round_timeout=1, retry_count=1).task(name="t", key=key, seconds=30)]
    )
    began = time.monotonic()

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED, record.error
    assert time.monotonic() - began < 10
    assert trace(key) == ["start", "cancelled", "finally", "start"]


def test_an_async_task_past_round_timeout_fails_with_a_timeout(driver: Driver, prefix: str) -> None:
    key = f"{prefix}sleepy"
    job = make_job(
        [sleepy.options(round_timeout=1).task(name="t", key=key, seconds=30, slow_calls=5)]
    )

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert record.error is not None
    assert "TaskTimeoutError" in record.error and "round_timeout" in record.error
    assert trace(key) == ["start", "cancelled", "finally"]


def test_dramatiq_time_limit_stops_an_async_task_that_blocks_its_loop(
    stub_broker: StubBroker, start_worker: Callable[[], dramatiq.Worker], prefix: str
) -> None:
    """A coroutine that never awaits cannot be cancelled; Dramatiq's TimeLimit interrupts it.

    The interrupt lands inside the coroutine; the attempt fails (and is
    retried), and nothing of the first attempt keeps running.
    """
    driver = DramatiqDriver(stub_broker, start_worker)
    key = f"{prefix}hog"
    job = make_job([hog.options(round_timeout=1, retry_count=1).task(name="t", key=key, seconds=8)])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert record.error is not None and "round_timeout" in record.error
    assert trace(key) == ["start", "interrupted:TimeLimitExceeded"] * 2


# -- (c) cancel -----------------------------------------------------------------------------


@pytest.mark.parametrize("by_id", [False, True], ids=["job.cancel", "Job.cancel_saved"])
def test_cancel_stops_an_async_task_while_it_awaits(
    driver: Driver, prefix: str, by_id: bool
) -> None:
    key = f"{prefix}sleepy"
    job = make_job(
        [
            sleepy.options(retry_count=3).task(name="t", key=key, seconds=30),
            read.task(name="after", key=f"{prefix}after", source="t"),
        ]
    )
    job.scheduled()
    driver.start()
    assert _started(key).wait(JOB_TIMEOUT), "the task never started"

    cancelled_at = time.monotonic()
    assert Job.cancel_saved(job.id) if by_id else job.cancel()
    [record] = driver.wait(job)

    assert record.status is Status.CANCELLED
    assert trace(key) == ["start", "cancelled", "finally"]  # stopped, and not retried
    # Within a lease renewal (about a second) on the Dramatiq driver, at once in process.
    assert time.monotonic() - cancelled_at < 5
    assert f"{prefix}after" not in SEEN


# -- (d) an exception -----------------------------------------------------------------------


def test_an_exception_in_a_coroutine_is_a_failed_attempt(driver: Driver, prefix: str) -> None:
    key = f"{prefix}broken"
    job = make_job([broken.options(retry_count=1).task(name="t", key=key)])

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    assert trace(key) == ["start", "start"]
    assert record.error is not None
    assert "ValueError" in record.error and f"{key}: async failure 2" in record.error


def test_the_channel_of_async_jobs_drains(driver: Driver, prefix: str) -> None:
    """Several async jobs in a row: each gets a loop of its own, none is left behind."""
    jobs = [make_job([compute.task(name="c", key=f"{prefix}c{i}", n=i)]) for i in range(4)]

    records = run(driver, *jobs)

    assert {r.status for r in records} == {Status.COMPLETED}
    assert all(trace(f"{prefix}c{i}") == ["start", "end"] for i in range(4))
