"""A task that cancels its own job, on both drivers.

A task raising ``JobCancellationError`` ends its job Cancelled through the
shared engine (``StepBook.record_outcome``): no retry, no further task, the
attempt recorded as cancelled, and the job's error naming the task and the
message. The tasks are ``@workflow_task`` functions that count their calls
in a module-level dict under a lock.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest

from pypepper_dramatiq import (
    Context,
    JobCancellationError,
    Status,
    Task,
    get_job_store,
    workflow_task,
)
from pypepper_dramatiq.engine import ledger
from pypepper_dramatiq.engine.running import running_here
from pypepper_dramatiq.rules import Position

from .drivers import Driver, make_job, run

_lock = threading.Lock()
#: Calls per key.
CALLS: dict[str, int] = defaultdict(int)


def _call(key: str) -> int:
    with _lock:
        CALLS[key] += 1
        return CALLS[key]


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix for this test's call keys; its accounting is dropped afterwards."""
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for key in [k for k in CALLS if k.startswith(value)]:
            del CALLS[key]


# -- the tasks ------------------------------------------------------------------------------


@workflow_task(name="self-cancel.quit")
def quit_job(task: Task, context: Context, key: str) -> None:
    """Asks to cancel its job."""
    _call(key)
    raise JobCancellationError(f"{key}: nothing to do today")


@workflow_task(name="self-cancel.work")
def work(task: Task, context: Context, key: str) -> str:
    _call(key)
    return "done"


# -- self-cancel ----------------------------------------------------------------------------


def test_a_task_raising_job_cancellation_error_ends_its_job_cancelled(
    driver: Driver, prefix: str
) -> None:
    job = make_job(
        [
            work.task(name="first", key=f"{prefix}first"),
            # Retries and rounds left, and optional: none of it applies to a cancel.
            quit_job.options(retry_count=2, round_times=2, optional=True).task(
                name="quit", key=f"{prefix}quit"
            ),
            work.task(name="after", key=f"{prefix}after"),
        ],
        [work.task(name="next-workflow", key=f"{prefix}next-workflow")],
    )

    [record] = run(driver, job)

    assert record.status is Status.CANCELLED
    assert calls(f"{prefix}first") == 1
    assert calls(f"{prefix}quit") == 1  # no retry, no second round
    assert calls(f"{prefix}after") == 0 and calls(f"{prefix}next-workflow") == 0
    assert record.error is not None
    assert record.error.startswith("task quit cancelled the job: JobCancellationError")
    assert f"{prefix}quit: nothing to do today" in record.error
    [entry] = record.state["history"]["0.1"]
    assert entry["outcome"] == "cancelled"
    assert entry["error_type"] == "JobCancellationError"
    assert record.state["skipped"] == []  # cancelled, not skipped as an optional failure
    assert record.result("first") == "done"  # the progress before it is kept
    assert record.lease_owner is None and record.lease_expires is None  # like other ends


def test_a_self_cancel_sets_the_cancel_event_of_the_job_running_here() -> None:
    # As Job.cancel() does: whoever waits on the job's cancel event in this
    # process (a retry delay, the lease keeper's view) hears it.
    job = make_job([quit_job.task(name="quit", key="unit:quit")])
    job.scheduled()
    store = get_job_store()
    book = ledger.StepBook(lambda: store, "unit-owner", 30.0)
    record = store.get(job.id)
    assert record is not None
    tasks = [[task.spec().to_dict() for task in w.get_tasks()] for w in job.workflows]
    started = record.evolve(status=Status.IN_PROGRESS, lease_owner="unit-owner")
    assert store.advance(started)
    claim = ledger.Claim(started.evolve(version=started.version + 1), Position(), tasks)
    running = running_here.start(job.id)
    try:
        recorded = book.record_outcome(claim, ledger.Outcome.failure(JobCancellationError("stop")))
        assert running.cancel_event.is_set()
    finally:
        running_here.remove(job.id)
    assert recorded is not None and recorded.decision.action.value == "cancel"
    stored = store.get(job.id)
    assert stored is not None and stored.status is Status.CANCELLED
