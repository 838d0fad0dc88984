"""Payloads across a deploy, with a real ``dramatiq`` worker: an older producer stores
the old payload of a task whose newer module the worker runs.

A key the task no longer takes is dropped (one warning in the worker's log) and a
parameter added since takes its default; a payload the new code cannot decode
fails the job at once with ``PayloadError``: the task is not called, no retry.
"""

from __future__ import annotations

from typing import Any

import pytest

from pypepper_dramatiq import Status, Task

from .harness import Cluster
from .worker_app import CHANNEL

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def _old_producer_task(params: dict[str, Any]) -> Task:
    """The task as the older release's producer made it: by id, with its JSON params."""
    return Task(
        CHANNEL,
        "",
        "it.invoice",
        "invoice",
        None,
        "",
        [],
        None,
        executor_id="it.invoice",
        params=params,
        retry_count=3,
    )


def test_a_worker_of_the_new_release_runs_old_payloads_or_fails_them_at_once(
    cluster: Cluster,
) -> None:
    worker = cluster.start_worker()
    evolved = cluster.schedule(
        _old_producer_task(
            {
                "customer": {"name": "Ada", "phone": "555-0100"},
                "amount": "9.90",
                "due": "2031-01-31",
                "note": "a parameter of the old release",
            }
        )
    )
    broken = cluster.schedule(
        _old_producer_task({"customer": {"name": "Bob"}, "amount": "nine", "due": "2031-01-31"})
    )

    records = cluster.wait_status([evolved], timeout=60)
    assert records[evolved.id].state["results"] == {
        "0.0": ["Customer", "Decimal", "date", "9.90", "EUR"]
    }
    failed = cluster.wait_status([broken], timeout=60, statuses=[Status.FAILED])[broken.id]
    assert failed.state["attempts"] == {"0.0": 1}
    assert cluster.runs(broken, "invoice") == 0
    error = failed.error or ""
    assert "PayloadError" in error and "parameter 'amount'" in error, error
    assert "not a decimal number" in error

    lines = [line for line in worker.log().splitlines() if "'note'" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and "it.invoice" in lines[0], lines
