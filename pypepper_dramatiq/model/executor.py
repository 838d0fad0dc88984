"""Executors run a task's work; the registry names them so jobs can be rebuilt.

An executor may be asynchronous: when ``execute`` returns an awaitable (an
``async def`` task, or a plain function that returns a coroutine), it is run
to completion in the calling thread, on an event loop of its own, by
:func:`run_awaitable`. Both drivers therefore call every executor the same,
synchronous way, and the job's cancel event and the task's ``round_timeout``
reach the coroutine.

An executor class is also a *handler*: its instance carries the task's
dependencies (constructor arguments, given once at registration), its retry
policy (class attributes named as ``Task``'s options: ``retry_count``,
``retry_delay``, ``retry_backoff``, ``round_timeout``, ``optional``, ...; see
:func:`executor_policy`) and its ``on_final_failure`` method. Every
:class:`~pypepper_dramatiq.model.task.Task` built with it (by object or by
registered id) takes that policy for the options it does not give itself, and
that hook when it has none of its own.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import ExecutorError, TaskCancelledError, TaskTimeoutError, UnknownExecutorError
from ..limits.durations import timeout_seconds
from ..ops.logs import get_logger
from ..records.payloads import check_readable
from ..records.spec import POLICY_KEYS
from ..rules.steps import RetryPolicy

if TYPE_CHECKING:
    from .context import Context
    from .task import Task

logger = get_logger(__name__)

TaskFunction = Callable[["Task", "Context"], Any]
#: ``on_final_failure(task, context, error)``: called once a task has failed for
#: good; ``error`` is the task's last error as stored (``"Type: message"``).
FinalFailureHook = Callable[["Task", "Context", str], Any]

#: Seconds between two looks of a running coroutine's supervisor at the job's
#: cancel event and the deadline. It also bounds how long the event loop may
#: sleep, so that an exception another thread raises in this one (Dramatiq's
#: ``TimeLimitExceeded``, a cancel interrupt, ``Shutdown``) is delivered
#: promptly: such exceptions wait until the thread runs Python code again.
ASYNC_POLL_INTERVAL = 0.05
#: Seconds a cancelled coroutine may take to finish its cleanup (``finally``
#: blocks, ``except CancelledError``) before it is abandoned, never resumed.
ASYNC_CLEANUP_SECONDS = 5.0

#: Marks an ``execute`` already wrapped by :meth:`IExecutor.__init_subclass__`.
_RESOLVES_AWAITABLES = "_pypepper_resolves_awaitables"


class IExecutor(abc.ABC):
    """Runs one attempt of a task and returns its (JSON-able) result, or raises.

    ``execute`` may return an awaitable (or be ``async def``): every subclass's
    ``execute`` is wrapped so that what it returns goes through
    :func:`run_awaitable`, and callers always get the final result.
    """

    #: The hook a worker calls when a task run by this executor failed for good
    #: (``@workflow_task(on_final_failure=...)`` sets it; a handler class defines
    #: it as a method); found through the registry by the task's executor id, as
    #: the executor itself is.
    on_final_failure: FinalFailureHook | None = None

    # The retry policy of the tasks built with this executor (None: not set
    # here, the task's default). A subclass sets the ones it wants as class
    # attributes (or its ``__init__`` on the instance); a task's own value wins.
    retry_count: int | None = None
    retry_delay: float | None = None
    retry_until_completed: bool | None = None
    retry_until_max: int | None = None
    round_times: int | None = None
    round_timeout: float | None = None
    round_timeout_join: float | None = None
    optional: bool | None = None
    retry_backoff: float | None = None
    retry_delay_max: float | None = None
    retry_jitter: bool | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_policy_names(cls)
        execute = cls.__dict__.get("execute")
        if (
            inspect.isfunction(execute)
            and not getattr(execute, "__isabstractmethod__", False)
            and not getattr(execute, _RESOLVES_AWAITABLES, False)
        ):
            cls.execute = _resolving(execute)  # type: ignore[method-assign]

    @abc.abstractmethod
    def execute(self, task: Task, context: Context) -> Any:
        """Run the task once."""


#: The beginnings of the names of a task's retry options (a near miss is refused).
_POLICY_PREFIXES = ("retry_", "round_")


def _check_policy_names(cls: type) -> None:
    """Refuse a class attribute that looks like a retry option but is none (a typo
    would otherwise leave the policy silently unset)."""
    for attr, value in vars(cls).items():
        plain = value is None or isinstance(value, (bool, int, float))  # not a method or property
        if attr.startswith(_POLICY_PREFIXES) and attr not in POLICY_KEYS and plain:
            raise ExecutorError(
                f"executor class {cls.__qualname__}: {attr!r} is not a retry option "
                f"(known: {', '.join(sorted(POLICY_KEYS))})"
            )


def executor_policy(executor: IExecutor) -> dict[str, Any]:
    """The retry options ``executor`` sets (its class's attributes or its own), by name;
    those it leaves None are absent."""
    policy: dict[str, Any] = {}
    for key in POLICY_KEYS:
        value = getattr(executor, key, None)
        if value is not None:
            policy[key] = value
    return policy


def _check_policy(executor_id: str, executor: IExecutor) -> None:
    """Refuse, at registration, a policy no task could be built with (named with the id)."""
    policy = executor_policy(executor)
    if not policy:
        return
    retry = {k: v for k, v in policy.items() if k not in ("round_timeout", "round_timeout_join")}
    try:
        RetryPolicy(**retry)
        for key in ("round_timeout", "round_timeout_join"):
            if key in policy:
                timeout_seconds(key, policy[key])
    except (TypeError, ValueError) as exc:
        raise ExecutorError(f"executor {executor_id!r}: {exc}") from exc


#: The id of the job whose task runs in this context (see :func:`running_job`).
_running_job: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pypepper_running_job", default=None
)


def running_job() -> str | None:
    """The id of the job whose task is running in this context, else None.

    Set around every executor call (both drivers call tasks through
    ``execute``), so that ``Job.wait()`` can refuse to wait for the job of the
    task that calls it. A thread the task starts itself does not inherit it.
    """
    return _running_job.get()


def _resolving(execute: Callable[..., Any]) -> Callable[..., Any]:
    """``execute``, with an awaitable result run to completion here."""

    @functools.wraps(execute)
    def wrapper(self: IExecutor, task: Task, context: Context) -> Any:
        if type(task.params) is not dict:  # stored params that are no object: not called
            check_readable(task.name, task.params, task.executor_id)
        token = _running_job.set(getattr(context, "job_id", None))
        try:
            return run_awaitable(execute(self, task, context), task, context)
        finally:
            _running_job.reset(token)

    setattr(wrapper, _RESOLVES_AWAITABLES, True)
    return wrapper


def run_awaitable(value: Any, task: Task | None = None, context: Context | None = None) -> Any:
    """``value``, or, when it is awaitable, its result, run to completion in this thread.

    The awaitable runs on a new event loop that is closed afterwards. When
    this thread already runs an event loop (``Workflow.run()`` called from
    async code), it runs on a helper thread while this one waits, since a
    thread runs one loop at a time.

    While it runs, the job's cancel event (``context.cancel_event``) and the
    task's ``round_timeout`` are watched; either one cancels the coroutine,
    which is given :data:`ASYNC_CLEANUP_SECONDS` to end. An exception raised
    into this thread by another one (Dramatiq's ``TimeLimitExceeded``, a
    cancel interrupt, ``Shutdown``) also cancels it, then propagates.

    Args:
        value: what an executor returned.
        task: the task being run (its ``round_timeout`` and name), if any.
        context: its context (the job's cancel event), if any.

    Raises:
        TaskTimeoutError: the coroutine ran longer than ``task.round_timeout``.
        TaskCancelledError: the job was cancelled while it ran, or the
            coroutine ended cancelled.
        Exception: whatever the coroutine raised.
    """
    if not inspect.isawaitable(value):
        return value
    name = task.name if task is not None else "?"
    timeout = task.round_timeout if task is not None else 0.0
    cancel_event = context.cancel_event if context is not None else None
    try:
        if _loop_running_here():
            return _on_helper_thread(value, name, timeout, cancel_event)
        return _on_new_loop(value, name, timeout, cancel_event, None)
    finally:
        _discard_unstarted(value)


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _discard_unstarted(value: Awaitable[Any]) -> None:
    """Close a coroutine that never started (its run failed before it), without a warning."""
    if inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == inspect.CORO_CREATED:
        value.close()


def _on_helper_thread(
    value: Awaitable[Any], name: str, timeout: float, cancel_event: threading.Event | None
) -> Any:
    """Run ``value`` on a thread of its own; this thread (busy with its loop) waits."""
    abandon = threading.Event()
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            box.append((True, _on_new_loop(value, name, timeout, cancel_event, abandon)))
        except BaseException as exc:  # handed to the waiting thread as it is
            box.append((False, exc))

    # The coroutine sees this thread's context variables (the running job's id).
    helper = threading.Thread(
        target=contextvars.copy_context().run,
        args=(target,),
        name="pypepper-async-task",
        daemon=True,
    )
    helper.start()
    try:
        # Short joins: an exception raised into this thread interrupts the wait.
        while helper.is_alive():
            helper.join(ASYNC_POLL_INTERVAL)
    except BaseException:
        abandon.set()
        helper.join()
        raise
    succeeded, result = box[0]
    if succeeded:
        return result
    raise result


def _on_new_loop(
    value: Awaitable[Any],
    name: str,
    timeout: float,
    cancel_event: threading.Event | None,
    abandon: threading.Event | None,
) -> Any:
    """Run ``value`` to completion on a new event loop in this thread, then close the loop."""
    loop = asyncio.new_event_loop()
    interrupts: list[BaseException] = []
    loop.set_exception_handler(functools.partial(_keep_interrupts, interrupts))
    try:
        return loop.run_until_complete(
            _supervise(value, name, timeout, cancel_event, abandon, interrupts)
        )
    finally:
        _close(loop, name)


def _keep_interrupts(
    interrupts: list[BaseException], loop: asyncio.AbstractEventLoop, context: dict[str, Any]
) -> None:
    """The loop's exception handler: keep exceptions raised into this thread.

    An exception raised into the thread while a plain loop callback runs
    (rather than a task) would otherwise only be logged by the loop; the
    supervisor raises it instead.
    """
    exc = context.get("exception")
    if isinstance(exc, BaseException) and not isinstance(exc, (Exception, asyncio.CancelledError)):
        interrupts.append(exc)
        return
    loop.default_exception_handler(context)


async def _supervise(
    value: Awaitable[Any],
    name: str,
    timeout: float,
    cancel_event: threading.Event | None,
    abandon: threading.Event | None,
    interrupts: list[BaseException],
) -> Any:
    """Await ``value`` as a task, cancelling it on a cancel, the deadline or an interrupt."""
    loop = asyncio.get_running_loop()
    work = asyncio.ensure_future(value)
    deadline = loop.time() + timeout if timeout > 0 else None
    stop: Exception | None = None
    try:
        while not work.done():
            wait = ASYNC_POLL_INTERVAL
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - loop.time()))
            await asyncio.wait({work}, timeout=wait)
            if work.done():
                break
            if interrupts:
                raise interrupts.pop(0)
            if (cancel_event is not None and cancel_event.is_set()) or (
                abandon is not None and abandon.is_set()
            ):
                stop = TaskCancelledError(f"task {name} was cancelled: its coroutine was stopped")
                break
            if deadline is not None and loop.time() >= deadline:
                stop = TaskTimeoutError(f"task {name} exceeded round_timeout={timeout:g}s")
                break
    except BaseException:
        # An exception raised into this thread (or this supervisor cancelled by
        # the loop's shutdown): stop the coroutine before it propagates.
        await _cancel(work, name)
        raise
    if stop is not None:
        await _cancel(work, name)
        raise stop
    if work.cancelled():
        raise TaskCancelledError(f"task {name} was cancelled: its coroutine ended cancelled")
    return work.result()


async def _cancel(work: asyncio.Future[Any], name: str) -> None:
    """Cancel ``work`` and give it :data:`ASYNC_CLEANUP_SECONDS` to end."""
    if work.done():
        return
    work.cancel()
    await asyncio.wait({work}, timeout=ASYNC_CLEANUP_SECONDS)
    if not work.done():
        logger.warning(
            "task %s: its coroutine did not end within %gs of being cancelled; abandoned",
            name,
            ASYNC_CLEANUP_SECONDS,
        )


def _close(loop: asyncio.AbstractEventLoop, name: str) -> None:
    """Cancel what is left on ``loop`` (bounded), finish async generators, close it.

    Tasks the coroutine started and left running must not outlive the
    attempt. The default executor is shut down without waiting for a thread
    the coroutine left blocked (``loop.close()``), so that it cannot hold this
    worker thread.
    """
    try:
        leftovers = asyncio.all_tasks(loop)
        for leftover in leftovers:
            leftover.cancel()
        if leftovers:
            _, pending = loop.run_until_complete(
                asyncio.wait(leftovers, timeout=ASYNC_CLEANUP_SECONDS)
            )
            if pending:
                logger.warning(
                    "task %s: %d coroutine(s) ignored cancellation; abandoned", name, len(pending)
                )
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


class CallableExecutor(IExecutor):
    """Calls ``func(task, context)`` as it is: no wrapping, no cancel checks of its own."""

    def __init__(self, func: TaskFunction) -> None:
        if not callable(func):
            raise TypeError(f"CallableExecutor needs a callable, got {func!r}")
        self.func = func

    def execute(self, task: Task, context: Context) -> Any:
        return self.func(task, context)

    def __repr__(self) -> str:
        return f"CallableExecutor({getattr(self.func, '__qualname__', self.func)!r})"


class ExecutorRegistry:
    """Executors by id, so that a stored job can be rebuilt and run elsewhere."""

    def __init__(self) -> None:
        self._executors: dict[str, IExecutor] = {}
        self._resolvers: list[Callable[[str], IExecutor | None]] = []
        self._lock = threading.Lock()

    def add_resolver(self, resolver: Callable[[str], IExecutor | None]) -> None:
        """Consult ``resolver(id)`` for ids that were not registered."""
        with self._lock:
            self._resolvers.append(resolver)

    def register(self, executor_id: str, executor: IExecutor | TaskFunction) -> IExecutor:
        """Register ``executor`` (or a plain function) under ``executor_id``; returns it."""
        if not executor_id:
            raise ValueError("executor_id must be a non-empty string")
        resolved = executor if isinstance(executor, IExecutor) else CallableExecutor(executor)
        _check_policy(executor_id, resolved)
        with self._lock:
            self._executors[executor_id] = resolved
        return resolved

    def registered(self, executor_id: str) -> IExecutor | None:
        """The executor registered under ``executor_id``, else None (no resolver asked)."""
        with self._lock:
            return self._executors.get(executor_id)

    def unregister(self, executor_id: str) -> None:
        with self._lock:
            self._executors.pop(executor_id, None)

    def get(self, executor_id: str) -> IExecutor:
        """The executor, or :class:`UnknownExecutorError` (a ``ValueError``)."""
        with self._lock:
            executor = self._executors.get(executor_id)
            resolvers = list(self._resolvers)
        if executor is not None:
            return executor
        for resolver in resolvers:
            found = resolver(executor_id)
            if found is not None:
                return found
        raise UnknownExecutorError(executor_id)

    def __contains__(self, executor_id: object) -> bool:
        return executor_id in self._executors

    def ids(self) -> list[str]:
        with self._lock:
            return sorted(self._executors)


#: The process-wide registry.
executor_registry = ExecutorRegistry()
