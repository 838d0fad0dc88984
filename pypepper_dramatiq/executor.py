"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.model.executor`."""

from .model.executor import (
    ASYNC_CLEANUP_SECONDS,
    ASYNC_POLL_INTERVAL,
    CallableExecutor,
    ExecutorRegistry,
    FinalFailureHook,
    IExecutor,
    TaskFunction,
    executor_registry,
    run_awaitable,
    running_job,
)

__all__ = [
    "TaskFunction",
    "FinalFailureHook",
    "ASYNC_POLL_INTERVAL",
    "ASYNC_CLEANUP_SECONDS",
    "IExecutor",
    "running_job",
    "run_awaitable",
    "CallableExecutor",
    "ExecutorRegistry",
    "executor_registry",
]
