"""Durable jobs: ``dramatiq bench.apps.durable`` (channel ``bench``, PostgreSQL store).

The broker is Redis, or RabbitMQ when ``BENCH_BROKER_URL`` names one (``amqp://``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from pypepper_dramatiq import Job, Workflow, setup, workflow_task
from pypepper_dramatiq.model.context import POSITION_KEY

from . import probe

#: The channel every benchmark job is sent to.
CHANNEL = "bench"


def sdk_tracer_provider(exported: Callable[[int], None]) -> Any:
    """OpenTelemetry's SDK tracer provider, each ended span handed at once
    (``SimpleSpanProcessor``) to an exporter that only counts: ``exported(n)`` is
    called with every 100 spans. What tracing costs with nothing sent anywhere."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class CountingExporter(SpanExporter):
        def __init__(self) -> None:
            self.pending = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.pending += len(spans)
            if self.pending >= 100:
                exported(self.pending)
                self.pending = 0
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(CountingExporter()))
    return provider


# Scenario 17 (tracing) starts workers with setup(tracing=True) on the SDK's provider.
TRACING = os.environ.get("BENCH_TRACING") == "1"
if TRACING:
    from opentelemetry import trace

    trace.set_tracer_provider(sdk_tracer_provider(lambda n: probe.count("spans", n)))

if os.environ.get("BENCH_COMPLETION_THREAD") == "0":  # scenario 22's prototype variant
    from pypepper_dramatiq.drivers.dramatiq import middleware as _middleware

    _middleware.COMPLETION_THREAD = False

broker = setup(
    os.environ.get("BENCH_BROKER_URL") or os.environ["BENCH_REDIS_URL"],
    os.environ["BENCH_STORE_URI"],
    # Scenario 18 (rate_limit) starts workers with the channel limited (``"50/s"``).
    channels={CHANNEL: {"maxsize": None, "rate_limit": os.environ.get("BENCH_RATE_LIMIT") or None}},
    # Scenario 20 (concurrency) starts workers with the keys limited (``{"tenant-*": 3}``).
    concurrency=json.loads(os.environ.get("BENCH_CONCURRENCY") or "null"),
    migrate=True,
    # Scenario 9 (purge) starts a worker with retention; the others keep every job.
    retention=json.loads(os.environ.get("BENCH_RETENTION") or "null"),
    # Scenario 14 (metrics) starts workers with the Prometheus metrics on.
    metrics=os.environ.get("BENCH_METRICS") == "1",
    tracing=TRACING,
    # Each fetch claimed ahead, the default; scenario 22 (claims_ahead) also starts
    # workers with it off ("0") to compare.
    claim_fetched=os.environ.get("BENCH_CLAIM_FETCHED") != "0",
)
if os.environ.get("BENCH_COUNT_TRIPS") == "1":  # scenario 20 counts blocking calls
    from . import trips

    trips.install()


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


@workflow_task(name="bench.busy")
def busy(task: Any, context: Any, key: str | None = None, seconds: float = 0.02) -> None:
    """Works ``seconds`` (a sleep: its thread free for the others), then marks ``key``."""
    time.sleep(seconds)
    probe.mark("durable", key)


def keyed_job(concurrency_key: str | None, key: str, seconds: float) -> Job:
    """A job of one :func:`busy` task, scheduled under ``concurrency_key`` by the caller."""
    new = Job(category="bench", channel_id=CHANNEL)
    new.workflows.append(Workflow([busy.task(key=key, seconds=seconds)]))
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


# -- scenario 16: typed parameters against the same values as plain JSON ---------------------


@dataclass
class Order:
    """The dataclass parameter of :func:`typed_params`."""

    id: int
    customer: str
    lines: list[str]


#: The parameters of both tasks: as their types, and as the JSON a caller would write.
ORDER = Order(7, "ada", ["book", "pen"])
AT = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
AMOUNT = Decimal("12.50")
AS_JSON = {
    "order": {"id": 7, "customer": "ada", "lines": ["book", "pen"]},
    "at": "2026-12-04T10:00:00+00:00",
    "amount": "12.50",
}


@workflow_task(name="bench.typed_params")
def typed_params(task: Any, context: Any, order: Order, at: datetime, amount: Decimal) -> None:
    """Takes a dataclass, a datetime and a Decimal (encoded when scheduled, decoded here)."""
    if not (isinstance(order, Order) and isinstance(at, datetime) and isinstance(amount, Decimal)):
        raise TypeError("the parameters did not arrive as their types")
    probe.mark("durable")


@workflow_task(name="bench.json_params")
def json_params(task: Any, context: Any, order: dict, at: str, amount: str) -> None:
    """The same values as plain JSON: a dict and two strings."""
    probe.mark("durable")


def params_job(typed: bool) -> Job:
    """A one-task job whose task takes typed parameters, or the same as plain JSON."""
    new = Job(category="bench", channel_id=CHANNEL)
    if typed:
        task = typed_params.task(order=ORDER, at=AT, amount=AMOUNT)
    else:
        task = json_params.task(**AS_JSON)
    new.workflows.append(Workflow([task]))
    return new
