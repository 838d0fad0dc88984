"""OpenTelemetry spans on both drivers, read from the SDK's in-memory exporter.

The producer's ``pypepper.schedule`` span is the parent of every ``pypepper.attempt``
span of its job (the trace context stored with the job); attributes and events are
those :mod:`pypepper_dramatiq.metrics.tracing` documents.
``tests/integration/test_tracing_processes.py`` follows the same trace into a real
worker process.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pypepper_dramatiq
from pypepper_dramatiq import (
    ConfigError,
    Context,
    JobCancellationError,
    JobRecord,
    Status,
    StoreError,
    Task,
    schedule_many,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.metrics import tracing
from pypepper_dramatiq.ops import observers
from pypepper_dramatiq.records.state import TRACE_KEY
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .conftest import workflow_middleware
from .drivers import CHANNEL, DramatiqDriver, Driver, make_job, run

#: Attempts made so far, by job id.
CALLS: dict[str | None, int] = {}


@workflow_task(name="tracing.work")
def work(task: Task, context: Context, *, fail_first: int = 0) -> str:
    CALLS[context.job_id] = CALLS.get(context.job_id, 0) + 1
    if CALLS[context.job_id] <= fail_first:
        raise RuntimeError("planned failure")
    return "done"


#: The span a task makes itself, inside its attempt.
USER_SPAN = "user.inside"


@workflow_task(name="tracing.user_span")
def user_span(task: Task, context: Context, *, fail_first: int = 0) -> str:
    [observer] = [o for o in observers.installed() if isinstance(o, tracing.TracingObserver)]
    tracer = trace.get_tracer("user", tracer_provider=observer.tracer_provider)
    with tracer.start_as_current_span(USER_SPAN):
        CALLS[context.job_id] = CALLS.get(context.job_id, 0) + 1
        if CALLS[context.job_id] <= fail_first:
            raise RuntimeError("planned failure")
        return "done"


@workflow_task(name="tracing.quit")
def quit_job(task: Task, context: Context) -> None:
    raise JobCancellationError("nothing to do today")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans of this test alone, exported as each ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = tracing.install_tracing(provider)
    yield exporter
    tracing.uninstall_tracing(observer)
    provider.shutdown()


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


def test_each_attempt_span_is_a_child_of_the_producers_schedule_span(
    driver: Driver, exporter: InMemorySpanExporter
) -> None:
    job = make_job([work.task(name="first"), work.task(name="second")])

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    spans = exporter.get_finished_spans()
    [schedule] = named(spans, tracing.SCHEDULE_SPAN)
    assert attributes(schedule) == {tracing.JOB_ID: job.id, tracing.CHANNEL: CHANNEL}
    attempts = named(spans, tracing.ATTEMPT_SPAN)
    assert [attributes(span) for span in attempts] == [
        {
            tracing.JOB_ID: job.id,
            tracing.TASK: name,
            tracing.ATTEMPT: 1,
            tracing.ROUND: 1,
            tracing.CHANNEL: CHANNEL,
            tracing.OUTCOME: "succeeded",
        }
        for name in ("first", "second")
    ]
    assert schedule.context is not None
    for span in attempts:
        assert span.parent is not None
        assert span.parent.span_id == schedule.context.span_id
        assert span.context is not None
        assert span.context.trace_id == schedule.context.trace_id
    # Stored once, with the Scheduled row: the W3C trace context of the schedule span.
    traceparent = record.state[TRACE_KEY]["traceparent"]
    assert traceparent.split("-")[1:3] == [
        f"{schedule.context.trace_id:032x}",
        f"{schedule.context.span_id:016x}",
    ]


def test_a_retried_task_has_one_span_per_attempt_with_a_retry_event(
    driver: Driver, exporter: InMemorySpanExporter
) -> None:
    job = make_job([work.options(retry_count=2).task(name="flaky", fail_first=2)])

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    spans = exporter.get_finished_spans()
    [schedule] = named(spans, tracing.SCHEDULE_SPAN)
    attempts = named(spans, tracing.ATTEMPT_SPAN)
    assert [attributes(span)[tracing.ATTEMPT] for span in attempts] == [1, 2, 3]
    assert [attributes(span)[tracing.OUTCOME] for span in attempts] == [
        "failed",
        "failed",
        "succeeded",
    ]
    assert [events(span) for span in attempts] == [
        [tracing.RETRY_EVENT],
        [tracing.RETRY_EVENT],
        [],
    ]
    assert schedule.context is not None
    assert {span.parent.span_id for span in attempts if span.parent} == {schedule.context.span_id}


def test_a_cancel_is_an_event_on_the_attempt_span(
    driver: Driver, exporter: InMemorySpanExporter
) -> None:
    job = make_job([quit_job.task(name="quit")])

    [record] = run(driver, job)

    assert record.status is Status.CANCELLED
    [attempt] = named(exporter.get_finished_spans(), tracing.ATTEMPT_SPAN)
    assert attributes(attempt)[tracing.OUTCOME] == "cancelled"
    assert events(attempt) == [tracing.CANCEL_EVENT]


def test_a_missed_start_deadline_is_an_event_under_the_schedule_span(
    driver: Driver, exporter: InMemorySpanExporter
) -> None:
    job = make_job([work.task(name="late")])
    job.scheduled(max_start_delay=0)  # any start is later than that
    driver.start()
    [record] = driver.wait(job)

    assert record.status is Status.CANCELLED
    spans = exporter.get_finished_spans()
    [schedule] = named(spans, tracing.SCHEDULE_SPAN)
    [deadline] = named(spans, tracing.DEADLINE_SPAN)
    assert named(spans, tracing.ATTEMPT_SPAN) == []
    assert events(deadline) == [tracing.DEADLINE_EVENT]
    assert schedule.context is not None and deadline.parent is not None
    assert deadline.parent.span_id == schedule.context.span_id


def test_schedule_many_gives_each_job_its_own_schedule_span(
    driver: Driver, exporter: InMemorySpanExporter
) -> None:
    jobs = [make_job([work.task(name="one")]) for _ in range(3)]
    schedule_many(jobs)
    driver.start()
    driver.wait(*jobs)

    spans = exporter.get_finished_spans()
    schedules = {attributes(s)[tracing.JOB_ID]: s for s in named(spans, tracing.SCHEDULE_SPAN)}
    assert sorted(schedules) == sorted(job.id for job in jobs)
    for span in named(spans, tracing.ATTEMPT_SPAN):
        parent = schedules[attributes(span)[tracing.JOB_ID]]
        assert parent.context is not None and span.parent is not None
        assert span.parent.span_id == parent.context.span_id


def test_without_tracing_nothing_is_stored_with_the_job(driver: Driver) -> None:
    assert not any(isinstance(o, tracing.TracingObserver) for o in observers.installed())
    job = make_job([work.task(name="plain")])

    [record] = run(driver, job)

    assert record.status is Status.COMPLETED
    assert TRACE_KEY not in record.state


def test_tracing_without_opentelemetry_is_a_config_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)  # as if not installed

    with pytest.raises(ConfigError, match=r"pypepper-dramatiq\[otel\]"):
        pypepper_dramatiq.setup(broker=StubBroker(), tracing=True)
    assert not any(isinstance(o, tracing.TracingObserver) for o in observers.installed())


def test_setup_with_tracing_installs_one_observer_on_the_global_provider(
    stub_broker: StubBroker,
) -> None:
    pypepper_dramatiq.setup(broker=stub_broker, tracing=True)
    pypepper_dramatiq.setup(broker=stub_broker, tracing=True)
    try:
        found = [o for o in observers.installed() if isinstance(o, tracing.TracingObserver)]
        assert len(found) == 1 and found[0].tracer_provider is None
    finally:
        for observer in found:
            tracing.uninstall_tracing(observer)


class LosesTheScheduledWrite(MemoryJobStore):
    """A store whose inserts fail while ``refusing`` (the producer's Scheduled row)."""

    refusing = True

    def put(self, record: JobRecord) -> bool:
        if self.refusing:
            raise StoreError("the database went away for a moment")
        return super().put(record)


def test_a_row_healed_from_its_first_message_continues_the_trace(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    exporter: InMemorySpanExporter,
) -> None:
    store = LosesTheScheduledWrite()
    set_job_store(store)
    job = make_job([work.task(name="healed")])
    job.scheduled()  # the message went; its row did not
    assert store.get(job.id) is None
    store.refusing = False  # back: the worker heals the row from the message

    driver = DramatiqDriver(stub_broker, start_worker)
    driver.start()
    [record] = driver.wait(job)

    assert record.status is Status.COMPLETED
    spans = exporter.get_finished_spans()
    [schedule] = named(spans, tracing.SCHEDULE_SPAN)
    [attempt] = named(spans, tracing.ATTEMPT_SPAN)
    assert schedule.context is not None and attempt.parent is not None
    assert attempt.parent.span_id == schedule.context.span_id
    assert TRACE_KEY in record.state


@pytest.mark.parametrize("setup_options", [{"claim_fetched": True}])
def test_with_tracing_the_worker_threads_still_leave_outcomes_to_the_completion_thread(
    stub_broker: StubBroker,
    start_worker: Callable[[], dramatiq.Worker],
    exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="opentelemetry")
    # A retry after a delay: it goes as a message (not continued in the worker thread).
    flaky = user_span.options(retry_count=1, retry_delay=0.05)
    job = make_job([flaky.task(name="inside", fail_first=1)])

    [record] = run(DramatiqDriver(stub_broker, start_worker), job)

    assert record.status is Status.COMPLETED
    # Tracing did not keep the outcomes in the worker threads: none recorded one.
    assert workflow_middleware(stub_broker).book.outcomes.stats.calls == 0
    spans = exporter.get_finished_spans()
    [schedule] = named(spans, tracing.SCHEDULE_SPAN)
    attempts = named(spans, tracing.ATTEMPT_SPAN)
    # Ended by the completion thread, after the outcome's attribute and events.
    assert [attributes(span)[tracing.OUTCOME] for span in attempts] == ["failed", "succeeded"]
    assert [events(span) for span in attempts] == [[tracing.RETRY_EVENT], []]
    assert schedule.context is not None
    assert [span.parent.span_id for span in attempts if span.parent] == [
        schedule.context.span_id
    ] * 2
    # The task's own spans are children of its attempt's span, current in its thread.
    inside = named(spans, USER_SPAN)
    assert [span.parent.span_id for span in inside if span.parent] == [
        span.context.span_id for span in attempts if span.context
    ]
    # Each attempt span ended once (the SDK warns of a second end) and none is left.
    assert not [r for r in caplog.records if "ended span" in r.getMessage()]
    [observer] = [o for o in observers.installed() if isinstance(o, tracing.TracingObserver)]
    assert observer._left == {}
