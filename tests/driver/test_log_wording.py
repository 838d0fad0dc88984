"""On both drivers, each decision's log line is a sentence a reader understands, with
attempts and rounds counted from 1 (the ``action`` field and the 0-based ``position``
stay as programs read them)."""

from __future__ import annotations

import logging

import pytest

from pypepper_dramatiq import Context, Status, Task, workflow_task

from .drivers import Driver, make_job, run

RUNS: dict[str, int] = {}


@workflow_task(name="driver-wording.flaky")
def flaky(task: Task, context: Context) -> str:
    """Fails its first two attempts, then succeeds."""
    RUNS[context.job_id] = RUNS.get(context.job_id, 0) + 1
    if RUNS[context.job_id] <= 2:
        raise RuntimeError("not yet")
    return "ok"


@workflow_task(name="driver-wording.broken")
def broken(task: Task, context: Context) -> None:
    raise RuntimeError("disk full")


@workflow_task(name="driver-wording.last")
def last(task: Task, context: Context) -> str:
    return "done"


def lines(caplog: pytest.LogCaptureFixture, job_id: str) -> dict[str, list[str]]:
    """The step I/O's messages about ``job_id``, by their ``action`` field."""
    found: dict[str, list[str]] = {}
    for record in caplog.records:
        if record.name.startswith("pypepper_dramatiq") and getattr(record, "job_id", "") == job_id:
            found.setdefault(getattr(record, "action", ""), []).append(record.getMessage())
    return found


def test_each_decision_is_logged_as_a_sentence(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    good = make_job([flaky.options(retry_count=2).task(name="fetch"), last.task(name="store")])
    bad = make_job([broken.options(retry_count=2).task(name="load")])
    with caplog.at_level(logging.DEBUG, logger="pypepper_dramatiq"):
        done, failed = run(driver, good, bad)
    assert (done.status, failed.status) == (Status.COMPLETED, Status.FAILED)

    said = lines(caplog, good.id)
    assert said["start"][0].startswith(f"job {good.id} started")
    assert said["attempt_failed"] == [
        f"job {good.id}: task fetch failed (attempt 1 of 3): RuntimeError: not yet",
        f"job {good.id}: task fetch failed (attempt 2 of 3): RuntimeError: not yet",
    ]
    assert said["run"] == [
        f"job {good.id}: task fetch will be retried now (attempt 2 of 3)",
        f"job {good.id}: task fetch will be retried now (attempt 3 of 3)",
        f"job {good.id}: task fetch done; next: task store",
    ]
    assert said["complete"] == [f"job {good.id} completed"]
    assert set(said.get("end", [])) <= {f"job {good.id} completed"}  # the in-process worker's

    said = lines(caplog, bad.id)
    assert said["fail"] == [
        f"job {bad.id} failed: task load failed for good after 3 attempts: RuntimeError: disk full"
    ]
    assert set(said.get("end", [])) <= {
        f"job {bad.id} failed: task load failed: RuntimeError: disk full"
    }
    for record in caplog.records:  # the fields programs read are as they were
        if getattr(record, "job_id", "") == bad.id and getattr(record, "action", "") == "fail":
            assert record.position == [0, 0, 0, 2]  # type: ignore[attr-defined]
            assert record.levelno == logging.WARNING
    every = [r.getMessage() for r in caplog.records if r.name.startswith("pypepper_dramatiq")]
    assert not [m for m in every if " at 0." in m or "(round " in m], every
