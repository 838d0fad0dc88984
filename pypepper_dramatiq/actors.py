"""Workflow tasks on Dramatiq: the step actor, ``@workflow_task``, and plain actors as tasks."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import dramatiq
from dramatiq.asyncio import async_to_sync
from dramatiq.broker import Broker
from dramatiq.middleware import Interrupt, Shutdown
from dramatiq.middleware.time_limit import TimeLimitExceeded

from . import history
from .context import CANCEL_EVENT_KEY, JOB_ID_KEY, POSITION_KEY, RESULTS_KEY, Context
from .errors import UnknownExecutorError, is_retriable
from .executor import IExecutor, executor_registry
from .messages import STEP_ACTOR
from .record import utcnow
from .running import InFlight, StepCancelled
from .steps import Claim, Outcome
from .task import Task

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: What the middleware hands the step actor, per worker thread.
current = threading.local()

#: Marks an attempt cut short by worker shutdown: the step is handed back, not counted.
HANDED_BACK = Outcome(False, error="handed back on worker shutdown")

#: Stands for "nothing returned yet" (None is a result like any other).
_NOTHING: Any = object()


def run_attempt(claim: Claim, inflight: InFlight) -> Outcome:
    """Run the claimed task once in this thread; never raises.

    An interrupt (worker shutdown, a forced cancel, a time limit) that lands
    after the task's function returned does not undo the attempt: Python
    delivers such an interrupt only when the thread runs Python code again,
    which for a task blocked in C (``time.sleep``, a socket read) can be
    after its work finished. The returned value is then recorded as usual.
    """
    started = utcnow()
    running = inflight.start(claim.record.id)
    result = _NOTHING
    try:
        try:
            task = Task.from_dict(claim.task)
        except UnknownExecutorError as exc:
            # Maybe a rolling deploy: the middleware decides whether to wait for a
            # worker that knows the task or to fail it (unknown_task_grace).
            return replace(
                Outcome.failure(exc, retriable=False, started=started), unknown_task=True
            )
        task.context = Context(
            {
                CANCEL_EVENT_KEY: running.cancel_event,
                JOB_ID_KEY: claim.record.id,
                RESULTS_KEY: claim.results_by_name(),
                POSITION_KEY: claim.position.to_list(),
            }
        )
        result = task.executor.execute(task, task.context)
        inflight.finish(claim.record.id)
        return Outcome(True, result, started=started, ended=utcnow())
    except Interrupt as exc:
        if running.interrupted_at is not None:
            logger.info(
                "job %s: task stopped %.1fs after the interrupt was sent",
                claim.record.id,
                time.monotonic() - running.interrupted_at,
                extra={"action": "interrupt_landed", "job_id": claim.record.id},
            )
        if result is not _NOTHING:  # landed after the function returned
            return Outcome(True, result, started=started, ended=utcnow())
        if isinstance(exc, Shutdown):
            return HANDED_BACK
        if isinstance(exc, TimeLimitExceeded):
            timeout = claim.task.get("round_timeout", 0)
            return Outcome.failure(
                exc,
                kind=history.TIMED_OUT,
                started=started,
                error=f"TaskTimeoutError: exceeded round_timeout={timeout:g}s",
            )
        if isinstance(exc, StepCancelled):
            return Outcome.failure(
                exc,
                kind=history.CANCELLED,
                started=started,
                error="cancelled: the task was interrupted after the grace period",
            )
        return Outcome.failure(exc, started=started)
    except Exception as exc:
        return Outcome.failure(
            exc, retriable=is_retriable(exc), kind=history.kind_of(exc), started=started
        )
    finally:
        inflight.finish(claim.record.id)


def _step(*args: Any, **kwargs: Any) -> None:
    """Body of the step actor: run the step the middleware claimed, if it claimed one."""
    claim: Claim | None = getattr(current, "claim", None)
    inflight: InFlight | None = getattr(current, "inflight", None)
    if claim is None or inflight is None:
        if getattr(current, "handled", False):
            return  # the middleware dealt with this message (a duplicate, a deferral...)
        raise RuntimeError("the step actor runs only behind WorkflowMiddleware")
    current.outcome = run_attempt(claim, inflight)


class _ActorsOnly:
    """A view of a broker on which declaring an actor does not declare its queue.

    The step actor has no queue of its own: its messages travel on the
    channels' queues. Declaring the actor the usual way would add a queue
    every worker then consumes (and a RabbitMQ server then creates).
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    def declare_actor(self, actor: dramatiq.Actor[Any, Any]) -> None:
        broker = self._broker
        broker.emit_before("declare_actor", actor)
        broker.actors[actor.actor_name] = actor
        broker.emit_after("declare_actor", actor)


