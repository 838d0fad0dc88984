"""OpenTelemetry traces of jobs: a span where a job is scheduled, one per attempt.

``pip install 'pypepper-dramatiq[otel]'`` (opentelemetry-api and -sdk), configure a
tracer provider as OpenTelemetry asks (or pass one), then turn tracing on with
``setup(..., tracing=True)`` or :func:`install_tracing` in the producers and in the
workers' module. It is an :class:`~pypepper_dramatiq.ops.observers.Observer`: the
engine tells it what it decided, where it decided it, on both drivers.

* **pypepper.schedule** (kind PRODUCER): around ``Job.scheduled()`` (and each job of
  ``schedule_many``), a child of the span current in the producer. Its context
  (W3C ``traceparent``, and ``tracestate``) is stored once with the job, in its
  state's ``trace`` (:data:`~pypepper_dramatiq.records.state.TRACE_KEY`), so that
  it travels with the row and with the first message.
* **pypepper.attempt** (kind CONSUMER): one per attempt, in whichever process runs it
  (a retry hours later, the first attempt of a job a worker healed from its message),
  a child of the job's schedule span, current in the thread that runs the task
  while it runs (spans the task makes are its children), ended once its outcome is
  recorded (by that thread, or by the completion thread it was handed to).
* **pypepper.deadline** : a job cancelled unrun because it missed its start deadline
  has no attempt; this short span, a child of the schedule span, carries the event.

Attributes: :data:`JOB_ID`, :data:`TASK`, :data:`ATTEMPT` (counted from 1 within
the round, as "attempt 2 of 3" counts), :data:`ROUND`, :data:`OUTCOME` (the attempt
history's word: ``succeeded``, ``failed``, ``timed_out``, ``cancelled``),
:data:`CHANNEL`. Events: :data:`RETRY_EVENT` (another attempt is due),
:data:`CANCEL_EVENT` (the attempt or its job was cancelled), :data:`DEADLINE_EVENT`.

Nothing here imports OpenTelemetry until an observer is made: with tracing off the
package never imports it, and scheduling and attempts pay one test of an empty
tuple, as for any observer.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..ops import observers
from ..records.history import CANCELLED, SUCCEEDED
from ..records.record import JobRecord
from ..records.state import trace_of
from ..rules.status import Status

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

#: The instrumentation's name, as its tracer is named.
INSTRUMENTATION = "pypepper_dramatiq"

#: The span around scheduling a job, in the producer.
SCHEDULE_SPAN = "pypepper.schedule"
#: The span of one attempt, in the process that runs it.
ATTEMPT_SPAN = "pypepper.attempt"
#: The span of a job cancelled unrun for missing its start deadline.
DEADLINE_SPAN = "pypepper.deadline"

#: Attribute: the job's id.
JOB_ID = "pypepper.job_id"
#: Attribute: the task's (stored) name.
TASK = "pypepper.task"
#: Attribute: the attempt, counted from 1 within its round.
ATTEMPT = "pypepper.attempt"
#: Attribute: the round, counted from 1.
ROUND = "pypepper.round"
#: Attribute: how the attempt ended (the attempt history's word).
OUTCOME = "pypepper.outcome"
#: Attribute: the channel the job runs on.
CHANNEL = "pypepper.channel"

#: Event: the attempt failed and another one is due.
RETRY_EVENT = "pypepper.retry"
#: Event: the attempt, or its job, was cancelled.
CANCEL_EVENT = "pypepper.cancel"
#: Event: the job was cancelled unrun, its start deadline missed.
DEADLINE_EVENT = "pypepper.deadline_missed"


@dataclass
class _Attempt:
    """An open attempt span, current in the thread that runs its task until left."""

    job_id: str
    span: Span
    #: The attachment of the span as its thread's current context (None once left).
    token: object | None
    cancelled: bool = False


class TracingObserver(observers.Observer):
    """Makes the spans of jobs with ``tracer_provider`` (None: OpenTelemetry's global one)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer_provider = tracer_provider
        self._tracer: Tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
        self._propagator = TraceContextTextMapPropagator()
        #: The attempt current in each thread (attached, until left or ended).
        self._local = threading.local()
        #: Attempts whose thread left their outcome to another, oldest first by job
        #: id: a job's next attempt may start before its last one's is ended.
        self._left: dict[str, list[_Attempt]] = {}
        self._lock = threading.Lock()

    # -- the producer ----------------------------------------------------------------

    def scheduling(
        self, job_id: str, channel_id: str
    ) -> AbstractContextManager[Mapping[str, str]] | None:
        return self._schedule_span(job_id, channel_id)

    @contextmanager
    def _schedule_span(self, job_id: str, channel_id: str) -> Iterator[Mapping[str, str]]:
        from opentelemetry.trace import SpanKind

        attributes = {JOB_ID: job_id, CHANNEL: channel_id}
        with self._tracer.start_as_current_span(
            SCHEDULE_SPAN, kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            yield carrier

    # -- the attempts ----------------------------------------------------------------

    def attempt_started(self, record: JobRecord, task: str, attempt: int, round: int) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind

        self._close()  # one left open in this thread (an attempt never recorded)
        span = self._tracer.start_span(
            ATTEMPT_SPAN,
            context=self._parent(record),
            kind=SpanKind.CONSUMER,
            attributes={
                JOB_ID: record.id,
                TASK: task,
                ATTEMPT: attempt,
                ROUND: round,
                CHANNEL: record.channel_id,
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        self._local.attempt = _Attempt(record.id, span, token)

    def task_ended(self, record: JobRecord, task: str, outcome: str, *_: Any) -> None:
        attempt = self._open(record.id)
        if attempt is None:
            return
        attempt.span.set_attribute(OUTCOME, outcome)
        if outcome == CANCELLED:
            self._cancelled(attempt)
        elif outcome != SUCCEEDED:
            from opentelemetry.trace import StatusCode

            attempt.span.set_status(StatusCode.ERROR, outcome)

    def retried(self, record: JobRecord, task: str) -> None:
        attempt = self._open(record.id)
        if attempt is not None:
            attempt.span.add_event(RETRY_EVENT, {TASK: task})

    def job_ended(self, record: JobRecord) -> None:
        attempt = self._open(record.id)
        if attempt is not None and record.status is Status.CANCELLED:
            self._cancelled(attempt)

    def deadline_missed(self, record: JobRecord) -> None:
        attempt = self._open(record.id)
        if attempt is not None:
            attempt.span.add_event(DEADLINE_EVENT)
            return
        attributes = {JOB_ID: record.id, CHANNEL: record.channel_id}
        span = self._tracer.start_span(
            DEADLINE_SPAN, context=self._parent(record), attributes=attributes
        )
        span.add_event(DEADLINE_EVENT)
        span.end()

    def attempt_left(self, job_id: str) -> None:
        from opentelemetry import context

        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        if attempt is None or attempt.job_id != job_id:
            return
        self._local.attempt = None
        token, attempt.token = attempt.token, None
        with suppress(Exception):  # attached in another context (never here): nothing to undo
            context.detach(token)  # type: ignore[arg-type]
        with self._lock:
            self._left.setdefault(job_id, []).append(attempt)

    def attempt_ended(self, job_id: str) -> None:
        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        if attempt is not None and attempt.job_id == job_id:
            self._close()
            return
        with self._lock:
            left = self._left.get(job_id)
            if not left:
                return
            attempt = left.pop(0)
            if not left:
                del self._left[job_id]
        attempt.span.end()

    # -- helpers ---------------------------------------------------------------------

    def _parent(self, record: JobRecord) -> Any:
        """The context of the job's schedule span (an empty one: the span is a root)."""
        return self._propagator.extract(trace_of(record.state) or {})

    def _open(self, job_id: str) -> _Attempt | None:
        """The attempt of ``job_id`` current in this thread, else the oldest one left."""
        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        if attempt is not None and attempt.job_id == job_id:
            return attempt
        with self._lock:
            left = self._left.get(job_id)
            return left[0] if left else None

    def _cancelled(self, attempt: _Attempt) -> None:
        if not attempt.cancelled:
            attempt.cancelled = True
            attempt.span.add_event(CANCEL_EVENT)

    def _close(self) -> None:
        from opentelemetry import context

        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        if attempt is None:
            return
        self._local.attempt = None
        attempt.span.end()
        with suppress(Exception):  # attached in another context (never here): nothing to undo
            context.detach(attempt.token)  # type: ignore[arg-type]


def install_tracing(tracer_provider: TracerProvider | None = None) -> TracingObserver:
    """Trace this process's scheduling and attempts; returns the observer.

    Installing again with the same ``tracer_provider`` returns the observer already
    installed. Install it in the producers (their schedule spans are the parents)
    and in the workers (their attempt spans).

    Raises:
        ConfigError: OpenTelemetry is not installed (the ``otel`` extra).
    """
    try:
        importlib.import_module("opentelemetry.trace")
    except ImportError as exc:
        raise ConfigError(
            "tracing needs OpenTelemetry, which is not installed; "
            "install it with: pip install 'pypepper-dramatiq[otel]'"
        ) from exc
    for observer in observers.installed():
        if isinstance(observer, TracingObserver) and observer.tracer_provider is tracer_provider:
            return observer
    tracing = TracingObserver(tracer_provider)
    observers.install(tracing)
    return tracing


def uninstall_tracing(tracing: TracingObserver) -> None:
    """Stop tracing into ``tracing`` (spans it made stay exported)."""
    observers.remove(tracing)
