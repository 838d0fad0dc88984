"""Plain functions and Dramatiq actors as workflow tasks: ``@workflow_task`` and ``actor_task``.

A decorated function is registered as an executor under a stable id, so that
any process (an in-process worker, a ``dramatiq`` worker) can rebuild and run
the tasks of a stored job.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import dramatiq
from dramatiq.asyncio import async_to_sync

from ..channels.broker import get_broker
from ..errors import ExecutorError
from ..model.context import Context
from ..model.executor import FinalFailureHook, IExecutor, executor_registry
from ..model.task import Task
from ..records.payloads import ParamsDecoder, decoder_for
from ..records.spec import POLICY_KEYS
from ..rules.priorities import check_priority

R = TypeVar("R")


class FunctionExecutor(IExecutor):
    """Calls ``fn(task, context, **params)``; an ``async def`` ``fn`` is run to its end.

    ``params`` are the task's stored params decoded by ``fn``'s annotations
    (:mod:`~pypepper_dramatiq.records.payloads`: read at the first call, kept).
    The coroutine is run by :func:`~pypepper_dramatiq.model.executor.run_awaitable`,
    as for every executor.
    """

    def __init__(
        self, fn: Callable[..., Any], on_final_failure: FinalFailureHook | None = None
    ) -> None:
        self.fn = fn
        self.on_final_failure = on_final_failure
        self._decoder: ParamsDecoder | None = None

    def execute(self, task: Task, context: Context) -> Any:
        decoder = self._decoder
        if decoder is None:  # the first call: the function's signature read, then kept
            decoder = self._decoder = decoder_for(self.fn, task.executor_id or task.name, 2)
        return self.fn(task, context, **decoder.arguments(task.name, task.params))


class ActorExecutor(IExecutor):
    """Runs a plain Dramatiq actor's function with the task's params as keyword arguments.

    The actor's own retries and time limit do not apply inside a workflow:
    the task's retry table and ``round_timeout`` do. An ``async def`` actor's
    coroutine runs in the worker thread like any async task, so it needs no
    AsyncIO middleware, and the job's cancel and ``round_timeout`` reach it.
    """

    def __init__(self, actor: dramatiq.Actor[Any, Any]) -> None:
        self.actor = actor
        self.fn = _actor_function(actor)
        self._decoder: ParamsDecoder | None = None

    def execute(self, task: Task, context: Context) -> Any:
        decoder = self._decoder
        if decoder is None:  # kept by function too: the registry makes an executor per lookup
            decoder = self._decoder = decoder_for(self.fn, task.executor_id or task.name)
        return self.fn(**decoder.arguments(task.name, task.params))


def _actor_function(actor: dramatiq.Actor[Any, Any]) -> Callable[..., Any]:
    """The function an actor runs; for an ``async def`` actor, the coroutine function itself.

    Dramatiq wraps an async actor's function to run it on the AsyncIO
    middleware's shared loop thread (and fails without that middleware). A
    step runs the coroutine on a loop of its own in the worker thread
    instead, where the job's cancel event and the task's ``round_timeout``
    are watched, so it unwraps Dramatiq's wrapper (and only that one).
    """
    fn: Callable[..., Any] = actor.fn
    wrapped: Callable[..., Any] | None = getattr(fn, "__wrapped__", None)
    if getattr(fn, "__code__", None) is _ASYNC_TO_SYNC_CODE and callable(wrapped):
        return wrapped
    return fn


async def _never_called() -> None:
    """Only used to find the code object of Dramatiq's async-to-sync wrapper."""


#: The code shared by every wrapper ``dramatiq.asyncio.async_to_sync`` makes.
_ASYNC_TO_SYNC_CODE = getattr(async_to_sync(_never_called), "__code__", None)


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    policy = {k: v for k, v in options.items() if k in POLICY_KEYS}
    params = {k: v for k, v in options.items() if k not in POLICY_KEYS}
    return policy, params


class WorkflowTask(Generic[R]):
    """A function usable as a workflow task; ``.task(**params)`` makes a :class:`Task`."""

    def __init__(
        self,
        fn: Callable[..., R],
        executor_id: str,
        policy: dict[str, Any],
        on_final_failure: FinalFailureHook | None = None,
        priority: int | None = None,
    ) -> None:
        self.fn = fn
        self.executor_id = executor_id
        self.policy = policy
        #: The priority of a job whose first task this is, unless the job says.
        self.priority = priority
        #: Registered with the function, so that any worker finds it by executor id.
        self.on_final_failure = on_final_failure
        executor_registry.register(executor_id, FunctionExecutor(fn, on_final_failure))
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    def task(
        self, *, name: str | None = None, channel_id: str | None = None, **params: Any
    ) -> Task:
        """A task running this function with ``params`` (JSON-able) as keyword arguments;
        on the channel of the job it is added to unless ``channel_id`` names another."""
        doc = inspect.getdoc(self.fn) or ""
        made = Task(
            channel_id=channel_id,
            dag_id="",
            fingerprint=self.executor_id,
            name=name or self.fn.__name__,
            category=None,
            description=doc.splitlines()[0] if doc else "",
            tags=[],
            executor=None,
            executor_id=self.executor_id,
            params=params,
            on_final_failure=self.on_final_failure,
            **self.policy,
        )
        made.priority = self.priority
        return made

    def options(self, **policy: Any) -> WorkflowTask[R]:
        """The same function with other retry settings (its hook goes with the
        function: give ``on_final_failure`` to ``@workflow_task``)."""
        if "on_final_failure" in policy:
            raise TypeError(
                "on_final_failure is registered with the function: give it to @workflow_task"
            )
        clone: WorkflowTask[R] = object.__new__(WorkflowTask)
        clone.fn, clone.executor_id = self.fn, self.executor_id
        clone.on_final_failure = self.on_final_failure
        clone.priority = self.priority
        clone.policy = {**self.policy, **policy}
        functools.update_wrapper(clone, self.fn)
        return clone


