"""A real ``dramatiq`` worker's log: a task's error cannot forge a line in it.

The task raises an error whose message holds a newline followed by a line written as
the Dramatiq CLI writes its log lines, and an escape sequence. In the worker's log
(stdout and stderr of ``dramatiq``, as an operator tails it) the forged line does not
start a line, and no raw ESC reaches the terminal.
"""

from __future__ import annotations

import uuid

import pytest

from pypepper_dramatiq import Status

from .harness import Cluster
from .worker_app import fragile

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: What the Dramatiq CLI would write for a job that completed.
FORGED_LINE = (
    "[2026-12-01 00:00:00,000] [PID 1] [MainThread] [pypepper_dramatiq.engine.step_io] "
    "[INFO] job forged-0: completed"
)


def test_a_task_error_forges_no_line_in_the_worker_log(cluster: Cluster) -> None:
    worker = cluster.start_worker()
    message = f"disk full\n{FORGED_LINE}\x1b]0;pwned\x07"
    job = cluster.schedule(
        fragile.task(name="parse", flag=f"never-{uuid.uuid4()}", message=message)
    )
    [record] = cluster.wait_status([job], 60, statuses=[Status.FAILED]).values()
    assert record.error is not None and message in record.error  # stored exactly

    log = worker.log_path.read_bytes()
    assert b"\x1b" not in log and b"\x07" not in log
    lines = log.decode().splitlines()
    assert not [line for line in lines if line.startswith(FORGED_LINE)], log.decode()
    shown = [line for line in lines if f"disk full\\n{FORGED_LINE}" in line]
    assert shown and all(f"job {job.id}" in line for line in shown), log.decode()
