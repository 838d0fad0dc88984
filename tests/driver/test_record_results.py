"""A job run by Dramatiq workers: its stored record answers results by task name."""

from __future__ import annotations

import time

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    AmbiguousTaskNameError,
    Context,
    Job,
    JobRecord,
    Status,
    Task,
    Workflow,
    get_job_store,
    workflow_task,
)

from .conftest import CHANNEL

TIMEOUT = 20.0


@workflow_task(name="record-results.double")
def double(task: Task, context: Context, n: int) -> dict[str, int]:
    return {"n": 2 * n}


def test_the_stored_record_gives_each_result_by_task_name(
    stub_broker: StubBroker, stub_worker: dramatiq.Worker
) -> None:
    job = Job(category="results", channel_id=CHANNEL)
    job.workflows.append(Workflow([double.task(name="first", n=1), double.task(name="same", n=2)]))
    job.workflows.append(Workflow([double.task(name="same", n=3)]))
    job.scheduled()

    deadline = time.monotonic() + TIMEOUT
    record: JobRecord | None = None
    while record is None or record.status is not Status.COMPLETED:
        assert time.monotonic() < deadline, f"job still {record and record.status}"
        time.sleep(0.02)
        record = get_job_store().get(job.id)

    assert record.result("first") == {"n": 2}
    assert record.result("same", workflow=1) == {"n": 6}
    with pytest.raises(AmbiguousTaskNameError):
        record.result("same")
    assert record.results_by_name() == {"first": {"n": 2}, "0.same": {"n": 4}, "1.same": {"n": 6}}