def declare_step_actor(broker: Broker) -> dramatiq.Actor[Any, Any]:
    """Register the step actor on ``broker`` (once), without declaring a queue."""
    try:
        existing: dramatiq.Actor[Any, Any] = broker.get_actor(STEP_ACTOR)
        return existing
    except dramatiq.errors.ActorNotFound:
        pass
    actor: dramatiq.Actor[Any, Any] = dramatiq.Actor(
        _step,
        broker=_ActorsOnly(broker),  # type: ignore[arg-type]
        actor_name=STEP_ACTOR,
        queue_name="default",
        priority=0,
        # No Dramatiq retries (the rules retry), no Dramatiq time limit unless the
        # task has a round_timeout, and no immediate interrupt on shutdown: the
        # middleware gives running attempts shutdown_grace, then hands them back.
        options={"max_retries": 0, "time_limit": float("inf"), "notify_shutdown": False},
    )
    actor.broker = broker
    return actor


class FunctionExecutor(IExecutor):
    """Calls ``fn(task, context, **task.params)``; an ``async def`` ``fn`` is run to its end.

    The coroutine is run by :func:`~pypepper_dramatiq.executor.run_awaitable`,
    as for every executor.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def execute(self, task: Task, context: Context) -> Any:
        return self.fn(task, context, **task.params)


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

    def execute(self, task: Task, context: Context) -> Any:
        return self.fn(**task.params)


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


_POLICY_KEYS = {
    "retry_count",
    "retry_delay",
    "retry_until_completed",
    "retry_until_max",
    "round_times",
    "round_timeout",
    "round_timeout_join",
    "optional",
}


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    policy = {k: v for k, v in options.items() if k in _POLICY_KEYS}
    params = {k: v for k, v in options.items() if k not in _POLICY_KEYS}
    return policy, params


class WorkflowTask(Generic[R]):
    """A function usable as a workflow task; ``.task(**params)`` makes a :class:`Task`."""

    def __init__(self, fn: Callable[..., R], executor_id: str, policy: dict[str, Any]) -> None:
        self.fn = fn
        self.executor_id = executor_id
        self.policy = policy
        executor_registry.register(executor_id, FunctionExecutor(fn))
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    def task(self, *, name: str | None = None, channel_id: str = "default", **params: Any) -> Task:
        """A task running this function with ``params`` (JSON-able) as keyword arguments."""
        doc = inspect.getdoc(self.fn) or ""
        return Task(
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
            **self.policy,
        )

    def options(self, **policy: Any) -> WorkflowTask[R]:
        """The same function with other retry settings."""
        clone: WorkflowTask[R] = object.__new__(WorkflowTask)
        clone.fn, clone.executor_id = self.fn, self.executor_id
        clone.policy = {**self.policy, **policy}
        functools.update_wrapper(clone, self.fn)
        return clone


def workflow_task(
    fn: Callable[..., R] | None = None, *, name: str | None = None, **policy: Any
) -> Any:
    """Make ``fn(task, context, **params)`` a workflow task.

    Keyword arguments are the task's retry table (``retry_count``,
    ``retry_delay``, ``retry_until_completed``, ``retry_until_max``,
    ``round_times``, ``round_timeout``, ``round_timeout_join``, ``optional``).
    ``name`` is the registry id (default ``module.qualname``); it must be the
    same in the process that schedules and the one that runs.

    ``fn`` may be ``async def``: each attempt runs the coroutine to its end on
    an event loop of its own in the worker thread; a cancel of the job
    cancels it, and ``round_timeout`` bounds it (``TaskTimeoutError``).
    """
    unknown = set(policy) - _POLICY_KEYS
    if unknown:
        raise TypeError(f"workflow_task got unknown options: {', '.join(sorted(unknown))}")

    def decorate(func: Callable[..., R]) -> WorkflowTask[R]:
        executor_id = name or f"{_module_name(func)}.{func.__qualname__}"
        return WorkflowTask(func, executor_id, dict(policy))

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
        channel_id="default",
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


def _resolve_actor(executor_id: str) -> IExecutor | None:
    """Registry fallback: ``actor:NAME`` names an actor declared on the current broker."""
    if not executor_id.startswith("actor:"):
        return None
    from .broker import get_broker

    try:
        actor = get_broker().get_actor(executor_id[len("actor:") :])
    except dramatiq.errors.ActorNotFound:
        return None
    return ActorExecutor(actor)


executor_registry.add_resolver(_resolve_actor)
