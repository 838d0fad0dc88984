"""Job priorities on both drivers (the ``driver`` fixture runs each test on the
in-process Worker and on a ``dramatiq.Worker``).

A job's priority (0 to 9) is stored with it and carried by its messages; bad input is
refused before anything is stored or sent. The in-process Worker starts the waiting
jobs of its channel highest priority first, equal priorities in submit order.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    InvalidPriorityError,
    Job,
    Status,
    Task,
    get_job_store,
    manager,
    schedule_many,
    workflow_task,
)
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.job_io import release_held
from pypepper_dramatiq.records.record import utcnow

from .drivers import (
    CHANNEL,
    CallLog,
    Driver,
    InProcessDriver,
    emptied_around_each_test,
    make_job,
)

#: Each call's key, in call order.
CALLS: CallLog[str] = CallLog()
no_calls = emptied_around_each_test(CALLS)


@workflow_task(name="driver-priority.step")
def step(task: Task, context: Context, key: str) -> str:
    return CALLS.record(key)


@workflow_task(name="driver-priority.urgent", priority=6)
def urgent(task: Task, context: Context, key: str) -> str:
    return CALLS.record(key)


def keyed(key: str, priority: int | None = None) -> Job:
    job = make_job([step.options(retry_count=0).task(name="work", key=key)])
    if priority is not None:
        job.priority = priority
    return job


def stored_priority(job: Job) -> int:
    record = get_job_store().get(job.id)
    assert record is not None
    return Job.from_record(record).priority


def test_priorities_are_stored_and_every_job_completes(driver: Driver) -> None:
    low, high = keyed("low"), keyed("high")
    low.scheduled()
    high.scheduled(priority=7)
    batch = [keyed("batch-3", 3), keyed("batch-0")]
    assert all(isinstance(r, str) for r in schedule_many(batch))
    assert [stored_priority(j) for j in (low, high, *batch)] == [0, 7, 3, 0]
    # A plain job's row carries no priority at all: the bytes it had before.
    record = get_job_store().get(low.id)
    assert record is not None and "priority" not in record.state
    driver.start()
    records = driver.wait(low, high, *batch)
    assert [r.status for r in records] == [Status.COMPLETED] * 4
    assert sorted(CALLS) == ["batch-0", "batch-3", "high", "low"]
    # Kept through the run.
    assert [Job.from_record(r).priority for r in records] == [0, 7, 3, 0]


@workflow_task(name="driver-priority.fails")
def fails(task: Task, context: Context) -> None:
    raise RuntimeError("boom")


def test_a_retry_of_a_job_keeps_its_priority(driver: Driver) -> None:
    failing = make_job([fails.options(retry_count=0).task(name="f")])
    failing.scheduled(priority=5)
    driver.start()
    [record] = driver.wait(failing)
    assert record.status is Status.FAILED
    manager.available(CHANNEL).resume()  # the in-process driver stopped it to drain it
    retry_id = Job.retry_saved(failing.id)
    retried = get_job_store().get(retry_id)
    assert retried is not None and Job.from_record(retried).priority == 5


def test_the_in_process_worker_starts_higher_priorities_first(driver: Driver) -> None:
    if not isinstance(driver, InProcessDriver):
        pytest.skip("the Dramatiq driver's order is shown with real workers on Redis")
    plan = [("low-0", 0), ("low-1", 0), ("mid-0", 5), ("high-0", 9), ("mid-1", 5), ("low-2", 0)]
    jobs = [keyed(key) for key, _ in plan]
    for job, (_, priority) in zip(jobs, plan, strict=True):
        job.scheduled(priority=priority)
    driver.start()
    records = driver.wait(*jobs)
    assert [r.status for r in records] == [Status.COMPLETED] * len(jobs)
    # One job at a time: highest first, equal priorities in submit order.
    assert CALLS == ["high-0", "mid-0", "mid-1", "low-0", "low-1", "low-2"]


def test_a_job_takes_its_first_task_s_priority_unless_it_says(stub_broker: object) -> None:
    by_task = make_job([urgent.task(name="u", key="a"), step.task(name="s", key="a")])
    second = make_job([step.task(name="s", key="b"), urgent.task(name="u", key="b")])
    own = make_job([urgent.task(name="u", key="c")])
    own.priority = 1
    at_schedule = make_job([urgent.options(retry_count=1).task(name="u", key="d")])
    by_task.scheduled()
    second.scheduled()
    own.scheduled()
    at_schedule.scheduled(priority=0)
    batched = make_job([urgent.task(name="u", key="e")])
    schedule_many([batched])
    jobs = (by_task, second, own, at_schedule, batched)
    assert [stored_priority(job) for job in jobs] == [6, 0, 1, 0, 6]
    with pytest.raises(InvalidPriorityError, match="priority"):
        workflow_task(step.fn, name="driver-priority.bad", priority=10)


@pytest.mark.parametrize("bad", [-1, 10, 2.0, "5", True, None])
def test_a_bad_priority_is_refused_and_nothing_stored(stub_broker: object, bad: Any) -> None:
    job = keyed("never")
    if bad is not None:
        with pytest.raises(InvalidPriorityError, match="priority") as caught:
            job.scheduled(priority=bad)
        assert caught.value.value == bad
    with pytest.raises(InvalidPriorityError, match="priority"):
        Job(channel_id=CHANNEL, priority=bad if bad is not None else 11)
    with pytest.raises((ValueError, TypeError)):
        job.priority = bad if bad is not None else -3
    assert get_job_store().get(job.id) is None
    assert job.status is Status.UNKNOWN
    assert job.priority == 0


def test_held_jobs_are_released_highest_priority_first(stub_broker: StubBroker) -> None:
    """The sweep's release of held jobs (a long delay, parents, a resume): a full channel
    admits the highest first, and one queue carrying every priority (this broker's)
    gets them in priority order, equal ones in the store's (due) order."""
    store = get_job_store()
    now = utcnow()
    priorities = [0, 3, 0, 9, 3, 0]
    jobs = [keyed(f"job-{n}", p) for n, p in enumerate(priorities)]
    for n, job in enumerate(jobs):  # due one after the other: their submit order
        due = now - timedelta(seconds=len(jobs) - n)
        assert store.put(job.to_record().evolve(status=Status.SCHEDULED, release_at=due))
    manager.available(CHANNEL).resize(4)

    assert release_held(store, store.due_releases(now), now, stub_broker) == 4

    raw = stub_broker.queues[CHANNEL].queue
    queued = [StepMessage.from_message(Message.decode(m)).job_id for m in raw]
    order = [3, 1, 4, 0]  # 9, then the 3s and the first 0 in submit order; two stay held
    assert queued == [jobs[n].id for n in order]
    still_held = {r.id for r in store.due_releases(now + timedelta(seconds=5))}
    assert still_held == {jobs[2].id, jobs[5].id}
