"""A workflow: tasks run in order, each under its retry table, in this thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from ..errors import TaskTimeoutError, cancels_job, describe, is_retriable
from ..ops.logs import get_logger
from ..rules import steps as rules
from .context import CANCEL_EVENT_KEY, JOB_ID_KEY, RESULTS_KEY
from .task import Task

logger = get_logger(__name__)

#: Attempts with a round_timeout run here; at most 32 at once, more wait their turn.
TIMEOUT_POOL_SIZE = 32
_timeout_pool = ThreadPoolExecutor(TIMEOUT_POOL_SIZE, thread_name_prefix="pypepper-attempt")


@dataclass
class TaskOutcome:
    """How one task of a run ended."""

    name: str
    succeeded: bool
    attempts: int
    result: Any = None
    error: str | None = None


@dataclass
class WorkflowResult:
    """The outcome of :meth:`Workflow.run`; truthy when every required task succeeded."""

    ok: bool
    cancelled: bool = False
    outcomes: list[TaskOutcome] = field(default_factory=list)
    error: str | None = None

    @property
    def results(self) -> dict[str, Any]:
        return {o.name: o.result for o in self.outcomes if o.succeeded}

    def __bool__(self) -> bool:
        return self.ok


class Workflow:
    """Tasks executed one after another by :meth:`run`."""

    def __init__(self, tasks: Iterable[Task] | None = None) -> None:
        self._tasks: list[Task] = [_checked(task) for task in tasks or []]
        # A timed-out attempt that is still running blocks the next one of the same task.
        self._running: dict[int, Future[Any]] = {}

    def add_task(self, task: Task) -> Workflow:
        self._tasks.append(_checked(task))
        return self

    def add_tasks(self, tasks: Iterable[Task]) -> Workflow:
        self._tasks.extend([_checked(task) for task in tasks])
        return self

    def get_tasks(self) -> list[Task]:
        return list(self._tasks)

    @property
    def plan(self) -> list[rules.RetryPolicy]:
        return [task.policy for task in self._tasks]

    def _cancel_event(self) -> threading.Event | None:
        for task in self._tasks:
            event = task.context.get(CANCEL_EVENT_KEY)
            if isinstance(event, threading.Event):
                return event
        return None

    def run(self) -> WorkflowResult:
        """Run every task in order under :mod:`~pypepper_dramatiq.rules.steps`.

        Stops early when the cancel event in the tasks' context is set (call
        ``Job.share_cancel_event()`` first), when a task raises
        ``JobCancellationError`` (the result says cancelled), and when a
        required task fails for good.
        """
        plan = [self.plan]
        cancel = self._cancel_event()

        def cancelled() -> bool:
            return cancel is not None and cancel.is_set()

        outcomes: dict[int, TaskOutcome] = {}
        step = rules.first_step(plan, cancelled=cancelled())
        while step.action is rules.Action.RUN:
            position = step.position
            assert position is not None
            if step.delay > 0:
                if cancel is not None:
                    cancel.wait(step.delay)
                else:
                    time.sleep(step.delay)
                if cancelled():
                    step = rules.CANCEL_STEP
                    break
            task = self._tasks[position.task]
            succeeded, value = self.attempt(task)
            outcome = outcomes.setdefault(position.task, TaskOutcome(task.name, False, 0))
            outcome.attempts += 1
            outcome.succeeded = succeeded
            if succeeded:
                outcome.result, outcome.error = value, None
                results = task.context.context.get(RESULTS_KEY)
                if isinstance(results, dict):
                    results[task.name] = value
            else:
                outcome.error = describe(value)
                logger.info(
                    "job %s: task %s failed (%s): %s",
                    task.context.get(JOB_ID_KEY),
                    task.name,
                    rules.attempt_of(position, task.policy),
                    outcome.error,
                    extra={"action": "attempt_failed", "job_id": task.context.get(JOB_ID_KEY)},
                )

            step = rules.next_step(
                plan,
                position,
                succeeded,
                # A task that raised JobCancellationError stops the workflow as a cancel.
                cancelled=cancelled() or (not succeeded and cancels_job(value)),
                retriable=succeeded or is_retriable(value),
            )
        ordered = [outcomes[i] for i in sorted(outcomes)]
        if step.action is rules.Action.COMPLETE:
            return WorkflowResult(ok=True, outcomes=ordered)
        if step.action is rules.Action.CANCEL:
            return WorkflowResult(ok=False, cancelled=True, outcomes=ordered)
        failed = ordered[-1]
        return WorkflowResult(
            ok=False, outcomes=ordered, error=f"task {failed.name} failed: {failed.error}"
        )

    def attempt(self, task: Task) -> tuple[bool, Any]:
        """One attempt of ``task`` (one of this workflow's) in this thread, bounded
        by its ``round_timeout``: (True, result) or (False, exception)."""
        if task.round_timeout <= 0:
            try:
                return True, task.executor.execute(task, task.context)
            except Exception as exc:
                return False, exc
        previous = self._running.get(id(task))
        if previous is not None:
            if not _join(previous, task.round_timeout_join):
                return False, TaskTimeoutError(
                    f"task {task.name}: the previous timed-out attempt is still running"
                )
            del self._running[id(task)]
        future = _timeout_pool.submit(task.executor.execute, task, task.context)
        try:
            return True, future.result(timeout=task.round_timeout)
        except FutureTimeout:
            # Started already: wait for it (bounded by round_timeout_join) so
            # that attempts of one task never overlap.
            if not future.cancel() and not _join(future, task.round_timeout_join):
                self._running[id(task)] = future
            return False, TaskTimeoutError(
                f"task {task.name} exceeded round_timeout={task.round_timeout:g}s"
            )
        except Exception as exc:
            return False, exc


def _join(future: Future[Any], limit: float) -> bool:
    """Wait for a started attempt, at most ``limit`` seconds (0 = forever)."""
    wait([future], timeout=None if limit <= 0 else limit)
    return future.done()


def _checked(task: object) -> Task:
    if not isinstance(task, Task):
        raise TypeError(f"a workflow holds Task objects, got {task!r}")
    return task
