"""Priorities on Redis: one queue per priority of a channel (``<channel>.p<n>``).

A job of a priority above 0 is sent to its priority's queue, which a process serving
the channel declares (so a ``dramatiq`` worker consumes it); the in-process Worker
on Redis takes from those queues first. A plain job goes to the channel's own queue,
as before. Real workers: ``tests/integration/test_priority_processes.py``.
"""

from __future__ import annotations

import time

import dramatiq
import pytest

from pypepper_dramatiq import (
    Context,
    Job,
    Status,
    Task,
    Workflow,
    get_job_store,
    manager,
    workflow_task,
)
from pypepper_dramatiq.channels.broker import get_broker
from pypepper_dramatiq.rules.priorities import queue_names

from .one_task_jobs import one_task_job

pytestmark = pytest.mark.redis

CHANNEL = "prio-queues"


#: When each timed task started (``time.monotonic()``).
STARTS: list[float] = []


@workflow_task(name="prio-queues.timed")
def timed(task: Task, context: Context) -> None:
    STARTS.append(time.monotonic())


def test_each_priority_has_a_queue_declared_and_a_job_goes_to_its_own(broker: object) -> None:
    manager.available(CHANNEL)
    declared = get_broker().get_declared_queues()
    assert set(queue_names(CHANNEL)) <= declared
    assert f"{CHANNEL}.p0" not in declared  # priority 0 is the channel's own queue
    plain, high = one_task_job(CHANNEL, priority=0), one_task_job(CHANNEL, priority=7)
    plain.scheduled()
    high.scheduled()
    for made, queue in ((plain, CHANNEL), (high, f"{CHANNEL}.p7")):
        record = get_job_store().get(made.id)
        assert record is not None and record.state["dispatch"]["queue"] == queue
    channel = manager.available(CHANNEL)  # taken back: the queues are left empty
    assert {channel.take().id, channel.take().id} == {plain.id, high.id}  # type: ignore[union-attr]


def test_the_in_process_channel_takes_the_highest_priority_first(broker: object) -> None:
    channel = manager.available(CHANNEL)
    lows = [one_task_job(CHANNEL, priority=0) for _ in range(3)]
    for made in lows:
        made.scheduled()
    mid, high = one_task_job(CHANNEL, priority=4), one_task_job(CHANNEL, priority=9)
    mid.scheduled()
    high.scheduled()
    taken = [channel.take() for _ in range(5)]
    assert [t.id if t else None for t in taken] == [high.id, mid.id, *(j.id for j in lows)]
    assert channel.take() is None


def test_a_high_priority_job_counts_against_its_channels_rate_limit(broker: object) -> None:
    # Its messages come from <channel>.p9, not the channel's own queue: the Dramatiq
    # driver still asks the channel's limit (1/s), so the three starts are spread.
    STARTS.clear()
    manager.new(CHANNEL, rate_limit="1/s")
    jobs = []
    for _ in range(3):
        made = Job(channel_id=CHANNEL, priority=9)
        made.workflows.append(Workflow([timed.options(retry_count=0).task(name="timed")]))
        made.scheduled()
        jobs.append(made)
    worker = dramatiq.Worker(get_broker(), worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not all(
            (r := get_job_store().get(made.id)) is not None and r.status is Status.COMPLETED
            for made in jobs
        ):
            assert time.monotonic() < deadline, "the jobs did not complete"
            time.sleep(0.05)
    finally:
        worker.stop()
    starts = sorted(STARTS)
    assert len(starts) == 3
    assert starts[-1] - starts[0] >= 2.0 - 0.25, starts
