"""The user module the integration tests run under the stock ``dramatiq`` CLI.

Workers start it as ``dramatiq worker_app --processes P --threads T`` with this
directory on ``PYTHONPATH``; the servers and timing knobs come from the
environment (see :data:`ENV`). The test process imports it too, without those
variables, only to build tasks: then nothing connects anywhere.

Every task execution leaves traces in Redis (see :func:`probe`), so a test can
count runs, see what runs now, and time cancels without sharing memory with
the worker; that Redis is the broker too, unless ``PYPEPPER_IT_BROKER_URL`` names
another one (RabbitMQ).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any, TypeVar

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    Context,
    IExecutor,
    Job,
    JobCancellationError,
    Task,
    Workflow,
    executor_registry,
    setup,
    workflow_task,
)
from pypepper_dramatiq.engine.functions import FunctionExecutor

#: Environment variables a worker reads, and their defaults.
ENV = {
    #: the Redis of the probes' traces; the broker too unless ``broker_url`` is set.
    "redis_url": "PYPEPPER_IT_REDIS_URL",
    #: the broker's URL (``amqp://``: RabbitMQ); unset: ``redis_url``.
    "broker_url": "PYPEPPER_IT_BROKER_URL",
    "store_uri": "PYPEPPER_IT_STORE_URI",
    "lease_seconds": "PYPEPPER_IT_LEASE_SECONDS",
    "sweep_interval": "PYPEPPER_IT_SWEEP_INTERVAL",
    "cancel_grace": "PYPEPPER_IT_CANCEL_GRACE",
    #: seconds a step's message may wait in its queue before recovery sends it again.
    "dispatch_seconds": "PYPEPPER_IT_DISPATCH_SECONDS",
    "heartbeat_timeout_ms": "PYPEPPER_IT_HEARTBEAT_TIMEOUT_MS",
    "shutdown_grace": "PYPEPPER_IT_SHUTDOWN_GRACE",
    "unknown_task_grace": "PYPEPPER_IT_UNKNOWN_TASK_GRACE",
    #: "1": this worker also knows :func:`deployed_later` (a worker already upgraded).
    "upgraded": "PYPEPPER_IT_UPGRADED",
    #: "1": log each step's bookkeeping (claims, records, lost writes) at DEBUG.
    "debug_steps": "PYPEPPER_IT_DEBUG_STEPS",
    "defer_seconds": "PYPEPPER_IT_DEFER_SECONDS",
    #: ``setup(retention=...)`` as JSON (status -> duration); unset: no retention.
    "retention": "PYPEPPER_IT_RETENTION",
    #: "1": ``setup(metrics=True)`` and Dramatiq's Prometheus middleware on the broker
    #: (its exposition server reads ``dramatiq_prom_db`` / ``_host`` / ``_port``).
    "metrics": "PYPEPPER_IT_METRICS",
    #: the bound of continuation (``setup(continue_steps=, continue_seconds=)``);
    #: unset: the defaults.
    "continue_steps": "PYPEPPER_IT_CONTINUE_STEPS",
    "continue_seconds": "PYPEPPER_IT_CONTINUE_SECONDS",
    #: the channels this worker serves, comma-separated (unset: :data:`CHANNEL`).
    "channels": "PYPEPPER_IT_CHANNELS",
    #: "1": log each row the step I/O heals from a message (DEBUG), and no other step line.
    "log_heals": "PYPEPPER_IT_LOG_HEALS",
    #: a directory: ``setup(tracing=True)``, each process writing the spans it ends
    #: to ``spans-<pid>.jsonl`` there (:class:`JsonLinesSpanExporter`).
    "trace_dir": "PYPEPPER_IT_TRACE_DIR",
    #: ``setup(defaults=...)`` as JSON (option -> value); unset: no defaults.
    "defaults": "PYPEPPER_IT_DEFAULTS",
    #: the rate limit of every channel this worker serves (``"5/s"``); unset: none.
    "rate_limit": "PYPEPPER_IT_RATE_LIMIT",
    #: RabbitMQ: the broker's ``max_priority`` (its queues declared with
    #: ``x-max-priority``); unset: none.
    "max_priority": "PYPEPPER_IT_MAX_PRIORITY",
    #: the concurrency limit of every channel this worker serves (``"2"``); unset: none.
    "max_running": "PYPEPPER_IT_MAX_RUNNING",
    #: ``setup(concurrency=...)`` as JSON (pattern -> limit); unset: none.
    "concurrency": "PYPEPPER_IT_CONCURRENCY",
    #: "0": ``setup(claim_fetched=False)``: each step claimed and recorded by its
    #: thread; "1" (or unset): each Redis fetch claimed ahead of the threads, the default.
    "claim_fetched": "PYPEPPER_IT_CLAIM_FETCHED",
    #: with ``claim_fetched``: what this worker's completion thread never does, as if
    #: the process froze there: ``record`` (it stops for good before recording the
    #: first outcomes it took) or ``ack`` (it records every outcome, and acknowledges
    #: no message).
    "hold_completion": "PYPEPPER_IT_HOLD_COMPLETION",
}

#: The channel every test job goes to.
CHANNEL = "it"

REDIS_URL = os.environ.get(ENV["redis_url"])
BROKER_URL = os.environ.get(ENV["broker_url"]) or REDIS_URL
STORE_URI = os.environ.get(ENV["store_uri"])

if os.environ.get(ENV["debug_steps"]) == "1":
    logging.getLogger("pypepper_dramatiq.engine.step_io").setLevel(logging.DEBUG)
elif os.environ.get(ENV["log_heals"]) == "1":
    _ledger_logger = logging.getLogger("pypepper_dramatiq.engine.step_io")
    _ledger_logger.setLevel(logging.DEBUG)
    _ledger_logger.addFilter(
        lambda r: r.levelno > logging.DEBUG or getattr(r, "action", None) == "heal"
    )


def _trace_to(directory: str) -> None:
    """Make OpenTelemetry's global tracer provider write this process's spans as JSON
    lines under ``directory`` (imported only here: a worker without it never does)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonLinesSpanExporter(SpanExporter):
        """One JSON object per ended span: name, ids (hex), parent id, attributes, events."""

        def __init__(self, path: str) -> None:
            self.path = path

        def export(self, spans: Any) -> SpanExportResult:
            lines = []
            for span in spans:
                assert isinstance(span, ReadableSpan) and span.context is not None
                lines.append(
                    json.dumps(
                        {
                            "name": span.name,
                            "trace_id": f"{span.context.trace_id:032x}",
                            "span_id": f"{span.context.span_id:016x}",
                            "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                            "attributes": dict(span.attributes or {}),
                            "events": [event.name for event in span.events],
                        }
                    )
                )
            with open(self.path, "a", encoding="utf-8") as file:
                file.write("".join(line + "\n" for line in lines))
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    path = os.path.join(directory, f"spans-{os.getpid()}.jsonl")
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    trace.set_tracer_provider(provider)


