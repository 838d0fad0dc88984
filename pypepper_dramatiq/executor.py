"""Executors run a task's work; the registry names them so jobs can be rebuilt."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import UnknownExecutorError

if TYPE_CHECKING:
    from .context import Context
    from .task import Task

TaskFunction = Callable[["Task", "Context"], Any]


class IExecutor(abc.ABC):
    """Runs one attempt of a task and returns its (JSON-able) result, or raises."""

    @abc.abstractmethod
    def execute(self, task: Task, context: Context) -> Any:
        """Run the task once."""


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
        with self._lock:
            self._executors[executor_id] = resolved
        return resolved

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
