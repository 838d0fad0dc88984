"""Retry backoff on both drivers: each retry of a round waits the backed-off delay.

Both drivers carry out :func:`~pypepper_dramatiq.rules.steps.next_step`'s delay (the
in-process worker as a wait on the job's cancel event, the Dramatiq middleware
as a delayed message); the gaps are read from the job's stored attempt
history. Only lower bounds are checked: machines are noisy.
"""

from __future__ import annotations

import itertools
from datetime import datetime

from pypepper_dramatiq import Context, Status, Task, workflow_task

from .drivers import Driver, make_job, run

#: Timer granularity allowed when asserting that a wait lasted at least its delay.
EPSILON = 0.01


@workflow_task(name="driver-backoff.always-fails")
def always_fails(task: Task, context: Context) -> None:
    raise RuntimeError("planned failure")


def test_both_drivers_wait_the_backed_off_delay_before_each_retry(driver: Driver) -> None:
    job = make_job(
        [always_fails.options(retry_count=3, retry_delay=0.1, retry_backoff=2).task(name="t")]
    )

    [record] = run(driver, job)

    assert record.status is Status.FAILED
    entries = record.state["history"]["0.0"]
    assert [entry["attempt"] for entry in entries] == [0, 1, 2, 3]
    gaps = [
        (datetime.fromisoformat(later["started"]) - datetime.fromisoformat(earlier["ended"]))
        for earlier, later in itertools.pairwise(entries)
    ]
    waited = [gap.total_seconds() for gap in gaps]
    # A fixed retry_delay would wait 0.1 s each time.
    expected = [0.1, 0.2, 0.4]
    assert all(gap >= wait - EPSILON for gap, wait in zip(waited, expected, strict=True)), waited