def _hold_completion(where: str) -> None:
    """Make this process's completion thread never record (``where``: ``record``) or
    never acknowledge (``ack``): what a SIGKILL then finds."""
    from pypepper_dramatiq.drivers.dramatiq.completion import Completions
    from pypepper_dramatiq.engine.step_io import StepIO

    def frozen(*args: Any, **kwargs: Any) -> Any:
        while True:
            time.sleep(3600)

    if where == "record":
        StepIO.record_outcomes = frozen  # type: ignore[method-assign]
    elif where == "ack":
        Completions._acknowledge = lambda *args, **kwargs: None  # type: ignore[method-assign]
    else:
        raise ValueError(f"{ENV['hold_completion']}: record or ack, not {where!r}")


if REDIS_URL and BROKER_URL and STORE_URI:
    if os.environ.get(ENV["trace_dir"]):
        _trace_to(os.environ[ENV["trace_dir"]])
    MAX_PRIORITY = os.environ.get(ENV["max_priority"])
    broker = setup(
        None if MAX_PRIORITY else BROKER_URL,
        STORE_URI,
        broker=(
            RabbitmqBroker(url=BROKER_URL, confirm_delivery=True, max_priority=int(MAX_PRIORITY))
            if MAX_PRIORITY
            else None
        ),
        channels={
            c: {
                "maxsize": 0,
                "rate_limit": os.environ.get(ENV["rate_limit"]) or None,
                "max_running": (
                    int(os.environ[ENV["max_running"]])
                    if os.environ.get(ENV["max_running"])
                    else None
                ),
            }
            for c in os.environ.get(ENV["channels"], CHANNEL).split(",")
        },
        concurrency=json.loads(os.environ.get(ENV["concurrency"]) or "null"),
        migrate=True,
        lease_seconds=float(os.environ.get(ENV["lease_seconds"], "5")),
        sweep_interval=float(os.environ.get(ENV["sweep_interval"], "0.5")),
        cancel_grace=float(os.environ.get(ENV["cancel_grace"], "1")),
        dispatch_seconds=(
            float(os.environ[ENV["dispatch_seconds"]])
            if os.environ.get(ENV["dispatch_seconds"])
            else None
        ),
        heartbeat_timeout_ms=int(os.environ.get(ENV["heartbeat_timeout_ms"], "20000")),
        shutdown_grace=float(os.environ.get(ENV["shutdown_grace"], "0")),
        unknown_task_grace=float(os.environ.get(ENV["unknown_task_grace"], "300")),
        defer_seconds=float(os.environ.get(ENV["defer_seconds"], "2")),
        retention=json.loads(os.environ.get(ENV["retention"]) or "null"),
        metrics=os.environ.get(ENV["metrics"]) == "1",
        tracing=bool(os.environ.get(ENV["trace_dir"])),
        continue_steps=(
            int(os.environ[ENV["continue_steps"]])
            if os.environ.get(ENV["continue_steps"])
            else None
        ),
        continue_seconds=(
            float(os.environ[ENV["continue_seconds"]])
            if os.environ.get(ENV["continue_seconds"])
            else None
        ),
        defaults=json.loads(os.environ.get(ENV["defaults"]) or "null"),
        claim_fetched=os.environ.get(ENV["claim_fetched"]) != "0",
    )
    if os.environ.get(ENV["hold_completion"]):
        _hold_completion(os.environ[ENV["hold_completion"]])
    if os.environ.get(ENV["metrics"]) == "1":
        from dramatiq.middleware.prometheus import Prometheus

        broker.add_middleware(Prometheus())
