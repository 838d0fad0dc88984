"""``async def`` tasks: executors whose ``execute`` returns an awaitable, and the in-process Worker.

The executor tests call ``execute`` directly, as both drivers do; the worker
tests run a scheduled job with ``Worker(channel).run_once()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
from dramatiq.middleware.threading import raise_thread_exception
from dramatiq.middleware.time_limit import TimeLimitExceeded

from pypepper_dramatiq import (
    CallableExecutor,
    Context,
    IExecutor,
    Job,
    Status,
    Task,
    TaskCancelledError,
    TaskTimeoutError,
    Worker,
    Workflow,
    manager,
    workflow_task,
)
from pypepper_dramatiq.model.context import CANCEL_EVENT_KEY
from pypepper_dramatiq.model.executor import run_awaitable

#: Upper bound for anything that should be prompt (a hang, not a speed check).
PROMPT = 2.0


def make_task(executor: IExecutor, name: str = "t", **policy: Any) -> Task:
    task = Task("chan", "dag", "fp", name, None, "", [], executor, **policy)
    task.context.context[CANCEL_EVENT_KEY] = threading.Event()
    return task


def execute(task: Task) -> Any:
    return task.executor.execute(task, task.context)


class Trace:
    """What happened to a coroutine, in order, safe across threads."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._lock = threading.Lock()

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def __eq__(self, other: object) -> bool:
        with self._lock:
            return self.events == other

    def __repr__(self) -> str:
        return f"Trace({self.events!r})"


def sleeper(trace: Trace, seconds: float = 30.0) -> Callable[[Task, Context], Any]:
    """An async task body that awaits ``seconds`` and traces how it ended."""

    async def body(task: Task, context: Context) -> str:
        trace.add("start")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            trace.add("cancelled")
            raise
        trace.add("end")
        return "slept"

    return body


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[tuple[str, Any]]]:
    """Run ``fn`` in a thread; its outcome lands in the returned list."""
    outcome: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            outcome.append(("returned", fn()))
        except BaseException as exc:
            outcome.append(("raised", exc))

    thread = threading.Thread(target=target, name="attempt")
    thread.start()
    return thread, outcome


# -- executors ------------------------------------------------------------------------------


def test_callable_executor_runs_a_coroutine_function_to_its_end() -> None:
    trace = Trace()

    async def body(task: Task, context: Context) -> dict[str, Any]:
        trace.add("start")
        await asyncio.sleep(0.01)
        trace.add("end")
        return {"task": task.name}

    assert execute(make_task(CallableExecutor(body))) == {"task": "t"}
    assert trace == ["start", "end"]


def test_a_plain_function_that_returns_a_coroutine_is_awaited() -> None:
    async def later(value: int) -> int:
        await asyncio.sleep(0)
        return value

    def body(task: Task, context: Context) -> Any:
        return later(7)  # forgot to await: still run, not stored as a coroutine

    assert execute(make_task(CallableExecutor(body))) == 7


class AsyncExecutor(IExecutor):
    """A user's executor whose ``execute`` is ``async def``."""

    async def execute(self, task: Task, context: Context) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return f"async {task.name}"


class Later:
    """An awaitable that is not a coroutine (has ``__await__``)."""

    def __await__(self) -> Generator[Any, None, str]:
        yield from asyncio.sleep(0).__await__()
        return "awaited"


class AwaitableExecutor(IExecutor):
    """A user's executor returning an awaitable object."""

    def execute(self, task: Task, context: Context) -> Any:
        return Later()


class SubclassedCallable(CallableExecutor):
    """Overrides execute and calls the parent's: resolved once, not twice."""

    def execute(self, task: Task, context: Context) -> Any:
        return ("sub", super().execute(task, context))


@pytest.mark.parametrize(
    ("executor", "expected"),
    [
        (AsyncExecutor(), "async t"),
        (AwaitableExecutor(), "awaited"),
        (SubclassedCallable(lambda task, context: None), ("sub", None)),
    ],
    ids=["async-def-execute", "awaitable-object", "subclass-of-callable-executor"],
)
def test_any_executor_returning_an_awaitable_gets_it_awaited(
    executor: IExecutor, expected: Any
) -> None:
    assert execute(make_task(executor)) == expected


def test_a_subclass_calling_an_async_parent_gets_its_result() -> None:
    async def body(task: Task, context: Context) -> int:
        await asyncio.sleep(0)
        return 5

    assert execute(make_task(SubclassedCallable(body))) == ("sub", 5)


def test_a_coroutine_exception_propagates_with_its_message() -> None:
    async def body(task: Task, context: Context) -> None:
        await asyncio.sleep(0)
        raise ValueError("no such row")

    with pytest.raises(ValueError, match="no such row"):
        execute(make_task(CallableExecutor(body)))


