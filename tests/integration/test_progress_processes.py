"""Progress with a real ``dramatiq`` worker, Redis and PostgreSQL: what a task reports
is readable from this (another) process while it runs, and the last value stays."""

from __future__ import annotations

import pytest

from pypepper_dramatiq import Job, Status

from .harness import Cluster, wait_for
from .worker_app import reports_progress, trace_key

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_progress_is_readable_from_another_process_while_the_task_runs(
    cluster: Cluster,
) -> None:
    cluster.start_worker()
    job = cluster.schedule(reports_progress.task(name="count", items=500))

    def running_progress() -> dict | None:
        record = Job.get_saved(job.id)
        if record is None or record.status is not Status.IN_PROGRESS:
            return None
        return record.progress.get("0.0")

    seen = wait_for(running_progress, 15, "the running task's progress in the row")
    assert (seen["task"], seen["done"], seen["total"], seen["note"]) == ("count", 3, 500, "a third")

    cluster.redis.set(trace_key("go", job.id, "count"), "1")
    [record] = cluster.wait_status([job], timeout=30).values()
    assert record.progress["0.0"]["done"] == 500 and record.progress["0.0"]["note"] == "all"