else:
    # Imported by the test process for its task definitions: the plain actors
    # below need some broker to be declared on, and must not touch a server.
    broker = StubBroker()

_local = threading.local()


def counters() -> redis.Redis:
    """This thread's client for the trace keys (not the broker's connection)."""
    client: redis.Redis | None = getattr(_local, "client", None)
    if client is None:
        if not REDIS_URL:
            raise RuntimeError(f"{ENV['redis_url']} is not set: tasks run only in workers")
        client = _local.client = redis.Redis.from_url(REDIS_URL)
    return client


def trace_key(kind: str, job_id: str | None, name: str) -> str:
    """``kind:job_id:name``: the Redis keys tests read (see :func:`probe`)."""
    return f"{kind}:{job_id}:{name}"


#: How long a ``patient`` probe retries a trace write while Redis is unreachable.
PATIENCE_SECONDS = 60.0

_T = TypeVar("_T")


def _traced(patient: bool, write: Callable[[], _T]) -> _T:
    """``write()``; with ``patient``, retried while Redis is unreachable (a restart)."""
    if not patient:
        return write()
    deadline = time.monotonic() + PATIENCE_SECONDS
    while True:
        try:
            return write()
        except (redis.ConnectionError, redis.TimeoutError):  # incl. BusyLoadingError
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@workflow_task(name="it.probe")
def probe(
    task: Task,
    context: Context,
    *,
    sleep: float = 0.0,
    fail_times: int = 0,
    poll_cancel: bool = False,
    value: Any = None,
    add_to: str | None = None,
    block: bool = False,
    patient: bool = False,
    log_key: str | None = None,
    cancel_job: bool = False,
) -> Any:
    """A task that reports what happens to it.

    Keys written, for job ``J`` and task name ``N``:

    * ``runs:J:N``: INCR per execution; ``pids:J:N``: list of the worker pids;
    * ``starts:J:N`` / ``ends:J:N``: lists of wall-clock start and end times;
    * ``running:J:N``: set at start (the test waits for it before killing);
    * ``cancel_seen:J:N``: when a polling task saw ``context.cancelled``;
    * ``interrupted:J:N``: when an exception (e.g. the cancel interrupt) cut it short.

    Args:
        sleep: seconds to work (in 10 ms slices).
        fail_times: the first ``fail_times`` executions raise.
        poll_cancel: return as soon as ``context.cancelled`` is set (else never look).
        value: the result (or the base of it, with ``add_to``).
        add_to: name of an earlier task whose result is added to ``value``.
        block: sleep in one ``time.sleep`` call (blocked in C: an interrupt
            lands only when it returns) instead of 10 ms slices.
        patient: while Redis is unreachable (a restart), retry each trace write
            for up to :data:`PATIENCE_SECONDS` instead of failing the task.
        log_key: also RPUSH the job id to this Redis list at each start (how a test
            finds the jobs a recurring schedule fired, whatever retention deleted).
        cancel_job: raise ``JobCancellationError`` (after any planned failures):
            the task cancels its own job.
    """
    r = counters()
    job, name = context.job_id, task.name
    started = time.time()

    def trace_start() -> None:
        with r.pipeline() as pipe:
            pipe.incr(trace_key("runs", job, name))
            pipe.rpush(trace_key("pids", job, name), os.getpid())
            pipe.rpush(trace_key("starts", job, name), repr(started))
            pipe.set(trace_key("running", job, name), repr(started))
            if log_key is not None:
                pipe.rpush(log_key, str(job))
            pipe.execute()

    _traced(patient, trace_start)
    try:
        if (
            fail_times
            and _traced(patient, lambda: r.incr(trace_key("fails", job, name))) <= fail_times
        ):
            raise RuntimeError(f"{name}: planned failure")
        if cancel_job:
            raise JobCancellationError(f"{name}: nothing to do")
        if block:
            time.sleep(sleep)
        deadline = started + sleep
        while time.time() < deadline:
            if poll_cancel and context.cancelled:
                seen = repr(time.time())
                _traced(
                    patient, functools.partial(r.set, trace_key("cancel_seen", job, name), seen)
                )
                return "noticed the cancel"
            time.sleep(0.01)
    except BaseException as exc:
        if not isinstance(exc, RuntimeError):
            why = f"{time.time()!r} {type(exc).__name__}"
            _traced(patient, lambda: r.set(trace_key("interrupted", job, name), why))
        raise
    finally:
        ended = repr(time.time())
        _traced(patient, lambda: r.rpush(trace_key("ends", job, name), ended))
    if add_to is not None:
        return context.results[add_to] + value
    return value


