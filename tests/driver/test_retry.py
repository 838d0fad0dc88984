"""``Job.retry_saved``: a Failed or Cancelled job taken up again by a new job, on both drivers.

The new job (a new id, ``payload["retry_of"]`` naming the original) starts at
the task where the original stopped, or at ``from_task``, with the results of
the tasks before it kept: those tasks do not run again, and the later ones
read their results. The original's row is left exactly as it was (terminal
statuses are final). The typed errors, and that nothing is written with them,
run on the memory store without a worker.

The tasks are one ``@workflow_task`` function that counts its calls per key,
notes the results it saw, and fails (or cancels its job) while its key is in
a module-level set the test empties.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from pypepper_dramatiq import (
    AmbiguousTaskNameError,
    ChannelStoppedError,
    Context,
    Job,
    JobCancellationError,
    JobNotRetriableError,
    JobRecord,
    RetryError,
    Status,
    Task,
    UnknownExecutorError,
    UnknownJobError,
    UnknownTaskError,
    get_job_store,
    manager,
    workflow_task,
)
from pypepper_dramatiq.records.links import RETRY_OF_KEY

from .drivers import CHANNEL, Driver, make_job, run

_lock = threading.Lock()
#: Calls per key.
CALLS: dict[str, int] = defaultdict(int)
#: Per key, the results (by task name) each call saw in its context.
SEEN: dict[str, list[dict[str, Any]]] = defaultdict(list)
#: Keys whose calls fail, and keys whose calls cancel their job.
FAILING: set[str] = set()
CANCELLING: set[str] = set()


@workflow_task(name="retry-tests.step")
def step(task: Task, context: Context, key: str) -> str:
    """Counts the call and notes what it saw; fails or cancels while its key says so."""
    with _lock:
        CALLS[key] += 1
        SEEN[key].append(dict(context.results))
        failing, cancelling = key in FAILING, key in CANCELLING
    if failing:
        raise RuntimeError(f"{key}: planned failure")
    if cancelling:
        raise JobCancellationError(f"{key}: not today")
    return f"{task.name} done"


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix for this test's keys; their accounting is dropped afterwards."""
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for table in (CALLS, SEEN):
            for key in [k for k in table if k.startswith(value)]:
                del table[key]
        FAILING.difference_update({k for k in FAILING if k.startswith(value)})
        CANCELLING.difference_update({k for k in CANCELLING if k.startswith(value)})


def calls(key: str) -> int:
    with _lock:
        return CALLS[key]


def seen(key: str) -> list[dict[str, Any]]:
    with _lock:
        return list(SEEN[key])


def three_tasks(prefix: str) -> Job:
    return make_job([step.task(name=name, key=f"{prefix}{name}") for name in ("a", "b", "c")])


def stored(job_id: str) -> JobRecord:
    record = get_job_store().get(job_id)
    assert record is not None, f"job {job_id} has no row"
    return record


def run_again(driver: Driver, job_id: str) -> JobRecord:
    """Run the queued job ``job_id`` (the in-process driver stopped its channel to drain
    it: it has been resumed before the retry was scheduled)."""
    driver.start()
    [record] = driver.wait(Job(channel_id=CHANNEL, id=job_id))
    return record


def reopen_channel() -> None:
    """The in-process driver stops the channel to drain it; a retry needs it open."""
    manager.available(CHANNEL).resume()


# -- on both drivers ---------------------------------------------------------------------------


def test_a_failed_job_is_retried_from_the_failed_task_keeping_the_results_before_it(
    driver: Driver, prefix: str
) -> None:
    FAILING.add(f"{prefix}b")
    job = three_tasks(prefix)
    [failed] = run(driver, job)
    assert failed.status is Status.FAILED
    assert (calls(f"{prefix}a"), calls(f"{prefix}b"), calls(f"{prefix}c")) == (1, 1, 0)

    FAILING.discard(f"{prefix}b")  # the cause is fixed
    reopen_channel()
    new_id = Job.retry_saved(job.id)

    assert new_id != job.id
    record = run_again(driver, new_id)
    assert record.status is Status.COMPLETED, record.error
    assert calls(f"{prefix}a") == 1  # not run again
    assert (calls(f"{prefix}b"), calls(f"{prefix}c")) == (2, 1)
    assert seen(f"{prefix}b")[-1] == {"a": "a done"}
    assert seen(f"{prefix}c") == [{"a": "a done", "b": "b done"}]  # a's result, kept
    assert record.results_by_name() == {"a": "a done", "b": "b done", "c": "c done"}
    assert Job(channel_id=CHANNEL, id=new_id).result("a") == "a done"
    assert set(record.state["history"]) == {"0.1", "0.2"}  # this job's own attempts
    assert record.payload is not None and record.payload[RETRY_OF_KEY] == job.id
    assert (record.channel_id, record.category) == (failed.channel_id, failed.category)
    assert stored(job.id) == failed  # the original, untouched: still Failed


