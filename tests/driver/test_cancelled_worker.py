"""A cancelled ``Worker.run_once`` (a timeout, an application's shutdown) loses no job.

A job it took and did not start goes back on the channel (and stays Scheduled in
the store); the jobs it put aside too; a job it started runs on to its recorded end
in its thread. On the memory store and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from pypepper_dramatiq import (
    CallableExecutor,
    Channel,
    Context,
    Job,
    Status,
    Task,
    Worker,
    Workflow,
    get_job_store,
    manager,
    set_job_store,
)
from pypepper_dramatiq.stores.base import IJobStore

CHANNEL = "cancelled-worker"
#: Bound on the run_once calls of one test (a hang, not a speed check).
TRIES = 40
#: Upper bound for any one condition a test waits for.
WAIT = 20.0


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Iterator[IJobStore]:
    if request.param == "memory":
        yield get_job_store()
        return
    pg: IJobStore = request.getfixturevalue("pg_store")
    yield set_job_store(pg)


class Counted:
    """A task's function: counts its calls; may block until released."""

    def __init__(self, block: bool = False) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()

    def __call__(self, task: Task, context: Context) -> str:
        self.calls += 1
        self.started.set()
        assert self.release.wait(WAIT), "never released"
        return "done"


def _job(work: Counted, channel: str = CHANNEL) -> Job:
    job = Job(category="cancelled", channel_id=channel)
    job.workflows.append(
        Workflow([Task(channel, "d", "f", "t", None, "", [], CallableExecutor(work))])
    )
    return job


def _status(job: Job) -> Status:
    record = get_job_store().get(job.id)
    assert record is not None
    return record.status


def shut_down_once_taken(channel: Channel) -> None:
    """Runs ``Worker(channel).run_forever()`` until it took the channel's job, then
    cancels it, as a shutdown does, and checks the cancel ended the loop."""

    async def shut_down_while_it_waits() -> None:
        running = asyncio.create_task(Worker(channel).run_forever())
        while channel.length() != 0:  # until the worker took it
            await asyncio.sleep(0.01)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(asyncio.wait_for(shut_down_while_it_waits(), WAIT))


def test_a_loop_of_timed_out_run_once_calls_runs_a_delayed_job_exactly_once(
    store: IJobStore,
) -> None:
    work = Counted()
    job = _job(work)
    job.scheduled(delay=0.6)
    worker = Worker(manager.available(CHANNEL))
    tries = 0
    # The first call takes the job and waits for its start until its timeout.
    while _status(job) is not Status.COMPLETED and tries < TRIES:
        tries += 1
        try:
            asyncio.run(asyncio.wait_for(worker.run_once(), 0.5))
        except asyncio.TimeoutError:
            continue
    assert _status(job) is Status.COMPLETED
    assert work.calls == 1
    assert tries >= 2  # the first one was cancelled (the job starts only after 0.6s)
    assert manager.available(CHANNEL).length() == 0


def test_run_forever_cancelled_while_a_job_waits_for_its_start_leaves_it_queued(
    store: IJobStore,
) -> None:
    work = Counted()
    job = _job(work)
    job.scheduled(delay=30)
    channel = manager.available(CHANNEL)

    shut_down_once_taken(channel)

    assert work.calls == 0
    assert channel.length() == 1
    record = get_job_store().get(job.id)
    assert record is not None and record.status is Status.SCHEDULED
    assert record.not_before == job.not_before
    # Its message is on the channel: the next worker takes the job, its start kept.
    again = channel.take()
    assert again is job and again.status is Status.SCHEDULED
    assert again.not_before == record.not_before


def test_jobs_put_aside_go_back_on_the_channel(store: IJobStore) -> None:
    parent = _job(Counted(), channel=f"{CHANNEL}-unserved")  # nobody runs it
    parent.scheduled()
    work = Counted()
    child = _job(work)
    child.scheduled(after=[parent])
    channel = manager.available(CHANNEL)

    shut_down_once_taken(channel)  # it took the job and put it aside

    assert work.calls == 0
    assert channel.length() == 1
    assert _status(child) is Status.SCHEDULED
    assert channel.take() is child


def test_a_started_job_is_carried_to_its_end_after_the_cancel(store: IJobStore) -> None:
    work = Counted(block=True)
    job = _job(work)
    job.scheduled()
    channel = manager.available(CHANNEL)

    async def cancel_while_it_runs() -> None:
        running = asyncio.create_task(Worker(channel).run_once())
        assert await asyncio.to_thread(work.started.wait, WAIT)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        work.release.set()

    # asyncio.run waits for the job's thread before it returns.
    asyncio.run(asyncio.wait_for(cancel_while_it_runs(), WAIT))

    assert work.calls == 1
    assert _status(job) is Status.COMPLETED
    assert job.status is Status.COMPLETED  # its state machine followed the end
    assert channel.length() == 0
