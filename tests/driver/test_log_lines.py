"""On both drivers, a task's error cannot forge a line in the worker's log.

A task raises an error whose message holds a newline and a line that looks like a log
line of its own, an escape sequence and a bidi override. Every record the package logs
while running the job, formatted as a log file would hold it, has one line per record
for the message (a traceback keeps its own lines, none of them forged), with the error
shown escaped.
"""

from __future__ import annotations

import logging
import unicodedata

import pytest

from pypepper_dramatiq import Context, Status, Task, workflow_task

from .drivers import Driver, make_job, run

FORGED = "disk full\n[INFO] job 0: completed\x1b[2J\u202e"
FORGED_SHOWN = "disk full\\n[INFO] job 0: completed\\x1b[2J\\u202e"
LOG_FORMAT = "[%(levelname)s] %(name)s: %(message)s"


@workflow_task(name="driver-logs.forger")
def forger(task: Task, context: Context) -> None:
    raise RuntimeError(FORGED)


def interpreted(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


def test_a_task_error_is_logged_escaped_on_one_line(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    job = make_job([forger.options(retry_count=1).task(name="forge")])
    with caplog.at_level(logging.DEBUG, logger="pypepper_dramatiq"):
        (record,) = run(driver, job)
    assert record.status is Status.FAILED
    assert record.error is not None and FORGED in record.error  # stored exactly

    ours = [r for r in caplog.records if r.name.startswith("pypepper_dramatiq")]
    failed = [r for r in ours if getattr(r, "action", None) == "attempt_failed"]
    assert len(failed) == 2
    assert all(FORGED_SHOWN in r.getMessage() for r in failed)
    formatter = logging.Formatter(LOG_FORMAT)
    for logged in ours:
        assert interpreted(logged.getMessage()) == [], logged.getMessage()
        text = formatter.format(logged)  # with its traceback, if it has one
        forged = [line for line in text.split("\n") if line.startswith("[INFO] job 0")]
        assert forged == [], text