def workflow_task(
    fn: Callable[..., R] | None = None,
    *,
    name: str | None = None,
    on_final_failure: FinalFailureHook | None = None,
    priority: int | None = None,
    **policy: Any,
) -> Any:
    """Make ``fn(task, context, **params)`` a workflow task.

    Keyword arguments are the task's retry table (``retry_count``,
    ``retry_delay``, ``retry_backoff``, ``retry_delay_max``, ``retry_jitter``,
    ``retry_until_completed``, ``retry_until_max``, ``round_times``,
    ``round_timeout``, ``round_timeout_join``, ``optional``; see
    :class:`~pypepper_dramatiq.model.task.Task`).
    ``name`` is the registry id (default ``module.qualname``); it must be the
    same in the process that schedules and the one that runs.

    ``priority`` (0 to 9) is the priority of a job whose first task this is, when
    the job names none itself (``Job(priority=)``, ``scheduled(priority=)``); it wins
    over the application's default. A bad one is an ``InvalidPriorityError``.

    ``on_final_failure(task, context, error)`` is called once per job when the
    task has failed for good (see :class:`~pypepper_dramatiq.model.task.Task`); it is
    registered with the function, so every worker that knows the task finds it.

    ``fn`` may be ``async def``: each attempt runs the coroutine to its end on
    an event loop of its own in the worker thread; a cancel of the job
    cancels it, and ``round_timeout`` bounds it (``TaskTimeoutError``).
    """
    unknown = set(policy) - POLICY_KEYS
    if unknown:
        raise TypeError(f"workflow_task got unknown options: {', '.join(sorted(unknown))}")
    if on_final_failure is not None and not callable(on_final_failure):
        raise TypeError(f"on_final_failure must be callable, got {on_final_failure!r}")
    if priority is not None:
        check_priority(priority)

    def decorate(func: Callable[..., R]) -> WorkflowTask[R]:
        if inspect.isclass(func):  # it would be instantiated as the task's body
            raise ExecutorError(
                f"@workflow_task decorates functions, not the class {func.__name__}: "
                "make it a subclass of IExecutor and register an instance with "
                "executor_registry.register(id, instance)"
            )
        executor_id = name or f"{_module_name(func)}.{func.__qualname__}"
        return WorkflowTask(func, executor_id, dict(policy), on_final_failure, priority)

    return decorate(fn) if fn is not None else decorate


def _module_name(func: Callable[..., Any]) -> str:
    """The name workers import ``func``'s module by, also when it runs as a script.

    ``python etl.py`` names the module ``__main__`` while ``dramatiq etl``
    imports it as ``etl``; ids must agree between the two processes.
    """
    module = func.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name)  # python -m package.module
    path = getattr(main, "__file__", None)
    return Path(path).stem if path else module


def actor_task(actor: dramatiq.Actor[Any, Any], *, name: str | None = None, **options: Any) -> Task:
    """A task that runs a plain ``@dramatiq.actor``'s function.

    ``options`` holds the retry table (as for :func:`workflow_task`) and the
    actor's keyword arguments. An ``async def`` actor runs as an async
    workflow task does (see :func:`workflow_task`).
    """
    policy, params = _split(options)
    executor_id = f"actor:{actor.actor_name}"
    if executor_id not in executor_registry:
        executor_registry.register(executor_id, ActorExecutor(actor))
    return Task(
        channel_id=None,  # the channel of the job it is added to
        dag_id="",
        fingerprint=executor_id,
        name=name or actor.actor_name,
        category=None,
        description="",
        tags=[],
        executor=None,
        executor_id=executor_id,
        params=params,
        **policy,
    )


def executor_task(
    executor_id: str, *, name: str | None = None, channel_id: str | None = None, **options: Any
) -> Task:
    """A task run by the executor registered under ``executor_id`` (a handler class's instance).

    ``options`` holds retry options (as for :func:`workflow_task`), which win
    over the executor's own policy, and the task's params (what its ``execute``
    reads from ``task.params``). The task takes the executor's ``on_final_failure``.
    ``name`` defaults to ``executor_id``; ``channel_id`` to the job's channel.

    Raises:
        UnknownExecutorError: no executor is registered under ``executor_id`` here.
    """
    policy, params = _split(options)
    executor = executor_registry.get(executor_id)
    doc = inspect.getdoc(executor) or ""
    return Task(
        channel_id=channel_id,
        dag_id="",
        fingerprint=executor_id,
        name=name or executor_id,
        category=None,
        description=doc.splitlines()[0] if doc else "",
        tags=[],
        executor=executor,
        executor_id=executor_id,
        params=params,
        **policy,
    )


def _resolve_actor(executor_id: str) -> IExecutor | None:
    """Registry fallback: ``actor:NAME`` names an actor declared on the current broker."""
    if not executor_id.startswith("actor:"):
        return None
    try:
        actor = get_broker().get_actor(executor_id[len("actor:") :])
    except dramatiq.errors.ActorNotFound:
        return None
    return ActorExecutor(actor)


executor_registry.add_resolver(_resolve_actor)