def test_a_coroutine_that_ends_cancelled_is_an_ordinary_failure() -> None:
    """A CancelledError is a BaseException: it must not escape the attempt as one."""

    async def body(task: Task, context: Context) -> None:
        raise asyncio.CancelledError

    with pytest.raises(TaskCancelledError, match="cancelled"):
        execute(make_task(CallableExecutor(body)))


def test_round_timeout_stops_the_coroutine() -> None:
    trace = Trace()
    task = make_task(CallableExecutor(sleeper(trace)), round_timeout=0.3)
    began = time.monotonic()

    with pytest.raises(TaskTimeoutError, match=r"task t exceeded round_timeout=0.3s"):
        execute(task)

    assert 0.3 <= time.monotonic() - began < PROMPT
    assert trace == ["start", "cancelled"]


def test_a_timeout_raised_by_the_coroutine_itself_is_not_mistaken_for_round_timeout() -> None:
    async def body(task: Task, context: Context) -> None:
        await asyncio.wait_for(asyncio.sleep(30), 0.01)

    with pytest.raises(asyncio.TimeoutError) as raised:
        execute(make_task(CallableExecutor(body), round_timeout=30))
    assert not isinstance(raised.value, TaskTimeoutError)


def test_the_cancel_event_stops_the_coroutine_promptly() -> None:
    trace = Trace()
    task = make_task(CallableExecutor(sleeper(trace)))
    cancel = task.context.cancel_event
    assert cancel is not None
    threading.Timer(0.2, cancel.set).start()
    began = time.monotonic()

    with pytest.raises(TaskCancelledError, match="cancelled"):
        execute(task)

    assert time.monotonic() - began < PROMPT
    assert trace == ["start", "cancelled"]


def test_a_coroutine_may_poll_context_cancelled_itself() -> None:
    async def body(task: Task, context: Context) -> str:
        assert context.cancel_event is not None
        context.cancel_event.set()
        return "saw it" if context.cancelled else "missed it"

    assert execute(make_task(CallableExecutor(body))) == "saw it"


def test_an_exception_raised_into_the_thread_cancels_the_coroutine() -> None:
    """Dramatiq's TimeLimit (and the cancel interrupt, and Shutdown) raise in the worker thread.

    While the coroutine awaits, the loop sleeps in C; the supervisor wakes it
    often enough for the exception to land, then stops the coroutine.
    """
    trace = Trace()
    task = make_task(CallableExecutor(sleeper(trace)))
    thread, outcome = in_thread(lambda: execute(task))
    deadline = time.monotonic() + PROMPT
    while trace != ["start"]:
        assert time.monotonic() < deadline, "the coroutine never started"
        time.sleep(0.01)

    raise_thread_exception(thread.ident, TimeLimitExceeded)  # type: ignore[no-untyped-call]
    thread.join(PROMPT)

    assert not thread.is_alive()
    assert len(outcome) == 1 and outcome[0][0] == "raised"
    assert isinstance(outcome[0][1], TimeLimitExceeded)
    assert trace == ["start", "cancelled"]


def test_an_interrupt_that_lands_in_a_loop_callback_is_not_swallowed() -> None:
    """asyncio only logs what a plain callback raises; an interrupt there still stops the task."""
    trace = Trace()

    def interrupted() -> None:
        raise TimeLimitExceeded

    async def body(task: Task, context: Context) -> str:
        asyncio.get_running_loop().call_soon(interrupted)
        return str(await sleeper(trace)(task, context))

    began = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        execute(make_task(CallableExecutor(body)))
    assert time.monotonic() - began < PROMPT
    assert trace == ["start", "cancelled"]


def test_tasks_the_coroutine_left_running_are_cancelled() -> None:
    trace = Trace()

    async def body(task: Task, context: Context) -> str:
        asyncio.get_running_loop().create_task(sleeper(trace)(task, context))
        await asyncio.sleep(0.01)  # let it start
        return "returned"

    assert execute(make_task(CallableExecutor(body))) == "returned"
    assert trace == ["start", "cancelled"]  # before execute returned


def test_an_attempt_from_a_thread_that_runs_an_event_loop() -> None:
    """``Workflow.run()`` called from async code: the coroutine runs on a helper thread."""
    trace = Trace()

    async def body(task: Task, context: Context) -> str:
        trace.add(threading.current_thread().name)
        await asyncio.sleep(0)
        return "done"

    async def caller() -> Any:
        return execute(make_task(CallableExecutor(body)))

    assert asyncio.run(caller()) == "done"
    assert trace == ["pypepper-async-task"]


def test_from_a_thread_that_runs_an_event_loop_cancel_and_timeout_still_apply() -> None:
    cancel_trace, timeout_trace = Trace(), Trace()
    cancelled = make_task(CallableExecutor(sleeper(cancel_trace)))
    timed = make_task(CallableExecutor(sleeper(timeout_trace)), round_timeout=0.2)

    async def caller() -> tuple[BaseException | None, BaseException | None]:
        event = cancelled.context.cancel_event
        assert event is not None
        threading.Timer(0.2, event.set).start()
        errors: list[BaseException | None] = []
        for task in (cancelled, timed):
            try:
                execute(task)
                errors.append(None)
            except Exception as exc:
                errors.append(exc)
        return errors[0], errors[1]

    first, second = asyncio.run(caller())
    assert isinstance(first, TaskCancelledError)
    assert isinstance(second, TaskTimeoutError)
    assert cancel_trace == timeout_trace == ["start", "cancelled"]


