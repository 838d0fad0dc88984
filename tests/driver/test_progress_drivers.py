"""Progress on both drivers: visible in the row while the task runs, the last value
stored when the attempt ends, and never in the way of a step or a cancel."""

from __future__ import annotations

import threading

import pytest

from pypepper_dramatiq import Context, Job, Status, Task, get_job_store, workflow_task

from .drivers import Driver, make_job, run

#: Set by the test once it has read the running task's progress.
go_on = threading.Event()
#: Set by the task once it reported.
reported = threading.Event()


@workflow_task(name="driver-progress.counts")
def counts(task: Task, context: Context) -> str:
    bar = context.progress_bar(1000, note="rows")
    for i in range(1000):
        if i % 100 == 99:
            bar.failed()
        else:
            bar.succeeded()
    return "counted"


@workflow_task(name="driver-progress.reports-then-waits")
def reports_then_waits(task: Task, context: Context) -> None:
    context.progress(3, 10, note="a third")
    reported.set()
    assert go_on.wait(10), "the test never let the task go on"
    context.progress(10, 10, note="done")


@workflow_task(name="driver-progress.bad-value")
def bad_value(task: Task, context: Context) -> None:
    context.progress(5, 2)


@pytest.fixture(autouse=True)
def events() -> None:
    go_on.clear()
    reported.clear()


def test_the_last_value_is_stored_with_the_attempt(driver: Driver) -> None:
    job = make_job([counts.task(name="count")])
    [record] = run(driver, job)
    assert record.status is Status.COMPLETED
    progress = record.progress["0.0"]
    assert (progress["task"], progress["done"], progress["failed"], progress["total"]) == (
        "count",
        1000,
        10,
        1000,
    )
    assert progress["note"] == "rows"


def test_progress_is_visible_while_the_task_runs_and_moves_no_version(driver: Driver) -> None:
    job = make_job([reports_then_waits.task(name="slow")])
    job.scheduled()
    driver.start()
    assert reported.wait(10)
    store = get_job_store()
    seen = store.get(job.id)
    assert seen is not None and seen.status is Status.IN_PROGRESS
    assert seen.progress["0.0"]["done"] == 3 and seen.progress["0.0"]["note"] == "a third"
    version = seen.version
    go_on.set()
    [record] = driver.wait(job)
    assert record.status is Status.COMPLETED
    assert record.progress["0.0"]["done"] == 10
    # claim (1) + record (1) moved it; the progress writes did not.
    assert record.version == version + 1


def test_a_cancel_while_the_task_reports_wins(driver: Driver) -> None:
    job = make_job([reports_then_waits.task(name="slow")])
    job.scheduled()
    driver.start()
    assert reported.wait(10)
    assert Job.cancel_saved(job.id) is True
    go_on.set()
    [record] = driver.wait(job)
    assert record.status is Status.CANCELLED


def test_a_bad_value_fails_the_attempt_with_a_value_error(driver: Driver) -> None:
    [record] = run(driver, make_job([bad_value.task(name="bad")]))
    assert record.status is Status.FAILED
    assert "ValueError" in (record.error or "") and "beyond total" in (record.error or "")
