"""The two drivers as the contract tests drive them, and helpers to run jobs on them.

:class:`InProcessDriver` runs queued jobs with ``Worker(channel).run_forever()``;
:class:`DramatiqDriver` with a ``dramatiq.Worker`` on the stub broker or on RabbitMQ.
The ``driver`` fixture (``conftest.py``) gives each test each of them, in turn.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import Job, JobRecord, Task, Worker, Workflow, get_job_store, manager

#: The channel (and Dramatiq queue) the driver tests schedule jobs on.
CHANNEL = "driver-jobs"
#: Upper bound for any one job to end (a hang, not a speed check).
JOB_TIMEOUT = 30.0
JOB_TIMEOUT_MS = int(JOB_TIMEOUT * 1000)

_Entry = TypeVar("_Entry")


def _stored(job: Job) -> JobRecord:
    record = get_job_store().get(job.id)
    assert record is not None, f"job {job.id} has no row"
    return record


class InProcessDriver:
    """Runs queued jobs with ``Worker(channel).run_forever()`` in a thread, after a stop.

    The stop makes ``run_forever`` drain what was queued and return.
    """

    #: A task busy past its round_timeout is abandoned, not interrupted: it runs on.
    interrupts_busy_tasks = False

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._errors: list[BaseException] = []

    def start(self) -> None:
        channel = manager.available(CHANNEL)
        channel.request_stop()

        def consume_all() -> None:
            try:
                asyncio.run(Worker(channel).run_forever())
            except BaseException as exc:
                self._errors.append(exc)

        self._thread = threading.Thread(target=consume_all, name="inprocess-driver", daemon=True)
        self._thread.start()

    def wait(self, *jobs: Job) -> list[JobRecord]:
        assert self._thread is not None
        self._thread.join(JOB_TIMEOUT)
        assert not self._thread.is_alive(), "the in-process worker did not drain the channel"
        assert not self._errors, self._errors
        return [_stored(job) for job in jobs]


class DramatiqDriver:
    """Runs queued jobs with a ``dramatiq.Worker`` on the stub broker or on RabbitMQ.

    Done when every job's row is terminal and the broker and worker are idle.
    """

    #: Dramatiq's TimeLimit raises in the busy thread.
    interrupts_busy_tasks = True

    def __init__(
        self, broker: StubBroker | RabbitmqBroker, start_worker: Callable[[], dramatiq.Worker]
    ) -> None:
        self.broker = broker
        self._start_worker = start_worker
        self.worker: dramatiq.Worker | None = None

    def start(self) -> None:
        self.worker = self._start_worker()

    def wait(self, *jobs: Job) -> list[JobRecord]:
        assert self.worker is not None
        deadline = time.monotonic() + JOB_TIMEOUT
        while not all(_stored(job).status.is_terminal for job in jobs):
            assert time.monotonic() < deadline, [_stored(job) for job in jobs]
            time.sleep(0.02)
        # Let messages still in flight (a cancelled attempt, a duplicate) finish;
        # nothing in these scenarios may be dead-lettered.
        if isinstance(self.broker, StubBroker):
            self.broker.join(CHANNEL, timeout=int(JOB_TIMEOUT * 1000), fail_fast=True)
        else:
            self.broker.join(CHANNEL, min_successes=5, idle_time=50, timeout=JOB_TIMEOUT_MS)
            dead_lettered = self.broker.get_queue_message_counts(CHANNEL)[2]
            assert not dead_lettered, f"{dead_lettered} messages dead-lettered"
        self.worker.join()
        return [_stored(job) for job in jobs]


Driver = InProcessDriver | DramatiqDriver


def make_job(*workflows: list[Task]) -> Job:
    job = Job(category="contract", channel_id=CHANNEL)
    job.workflows.extend(Workflow(tasks) for tasks in workflows)
    return job


def run(driver: Driver, *jobs: Job) -> list[JobRecord]:
    for job in jobs:
        job.scheduled()
    driver.start()
    return driver.wait(*jobs)


class CallLog(list[_Entry]):
    """What a test module's tasks were called with, in call order.

    The tasks run on worker threads, so each entry is added under a lock.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def record(self, entry: _Entry) -> _Entry:
        """Adds ``entry`` and returns it, so that a task can ``return calls.record(key)``."""
        with self._lock:
            self.append(entry)
        return entry


def emptied_around_each_test(*logs: list[Any]) -> Callable[[], Iterator[None]]:
    """An autouse fixture that empties ``logs`` before and after each test of a module.

    Assign it to a module-level name (``no_calls = emptied_around_each_test(CALLS)``):
    pytest finds fixtures by name, so no test leaves calls behind for the next one.
    """

    @pytest.fixture(autouse=True)
    def emptied() -> Iterator[None]:
        for log in logs:
            log.clear()
        yield
        for log in logs:
            log.clear()

    return emptied


def held_ids(caplog: pytest.LogCaptureFixture, *actions: str) -> set[str]:
    """The ids of the jobs a worker logged one of ``actions`` for (``"pause_hold"``, ...)."""
    return {
        str(getattr(r, "job_id", ""))
        for r in caplog.records
        if getattr(r, "action", None) in actions
    }


def attempts(job: Job) -> Counter[str]:
    """How many attempts the stored row counts, by task key."""
    record = _stored(job)
    return Counter({key: len(entries) for key, entries in record.state.get("history", {}).items()})
