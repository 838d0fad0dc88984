"""A handler class with a real ``dramatiq`` worker: the worker imports only the task
module (``worker_app``), which registers :class:`~worker_app.DeclinedCharge` once with
its dependency; the producer builds the task by its id, naming neither hook nor policy.

The handler's own ``on_final_failure`` runs once, in the worker process, through the
dependency it was built with; its class's ``retry_count`` applies.
"""

from __future__ import annotations

import os

import pytest

from pypepper_dramatiq import Status, executor_task

from .harness import Cluster, wait_for
from .worker_app import CHARGE_HANDLER, trace_key

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_a_handlers_hook_and_policy_apply_in_a_worker_that_knows_only_the_task_module(
    cluster: Cluster,
) -> None:
    worker = cluster.start_worker()
    job = cluster.schedule(executor_task(CHARGE_HANDLER, name="charge"))

    failed = cluster.wait_status([job], timeout=60, statuses=[Status.FAILED])[job.id]

    assert failed.state["attempts"] == {"0.0": 2}  # DeclinedCharge.retry_count = 1
    assert cluster.runs(job, "charge") == 2
    pages_key = trace_key("pages", job.id, "charge")
    wait_for(lambda: cluster.redis.llen(pages_key) > 0, 30, "the handler's hook")
    pages = [page.decode() for page in cluster.redis.lrange(pages_key, 0, -1)]
    assert len(pages) == 1, pages
    label, pid, error = pages[0].split("|", 2)
    assert label == "oncall"  # the pager the handler was registered with
    assert int(pid) in worker.group_pids() and int(pid) != os.getpid()
    assert error == "RuntimeError: card declined (2)"
    assert "hooks_done" in cluster.saved(job).state
