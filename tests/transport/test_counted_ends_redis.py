"""A job cancelled while held in the store, by a process without metrics, is counted
once by the sweep leader of a worker with metrics.

On Redis a job planned an hour later has no message: no worker meets it again once
it is cancelled, so only the recovery sweep's look at recent ends
(``RecoverySweeper.count_ends``) can count it.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pypepper_dramatiq import Job, get_job_store
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.metrics.prometheus import install_metrics, uninstall_metrics
from pypepper_dramatiq.ops import observers

from .one_task_jobs import one_task_job

pytestmark = pytest.mark.redis

CHANNEL = "counted-ends"
HOUR = 3600


def cancelled(registry: CollectorRegistry) -> float:
    labels = {"status": "Cancelled", "channel": CHANNEL, "category": ""}
    return registry.get_sample_value("pypepper_jobs_ended_total", labels) or 0.0


def test_a_delayed_job_cancelled_without_metrics_is_counted_once_by_the_sweep(
    broker: object,
) -> None:
    job = one_task_job(CHANNEL)
    job.scheduled(delay=HOUR)
    held = get_job_store().get(job.id)
    assert held is not None and held.release_at is not None  # no message in flight
    assert not observers.observing()  # this process, as the CLI: no metrics
    assert Job.cancel_saved(job.id, by="cli") is True

    registry = CollectorRegistry()
    metrics = install_metrics(registry)  # now the worker's process, with metrics
    try:
        sweep = RecoverySweeper(broker, "worker-1", lease_seconds=30, interval=1)  # type: ignore[arg-type]
        sweep.sweep(full=True)
        assert cancelled(registry) == 1
        sweep.sweep(full=True)
        # Another worker taking the lead later reads it again: counted already.
        RecoverySweeper(broker, "worker-2", lease_seconds=30, interval=1).sweep(full=True)  # type: ignore[arg-type]
        assert cancelled(registry) == 1
    finally:
        uninstall_metrics(metrics)
    record = get_job_store().get(job.id)
    assert record is not None and record.state["counted"] is True
    assert record.state["cancelled_by"]["by"] == "cli"
