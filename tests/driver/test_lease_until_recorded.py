"""An outcome whose record takes longer than the lease: the task that finished is not
run again.

The lease of a finished attempt is renewed until its outcome is recorded: on the
per-message path (the worker thread records it) and on the batched one (the
completion thread records it, or the worker thread for a task with a
``round_timeout``). Before, the per-message path stopped renewing when the task
returned, so a record held up past the lease (a busy machine, a slow store) let the
sweep send the step again and another thread ran the finished task a second time.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from pypepper_dramatiq import Context, Status, Task, workflow_task

from .conftest import LEASE_SECONDS, SWEEP_INTERVAL, make_driver, workflow_middleware
from .drivers import DramatiqDriver, make_job, run

#: Past the lease and a few sweeps: a lease left to lapse is swept in that time.
SLOW_RECORD_SECONDS = LEASE_SECONDS + 4 * SWEEP_INTERVAL

_lock = threading.Lock()
RUNS: Counter[str] = Counter()


@workflow_task(name="driver-lease-until-recorded.count")
def count(task: Task, context: Context, key: str) -> int:
    with _lock:
        RUNS[key] += 1
        return RUNS[key]


@pytest.fixture(params=["per-message", "dramatiq"])
def driver(request: pytest.FixtureRequest) -> DramatiqDriver:
    made = make_driver(request)
    assert isinstance(made, DramatiqDriver)
    return made


def _slow_records(driver: DramatiqDriver, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each outcome record of the driver's middleware waits first; the names of the
    record calls that were slowed, in call order."""
    book = workflow_middleware(driver.broker).book
    slowed: list[str] = []
    for name in ("record_outcome", "record_outcomes"):
        original = getattr(book, name)

        def slow(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            slowed.append(_name)
            time.sleep(SLOW_RECORD_SECONDS)
            return _original(*args, **kwargs)

        monkeypatch.setattr(book, name, slow)
    return slowed


@pytest.mark.parametrize("round_timeout", [None, 60], ids=["plain", "round-timeout"])
def test_a_record_slower_than_the_lease_does_not_run_the_finished_task_again(
    driver: DramatiqDriver,
    round_timeout: int | None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pypepper_dramatiq")
    slowed = _slow_records(driver, monkeypatch)
    key = uuid.uuid4().hex
    task = count if round_timeout is None else count.options(round_timeout=round_timeout)
    job = make_job([task.task(name="count", key=key)])

    [record] = run(driver, job)

    assert slowed, "no outcome record went through the slowed calls"
    assert RUNS[key] == 1
    assert record.status is Status.COMPLETED
    assert "lease lapsed" not in caplog.text
