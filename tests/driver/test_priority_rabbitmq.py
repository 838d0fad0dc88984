"""Priorities on RabbitMQ: a broker built with ``max_priority`` declares its queues with
``x-max-priority``, and a job's messages carry its priority (``broker_priority``), so
RabbitMQ hands a worker the highest priority first, equal ones in submit order.

A plain job's messages carry no priority. RabbitMQ refuses to change an existing
queue's arguments, so the test's channel is new.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

import pypepper_dramatiq
from pypepper_dramatiq import Context, Job, Status, Task, Workflow, get_job_store, workflow_task

from .conftest import LEASE_SECONDS, SWEEP_INTERVAL, WORKER_TIMEOUT_MS, workflow_middleware
from .drivers import JOB_TIMEOUT, CallLog

pytestmark = pytest.mark.rabbitmq

#: Each call's key, in call order.
CALLS: CallLog[str] = CallLog()


@workflow_task(name="driver-priority-rabbitmq.step")
def step(task: Task, context: Context, key: str) -> str:
    return CALLS.record(key)


@pytest.fixture
def channel_id() -> str:
    return f"prio-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def broker(rabbitmq_url: str, channel_id: str) -> Iterator[RabbitmqBroker]:
    made = RabbitmqBroker(url=rabbitmq_url, confirm_delivery=True, max_priority=9)
    pypepper_dramatiq.setup(
        broker=made,
        channels=[channel_id],
        lease_seconds=LEASE_SECONDS,
        sweep_interval=SWEEP_INTERVAL,
    )
    made.emit_after("process_boot")
    CALLS.clear()
    yield made
    workflow_middleware(made).stop_background()
    made.flush_all()
    made.close()
    CALLS.clear()


def test_a_worker_takes_the_highest_priority_first(broker: RabbitmqBroker, channel_id: str) -> None:
    plan = [("low-0", 0), ("low-1", 0), ("mid-0", 5), ("high-0", 9), ("mid-1", 5), ("low-2", 0)]
    jobs = []
    for key, priority in plan:  # all queued before any worker consumes
        job = Job(category="prio", channel_id=channel_id)
        job.workflows.append(Workflow([step.options(retry_count=0).task(name="s", key=key)]))
        job.scheduled(priority=priority)
        jobs.append(job)
    worker = dramatiq.Worker(broker, worker_timeout=WORKER_TIMEOUT_MS, worker_threads=1)
    worker.start()
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not all(get_job_store().get(j.id).status.is_terminal for j in jobs):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the jobs did not end"
            time.sleep(0.02)
    finally:
        worker.stop()
    assert {get_job_store().get(j.id).status for j in jobs} == {Status.COMPLETED}  # type: ignore[union-attr]
    assert CALLS == ["high-0", "mid-0", "mid-1", "low-0", "low-1", "low-2"]
