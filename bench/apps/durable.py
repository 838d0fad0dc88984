"""Durable jobs: ``dramatiq bench.apps.durable`` (channel ``bench``, PostgreSQL store).

The broker is Redis, or RabbitMQ when ``BENCH_BROKER_URL`` names one (``amqp://``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pypepper_dramatiq import Job, Workflow, setup, workflow_task
from pypepper_dramatiq.model.context import POSITION_KEY

from . import probe

#: The channel every benchmark job is sent to.
CHANNEL = "bench"

broker = setup(
    os.environ.get("BENCH_BROKER_URL") or os.environ["BENCH_REDIS_URL"],
    os.environ["BENCH_STORE_URI"],
    channels=[CHANNEL],
    migrate=True,
    # Scenario 9 (purge) starts a worker with retention; the others keep every job.
    retention=json.loads(os.environ.get("BENCH_RETENTION") or "null"),
    # Scenario 14 (metrics) starts workers with the Prometheus metrics on.
    metrics=os.environ.get("BENCH_METRICS") == "1",
)


@workflow_task(name="bench.noop")
def noop(task: Any, context: Any, key: str | None = None) -> None:
    probe.mark("durable", key)


@workflow_task(name="bench.flaky", retry_count=2, retry_delay=1)
def flaky(task: Any, context: Any) -> None:
    """Fails on its first two attempts, so each job waits out two retry delays."""
    attempt = context.get(POSITION_KEY)[3]
    probe.mark("stormtry")
    if attempt < 2:
        raise RuntimeError(f"planned failure {attempt + 1} of 2")
    probe.mark("storm")


@workflow_task(name="bench.tick")
def tick(task: Any, context: Any) -> None:
    """The recurring scenario's task: counts the runs of each job, by job id."""
    probe.mark_job("tick", context.job_id)


@workflow_task(name="bench.progress")
def progress_loop(task: Any, context: Any, calls: int = 100_000, report: bool = True) -> dict:
    """Counts ``calls`` items, with ``bar.succeeded()`` each (``report``) or a plain
    counter: the loop's seconds and the progress writes made while it ran."""
    started = time.perf_counter()
    if report:
        bar = context.progress_bar(calls)
        for _ in range(calls):
            bar.succeeded()
    else:
        counted = [0]
        for _ in range(calls):
            counted[0] += 1
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "writes": context.progress_reporter.writes if report else 0}


def progress_job(calls: int, report: bool) -> Job:
    new = Job(category="progress", channel_id=CHANNEL)
    new.workflows.append(Workflow([progress_loop.task(name="loop", calls=calls, report=report)]))
    return new


def job(tasks: int = 1, key: str | None = None) -> Job:
    """A job of ``tasks`` no-op tasks; the first carries ``key`` for latency probes."""
    new = Job(category="bench", channel_id=CHANNEL)
    new.workflows.append(Workflow([noop.task(key=key if i == 0 else None) for i in range(tasks)]))
    return new


def storm_job() -> Job:
    new = Job(category="storm", channel_id=CHANNEL)
    new.workflows.append(Workflow([flaky.task()]))
    return new


def tick_job() -> Job:
    """The recurring scenario's template: one task that counts its runs per job."""
    new = Job(category="tick", channel_id=CHANNEL)
    new.workflows.append(Workflow([tick.task()]))
    return new