def test_from_task_resumes_earlier_and_runs_the_tasks_from_there_again(
    driver: Driver, prefix: str
) -> None:
    FAILING.add(f"{prefix}c")
    job = three_tasks(prefix)
    [failed] = run(driver, job)
    assert failed.status is Status.FAILED and failed.result("b") == "b done"

    FAILING.discard(f"{prefix}c")
    reopen_channel()
    record = run_again(driver, Job.retry_saved(job.id, from_task="b"))

    assert record.status is Status.COMPLETED, record.error
    assert (calls(f"{prefix}a"), calls(f"{prefix}b"), calls(f"{prefix}c")) == (1, 2, 2)
    assert seen(f"{prefix}b")[-1] == {"a": "a done"}  # b's old result was not kept
    assert record.state["results"] == {"0.0": "a done", "0.1": "b done", "0.2": "c done"}
    assert set(record.state["history"]) == {"0.1", "0.2"}
    assert stored(job.id) == failed


def test_a_cancelled_job_is_retried_from_where_it_was_cancelled(
    driver: Driver, prefix: str
) -> None:
    CANCELLING.add(f"{prefix}b")
    job = three_tasks(prefix)
    [cancelled] = run(driver, job)
    assert cancelled.status is Status.CANCELLED

    CANCELLING.discard(f"{prefix}b")
    reopen_channel()
    new_id = Job.retry_saved(job.id)
    record = run_again(driver, new_id)

    assert record.status is Status.COMPLETED, record.error
    assert (calls(f"{prefix}a"), calls(f"{prefix}b"), calls(f"{prefix}c")) == (1, 2, 1)
    assert seen(f"{prefix}c") == [{"a": "a done", "b": "b done"}]
    assert record.payload is not None and record.payload[RETRY_OF_KEY] == job.id
    assert stored(job.id) == cancelled


def test_a_job_cancelled_before_it_started_is_retried_from_its_first_task(
    driver: Driver, prefix: str
) -> None:
    job = three_tasks(prefix)
    job.scheduled()
    assert Job.cancel_saved(job.id)
    cancelled = stored(job.id)

    record = run_again(driver, Job.retry_saved(job.id))

    assert record.status is Status.COMPLETED, record.error
    assert (calls(f"{prefix}a"), calls(f"{prefix}b"), calls(f"{prefix}c")) == (1, 1, 1)
    assert stored(job.id) == cancelled


def test_a_retry_of_a_retry_names_the_job_it_retries(driver: Driver, prefix: str) -> None:
    FAILING.add(f"{prefix}b")
    job = three_tasks(prefix)
    run(driver, job)
    reopen_channel()
    first = run_again(driver, Job.retry_saved(job.id))
    assert first.status is Status.FAILED  # b still fails
    assert calls(f"{prefix}a") == 1

    FAILING.discard(f"{prefix}b")
    reopen_channel()
    second = run_again(driver, Job.retry_saved(first.id))

    assert second.status is Status.COMPLETED, second.error
    assert second.payload is not None and second.payload[RETRY_OF_KEY] == first.id
    assert calls(f"{prefix}a") == 1 and second.result("a") == "a done"


# -- the channel's admission, and the typed errors ---------------------------------------------


def failed_row(job: Job, cursor: list[int], **changes: Any) -> JobRecord:
    """``job`` stored as a Failed row stopped at ``cursor``, with the results before it."""
    results = {f"{w}.{t}": f"r{w}{t}" for w, t in [(0, 0), (0, 1)] if [w, t] < cursor[:2]}
    changes.setdefault("status", Status.FAILED)
    record = job.to_record().evolve(
        state={"cursor": cursor, "results": results, "errors": {}, "attempts": {}},
        error="task failed",
        **changes,
    )
    assert get_job_store().put(record)
    return stored(job.id)