@dramatiq.actor(broker=broker, max_retries=2, min_backoff=100, max_backoff=200)
def flaky_plain(key: str, failures: int = 2) -> int:
    """A plain actor that fails its first ``failures`` calls.

    Counts calls in ``plain:KEY``, and sets ``plain-done:KEY`` to the call that succeeded.
    """
    r = counters()
    r.sadd(f"plain-pids:{key}", os.getpid())
    calls = int(r.incr(f"plain:{key}"))
    if calls <= failures:
        raise RuntimeError(f"plain actor call {calls} fails on purpose")
    r.set(f"plain-done:{key}", calls)
    return calls


@workflow_task(name="it.async_probe")
async def async_probe(
    task: Task, context: Context, *, sleep: float = 0.0, slow_runs: int = 0, value: Any = None
) -> Any:
    """An ``async def`` task: awaits ``sleep`` seconds on its first ``slow_runs`` runs.

    Keys written, for job ``J`` and task name ``N``: ``runs:J:N`` (INCR per
    execution), ``ends:J:N`` (a time per run that returned), and
    ``interrupted:J:N`` with the name of the exception that stopped an await
    (``CancelledError`` when the step's supervisor cancelled it).

    Args:
        sleep: seconds to ``await asyncio.sleep`` on a slow run.
        slow_runs: how many of the first runs are slow (the later ones return at once).
        value: the result.
    """
    r = counters()
    job, name = context.job_id, task.name
    run = int(r.incr(trace_key("runs", job, name)))
    if run <= slow_runs:
        try:
            await asyncio.sleep(sleep)
        except BaseException as exc:
            r.set(trace_key("interrupted", job, name), f"{time.time()!r} {type(exc).__name__}")
            raise
    r.rpush(trace_key("ends", job, name), repr(time.time()))
    return value


@workflow_task(name="it.pause")
def pause(task: Task, context: Context, *, seconds: float = 0.0, value: Any = None) -> Any:
    """Sleeps ``seconds`` and returns ``value``, touching no server: it may end (and
    its worker record the end) while Redis is down."""
    time.sleep(seconds)
    return value


#: The executor id of a task only upgraded workers know (a rolling deploy).
DEPLOYED_LATER = "it.deployed-later"


