"""Pausing a channel or a task type on both drivers (the ``driver`` fixture runs each
test on the in-process Worker and on a ``dramatiq.Worker``).

While paused, jobs are still accepted and none of their steps starts: a worker that
picks one up holds it unrun, no attempt counted (the Dramatiq driver in the store,
the in-process Worker in its hands), and resuming releases them all, in submit order
where one worker runs them one at a time. A worker's copy of the paused set is read
at most once a second; this process's own pause or resume is seen at once.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from pypepper_dramatiq import (
    Context,
    Job,
    Status,
    Task,
    UnknownChannelError,
    UnknownExecutorError,
    get_job_store,
    list_paused,
    pause_channel,
    pause_task,
    resume_channel,
    resume_task,
    workflow_task,
)
from pypepper_dramatiq.records.pauses import PAUSED_UNTIL

from .drivers import (
    CHANNEL,
    JOB_TIMEOUT,
    CallLog,
    DramatiqDriver,
    Driver,
    InProcessDriver,
    attempts,
    emptied_around_each_test,
    held_ids,
    make_job,
)

#: Each call's key, in call order.
CALLS: CallLog[str] = CallLog()
no_calls = emptied_around_each_test(CALLS)


@workflow_task(name="driver-pause.step")
def step(task: Task, context: Context, key: str) -> str:
    return CALLS.record(key)


@workflow_task(name="driver-pause.later")
def later(task: Task, context: Context, key: str) -> str:
    CALLS.record(f"{key}:later")
    return key


def paused_ids(caplog: pytest.LogCaptureFixture) -> set[str]:
    return held_ids(caplog, "pause_hold", "pause_wait")


def wait_until_held(caplog: pytest.LogCaptureFixture, driver: Driver, *jobs: Job) -> None:
    """Until a worker has held each of ``jobs`` (and, on the Dramatiq driver, its row
    says so): a bound against a hang, not a speed check."""
    deadline = time.monotonic() + JOB_TIMEOUT
    wanted = {job.id for job in jobs}
    while True:
        rows = {job.id: get_job_store().get(job.id) for job in jobs}
        stored = isinstance(driver, InProcessDriver) or all(
            r is not None and PAUSED_UNTIL in (r.release_at, r.lease_expires) for r in rows.values()
        )
        if wanted <= paused_ids(caplog) and stored:
            return
        assert time.monotonic() < deadline, (paused_ids(caplog), rows)
        time.sleep(0.02)


def test_a_paused_channel_accepts_jobs_and_starts_them_in_order_once_resumed(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    keys = [f"job-{n}" for n in range(5)]
    assert pause_channel(CHANNEL) is True
    assert pause_channel(CHANNEL) is False  # already paused
    assert list_paused() == [("channel", CHANNEL)]
    jobs = [make_job([step.options(retry_count=0).task(name="work", key=k)]) for k in keys]
    for job in jobs:
        job.scheduled()  # accepted: a pause is not a stop
    delayed = make_job([step.options(retry_count=0).task(name="work", key="delayed")])
    delayed.scheduled(delay=0.2)
    driver.start()
    wait_until_held(holds, driver, *jobs, delayed)
    assert CALLS == []
    for job in [*jobs, delayed]:
        record = get_job_store().get(job.id)
        assert record is not None and record.status is Status.SCHEDULED, record
        assert attempts(job) == Counter()

    assert resume_channel(CHANNEL) is True
    records = driver.wait(*jobs, delayed)
    assert [r.status for r in records] == [Status.COMPLETED] * 6
    assert sorted(CALLS) == sorted([*keys, "delayed"])  # each ran once
    assert all(attempts(job) == Counter({"0.0": 1}) for job in [*jobs, delayed])
    if isinstance(driver, InProcessDriver):  # one job at a time: in submit order
        assert [k for k in CALLS if k != "delayed"] == keys
    assert list_paused() == []


def test_a_paused_task_holds_its_steps_and_not_the_tasks_before_them(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    assert pause_task("driver-pause.later") is True
    job = make_job(
        [
            step.options(retry_count=0).task(name="first", key="a"),
            later.options(retry_count=0).task(name="second", key="a"),
        ]
    )
    job.scheduled()
    driver.start()
    wait_until_held(holds, driver, job)
    assert CALLS == ["a"]  # the first task ran; the paused one did not start
    record = get_job_store().get(job.id)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert record.state["cursor"][:2] == [0, 1]
    assert attempts(job) == Counter({"0.0": 1})

    assert resume_task("driver-pause.later") is True
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED
    assert CALLS == ["a", "a:later"]
    assert attempts(job) == Counter({"0.0": 1, "0.1": 1})  # no attempt burnt while held


def test_jobs_of_other_channels_and_tasks_run_while_one_is_paused(driver: Driver) -> None:
    assert pause_task("driver-pause.later") is True
    job = make_job([step.options(retry_count=0).task(name="work", key="free")])
    job.scheduled()
    driver.start()
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED and CALLS == ["free"]
    assert resume_task("driver-pause.later") is True


def test_an_unknown_channel_or_task_is_refused_and_nothing_stored(
    stub_broker: object,
) -> None:
    name = f"nobody-{uuid.uuid4().hex[:6]}"
    with pytest.raises(UnknownChannelError, match=name):
        pause_channel(name)
    with pytest.raises(UnknownChannelError, match=name):
        resume_channel(name)
    with pytest.raises(UnknownExecutorError, match=name):
        pause_task(name)
    with pytest.raises(UnknownExecutorError, match=name):
        resume_task(name)
    with pytest.raises(ValueError, match="channel"):
        pause_channel("x" * 300)
    assert list_paused() == []
    # Declared here (setup(channels=...)), or used by a stored job: known.
    assert pause_channel(CHANNEL) is True and resume_channel(CHANNEL) is True
    assert resume_channel(CHANNEL) is False  # known, not paused


def test_a_channel_only_stored_jobs_use_may_be_paused(stub_broker: object) -> None:
    other = f"elsewhere-{uuid.uuid4().hex[:6]}"
    job = make_job([step.task(name="work", key="x")])
    job.channel_id = other
    job.scheduled()
    assert pause_channel(other) is True
    assert resume_channel(other) is True


def test_the_dramatiq_driver_holds_in_the_store(
    stub_broker: object, start_worker: object, holds: pytest.LogCaptureFixture
) -> None:
    """What an operator sees of a held job: its row says why, and the held gauge's
    reason is "paused"."""
    from pypepper_dramatiq.stores.base import HELD_FOR_PAUSE

    driver = DramatiqDriver(stub_broker, start_worker)  # type: ignore[arg-type]
    pause_channel(CHANNEL)
    job = make_job([step.task(name="work", key="shown")])
    job.scheduled()
    driver.start()
    wait_until_held(holds, driver, job)
    assert get_job_store().held_counts()[(CHANNEL, HELD_FOR_PAUSE)] == 1
    row = get_job_store().get(job.id)
    assert row is not None and row.waiting_for()[0].startswith("a resume")
    resume_channel(CHANNEL)
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED and record.release_at is None


def test_a_held_job_cancelled_while_paused_never_runs(
    driver: Driver, holds: pytest.LogCaptureFixture
) -> None:
    pause_channel(CHANNEL)
    kept = make_job([step.options(retry_count=0).task(name="work", key="kept")])
    dropped = make_job([step.options(retry_count=0).task(name="work", key="dropped")])
    kept.scheduled()
    dropped.scheduled()
    driver.start()
    wait_until_held(holds, driver, kept, dropped)
    Job.cancel_saved(dropped.id)

    resume_channel(CHANNEL)
    records = driver.wait(kept, dropped)
    assert [r.status for r in records] == [Status.COMPLETED, Status.CANCELLED]
    assert CALLS == ["kept"]