def test_run_awaitable_passes_plain_values_through() -> None:
    value = {"a": 1}
    assert run_awaitable(value) is value


# -- the in-process Worker ------------------------------------------------------------------


CALLS: dict[str, int] = {}
_calls_lock = threading.Lock()


def _count(key: str) -> int:
    with _calls_lock:
        CALLS[key] = CALLS.get(key, 0) + 1
        return CALLS[key]


@pytest.fixture(autouse=True)
def no_calls() -> None:
    with _calls_lock:
        CALLS.clear()


def run_job(*tasks: Task) -> Job:
    """Schedule a one-workflow job of ``tasks`` and run it with ``Worker.run_once()``."""
    manager.new("async-jobs")
    job = Job(category="async", channel_id="async-jobs")
    job.workflows.append(Workflow(list(tasks)))
    job.scheduled()
    ran = asyncio.run(Worker(manager.available("async-jobs")).run_once())
    assert ran is not None
    return ran


def test_worker_runs_an_async_workflow_task() -> None:
    @workflow_task(name="core-async.double")
    async def double(task: Task, context: Context, n: int) -> int:
        _count("double")
        await asyncio.sleep(0.01)
        return n * 2

    @workflow_task(name="core-async.add")
    async def add(task: Task, context: Context, n: int) -> int:
        await asyncio.sleep(0)
        return int(context.results["double"]) + n

    job = run_job(double.task(n=21), add.task(n=1))

    assert job.status is Status.COMPLETED
    assert CALLS == {"double": 1}
    assert job.context.results == {"double": 42, "add": 43}
    record = Job.get_saved(job.id)
    assert record is not None and record.status is Status.COMPLETED


def test_worker_retries_an_async_task_that_exceeds_round_timeout() -> None:
    trace = Trace()

    @workflow_task(name="core-async.slow-once", round_timeout=0.5, retry_count=1)
    async def slow_once(task: Task, context: Context) -> str:
        if _count("slow-once") == 1:
            return str(await sleeper(trace)(task, context))
        return "quick"

    began = time.monotonic()
    job = run_job(slow_once.task())

    assert job.status is Status.COMPLETED
    assert CALLS == {"slow-once": 2}
    assert trace == ["start", "cancelled"]
    assert time.monotonic() - began < 5


def test_worker_fails_an_async_task_whose_attempts_all_time_out() -> None:
    @workflow_task(name="core-async.slow", round_timeout=0.3, retry_count=1)
    async def slow(task: Task, context: Context) -> None:
        _count("slow")
        await asyncio.sleep(30)

    job = run_job(slow.task())

    assert job.status is Status.FAILED
    assert CALLS == {"slow": 2}
    record = Job.get_saved(job.id)
    assert record is not None and record.error is not None
    assert "TaskTimeoutError" in record.error and "round_timeout" in record.error


def test_worker_cancel_stops_an_async_task_during_its_await() -> None:
    trace = Trace()

    @workflow_task(name="core-async.waits", retry_count=3)
    async def waits(task: Task, context: Context) -> str:
        _count("waits")
        return str(await sleeper(trace)(task, context))

    manager.new("async-jobs")
    job = Job(category="async", channel_id="async-jobs")
    job.workflows.append(Workflow([waits.task()]))
    job.scheduled()

    def cancel_once_started() -> None:
        deadline = time.monotonic() + 10
        while trace != ["start"] and time.monotonic() < deadline:
            time.sleep(0.01)
        Job.cancel_saved(job.id)

    canceller = threading.Thread(target=cancel_once_started)
    canceller.start()
    began = time.monotonic()
    ran = asyncio.run(Worker(manager.available("async-jobs")).run_once())
    canceller.join()

    assert ran is not None and ran.status is Status.CANCELLED
    assert trace == ["start", "cancelled"]
    assert CALLS == {"waits": 1}  # not retried
    assert time.monotonic() - began < 5
    record = Job.get_saved(job.id)
    assert record is not None and record.status is Status.CANCELLED


def test_worker_fails_an_async_task_that_raises() -> None:
    @workflow_task(name="core-async.raises", retry_count=2)
    async def raises(task: Task, context: Context) -> None:
        call = _count("raises")
        await asyncio.sleep(0)
        raise RuntimeError(f"upstream said no ({call})")

    job = run_job(raises.task())

    assert job.status is Status.FAILED
    assert CALLS == {"raises": 3}
    record = Job.get_saved(job.id)
    assert record is not None and record.error is not None
    assert "RuntimeError: upstream said no (3)" in record.error