def deployed_later(task: Task, context: Context, *, value: Any = None) -> Any:
    """A task of the new release: counts its runs and pids like :func:`probe`."""
    r = counters()
    with r.pipeline() as pipe:
        pipe.incr(trace_key("runs", context.job_id, task.name))
        pipe.rpush(trace_key("pids", context.job_id, task.name), os.getpid())
        pipe.execute()
    return value


if os.environ.get(ENV["upgraded"]) == "1":
    executor_registry.register(DEPLOYED_LATER, FunctionExecutor(deployed_later))


@workflow_task(name="it.quiet-sleeper")
def quiet_sleeper(
    task: Task, context: Context, *, sleep: float = 0.0, value: Any = None, trace_end: bool = True
) -> Any:
    """Counts its starts and finished runs in Redis, and touches nothing while it sleeps
    or when interrupted: for tests that stop Redis while it runs. Without
    ``trace_end`` it does not record its end either (read the row's history)."""
    r = counters()
    with r.pipeline() as pipe:
        pipe.incr(trace_key("runs", context.job_id, task.name))
        pipe.set(trace_key("running", context.job_id, task.name), repr(time.time()))
        pipe.execute()
    deadline = time.time() + sleep
    while time.time() < deadline:
        time.sleep(0.01)
    if trace_end:
        _traced(
            True, lambda: r.rpush(trace_key("ends", context.job_id, task.name), repr(time.time()))
        )
    return value


def hook_probe(task: Task, context: Context, error: str) -> None:
    """The ``on_final_failure`` hook of :func:`fail_with_hook`: counts its runs.

    Keys written, for job ``J`` and task name ``N``: ``hook_runs:J:N`` (INCR per
    run that got past the pause), ``hook_pids:J:N`` (the pid of each such run),
    ``hook_errors:J:N`` (the ``error`` it was given), and ``hook_paused:J:N``
    (the pid of a run that reached the pause).

    The task's params steer it: while the file ``pause_file`` exists, it waits
    before doing anything (the test SIGKILLs the worker there: after the
    failure was recorded, before the hook's work); then it sleeps
    ``hook_sleep`` seconds (longer than a lease: its hold must be renewed).
    """
    r = counters()
    job, name = context.job_id, task.name
    pause_file = task.params.get("pause_file")
    if pause_file and os.path.exists(pause_file):
        r.set(trace_key("hook_paused", job, name), os.getpid())
        while os.path.exists(pause_file):
            time.sleep(0.05)
    time.sleep(float(task.params.get("hook_sleep") or 0.0))
    with r.pipeline() as pipe:
        pipe.incr(trace_key("hook_runs", job, name))
        pipe.rpush(trace_key("hook_pids", job, name), os.getpid())
        pipe.rpush(trace_key("hook_errors", job, name), error)
        pipe.execute()


@workflow_task(name="it.fail-with-hook", on_final_failure=hook_probe)
def fail_with_hook(
    task: Task, context: Context, *, pause_file: str | None = None, hook_sleep: float = 0.0
) -> None:
    """Fails every attempt (its runs counted in ``runs:J:N``); its hook is :func:`hook_probe`."""
    runs = counters().incr(trace_key("runs", context.job_id, task.name))
    raise RuntimeError(f"{task.name}: planned failure {runs}")