def rows() -> list[str]:
    return sorted(record.id for record in get_job_store().list())


def test_a_retry_is_refused_by_a_stopped_channel_and_stores_nothing(prefix: str) -> None:
    original = failed_row(three_tasks(prefix), [0, 1, 0, 0])
    manager.available(CHANNEL).request_stop()
    with pytest.raises(ChannelStoppedError):
        Job.retry_saved(original.id)
    assert rows() == [original.id]
    manager.available(CHANNEL).resume()
    new_id = Job.retry_saved(original.id)
    new = stored(new_id)
    assert new.status is Status.SCHEDULED
    assert new.state["cursor"] == [0, 1, 0, 0] and new.state["results"] == {"0.0": "r00"}
    assert stored(original.id) == original


def test_an_unknown_job_is_an_unknown_job_error() -> None:
    with pytest.raises(UnknownJobError, match="no job 'nope' is stored"):
        Job.retry_saved("nope")


@pytest.mark.parametrize("status", [Status.SCHEDULED, Status.IN_PROGRESS, Status.COMPLETED])
def test_only_a_failed_or_cancelled_job_may_be_retried(prefix: str, status: Status) -> None:
    original = failed_row(three_tasks(prefix), [0, 1, 0, 0], status=status)
    with pytest.raises(JobNotRetriableError) as raised:
        Job.retry_saved(original.id)
    assert str(raised.value) == (
        f"job {original.id!r} is {status.value}: only a Failed or Cancelled job can be retried"
    )
    assert (raised.value.job_id, raised.value.status) == (original.id, status.value)
    assert rows() == [original.id]


def test_an_unknown_from_task_names_the_jobs_tasks(prefix: str) -> None:
    original = failed_row(three_tasks(prefix), [0, 1, 0, 0])
    for unknown in ("d", "0.3", "1.0", "x.1"):
        with pytest.raises(UnknownTaskError) as raised:
            Job.retry_saved(original.id, from_task=unknown)
        assert str(raised.value) == (
            f"job {original.id!r} has no task {unknown!r}; its tasks (workflow.task name): "
            "0.0 a, 0.1 b, 0.2 c"
        )
        assert raised.value.task == unknown and raised.value.names == [["a", "b", "c"]]
    assert rows() == [original.id]


def test_from_task_after_where_the_job_stopped_is_refused(prefix: str) -> None:
    original = failed_row(three_tasks(prefix), [0, 1, 0, 0])
    with pytest.raises(RetryError, match=r"stopped at task 0\.1 .* from 'c' \(0\.2\), later"):
        Job.retry_saved(original.id, from_task="c")
    assert rows() == [original.id]


def test_a_name_held_by_several_tasks_needs_its_position(prefix: str) -> None:
    job = make_job(
        [step.task(name="x", key=f"{prefix}x0"), step.task(name="y", key=f"{prefix}y")],
        [step.task(name="x", key=f"{prefix}x1")],
    )
    original = failed_row(job, [1, 0, 0, 0])
    with pytest.raises(AmbiguousTaskNameError, match=r"tasks 0\.0, 1\.0 \(workflow\.task\)"):
        Job.retry_saved(original.id, from_task="x")
    assert rows() == [original.id]
    new = stored(Job.retry_saved(original.id, from_task="0.1"))
    assert new.state["cursor"] == [0, 1, 0, 0] and new.state["results"] == {"0.0": "r00"}


def test_a_job_stored_without_its_workflows_cannot_be_retried_from_the_store(
    prefix: str,
) -> None:
    original = failed_row(three_tasks(prefix), [0, 1, 0, 0], payload=None)
    with pytest.raises(UnknownExecutorError, match="cannot be retried from the store"):
        Job.retry_saved(original.id)
    assert rows() == [original.id]


def test_a_job_whose_task_code_is_not_here_cannot_be_retried_here(prefix: str) -> None:
    job = three_tasks(prefix)
    record = job.to_record()
    assert record.payload is not None
    payload = {"workflows": [{"tasks": [dict(record.payload["workflows"][0]["tasks"][0])]}]}
    payload["workflows"][0]["tasks"][0]["executor_id"] = "retry-tests.elsewhere"
    original = failed_row(job, [0, 0, 0, 0], payload=payload)
    with pytest.raises(UnknownExecutorError, match="import the code of its tasks here"):
        Job.retry_saved(original.id)
    assert rows() == [original.id]