def file_hook(task: Task, context: Context, error: str) -> None:
    """The ``on_final_failure`` hook of :func:`hooked_probe`: appends one line
    ``<job id> <task name> <pid> <time> <error>`` to the file ``hook_file`` of the
    task's params (one ``write`` in append mode: a line survives a SIGKILL right
    after it, and the file needs neither Redis nor the store)."""
    line = f"{context.job_id} {task.name} {os.getpid()} {time.time()!r} {error}"
    line = line.replace("\n", " ") + "\n"
    fd = os.open(task.params["hook_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@workflow_task(name="it.hooked-probe", on_final_failure=file_hook)
def hooked_probe(task: Task, context: Context, *, hook_file: str, **params: Any) -> Any:
    """:func:`probe` (``params`` are its keyword arguments) with :func:`file_hook` as
    its ``on_final_failure`` hook, which writes to ``hook_file``."""
    return probe.fn(task, context, **params)


class RedisPager:
    """The dependency :class:`DeclinedCharge` is given at registration: pages go to the
    Redis list ``pages:J:N`` as ``<label>|<pid>|<error>`` (its client made at the first page)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def page(self, job_id: str | None, task_name: str, error: str) -> None:
        counters().rpush(
            trace_key("pages", job_id, task_name), f"{self.label}|{os.getpid()}|{error}"
        )


class DeclinedCharge(IExecutor):
    """A handler class: every attempt is declined (runs counted in ``runs:J:N``); its own
    ``on_final_failure`` pages through the :class:`RedisPager` it was built with."""

    retry_count = 1

    def __init__(self, pager: RedisPager) -> None:
        self.pager = pager

    def execute(self, task: Task, context: Context) -> Any:
        runs = counters().incr(trace_key("runs", context.job_id, task.name))
        raise RuntimeError(f"card declined ({runs})")

    def on_final_failure(self, task: Task, context: Context, error: str) -> None:
        self.pager.page(context.job_id, task.name, error)


#: The executor id of :class:`DeclinedCharge`, registered once, with its dependency.
CHARGE_HANDLER = "it.charge-handler"
executor_registry.register(CHARGE_HANDLER, DeclinedCharge(RedisPager("oncall")))


@workflow_task(name="it.cancel-own-job")
def cancel_own_job(task: Task, context: Context) -> None:
    """Cancels its job (``JobCancellationError``); its runs counted in ``runs:J:N``."""
    counters().incr(trace_key("runs", context.job_id, task.name))
    raise JobCancellationError(f"{task.name}: nothing to do")


@workflow_task(name="it.progress")
def reports_progress(task: Task, context: Context, *, items: int = 10) -> int:
    """Reports ``done`` = 3 of ``items``, then waits (up to 30 s) until the key
    ``go:J:N`` exists in Redis, then counts every item with a progress bar."""
    context.progress(3, items, note="a third")
    r = counters()
    deadline = time.time() + 30
    while not r.exists(trace_key("go", context.job_id, task.name)) and time.time() < deadline:
        time.sleep(0.05)
    bar = context.progress_bar(items, note="all")
    for _ in range(items):
        bar.succeeded()
    return items


@workflow_task(name="it.fragile")
def fragile(task: Task, context: Context, *, flag: str, message: str = "broken") -> str:
    """Raises ``RuntimeError(message)`` until the Redis key ``fixed:<flag>`` exists (a test
    sets it to "deploy the fix"), then returns "fixed"."""
    if not counters().exists(f"fixed:{flag}"):
        raise RuntimeError(message)
    return "fixed"


@workflow_task(name="it.poison-text", retry_count=2)
def poison_text(task: Task, context: Context, *, in_note: bool = False) -> None:
    """Fails every attempt (its runs counted in ``runs:J:N``) with a NUL and a lone
    surrogate in its error or, with ``in_note``, in a progress note it reports first."""
    counters().incr(trace_key("runs", context.job_id, task.name))
    if in_note:
        context.progress(1, 2, note="half\x00way \udc80")
        raise RuntimeError("planned failure")
    raise RuntimeError("bad\x00byte, lone \udc80")


@workflow_task(name="it.joined", retry_count=2)
def joined(task: Task, context: Context, *, first: str, second: str) -> str:
    """Returns ``first + second`` (its runs counted in ``runs:J:N``): a result a test
    can make the database refuse while the parameters are stored."""
    counters().incr(trace_key("runs", context.job_id, task.name))
    return first + second


@dataclass
class Customer:
    """A typed parameter of :func:`invoice` (this release dropped ``phone``)."""

    name: str


@workflow_task(name="it.invoice", retry_count=3)
def invoice(
    task: Task,
    context: Context,
    *,
    customer: Customer,
    amount: Decimal,
    due: date,
    currency: str = "EUR",
) -> list[str]:
    """The newer release of a task whose older producers still store the old payload:
    ``note`` is no parameter any more, ``currency`` came with a default. Counts its
    runs; returns the types it was given."""
    counters().incr(trace_key("runs", context.job_id, task.name))
    return [
        type(customer).__name__,
        type(amount).__name__,
        type(due).__name__,
        str(amount),
        currency,
    ]


@workflow_task(name="it.schedules-a-follow-up")
def schedules_a_follow_up(task: Task, context: Context) -> str:
    """Schedules, from the worker, a job of one :func:`probe` that always fails, naming
    neither its channel nor its retry policy: this process's defaults decide them.
    Returns the new job's id."""
    follow_up = Job(category="follow-up")
    follow_up.workflows.append(Workflow([probe.task(name="follow-up", fail_times=100)]))
    return follow_up.scheduled()
