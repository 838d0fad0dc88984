"""Durable workflow jobs for Dramatiq.

The names users need are here. The modules of the pypepper.scheduler API keep
their paths
(``pypepper_dramatiq.job``, ``.task``, ``.workflow``, ``.events``,
``.status``, ``.channel``, ``.worker``, ``.store``, ``.executor``,
``.config``, ``.errors``): the state machine's events and
``build_scheduler_fsm`` are in ``pypepper_dramatiq.events``.

Importing the package imports no engine: each name is imported on first use
(``from pypepper_dramatiq import Job`` imports the model only), and the job
methods find the engine's job I/O through ``model.job.runtime``, which
``setup()`` fills, or else the default provided here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import config
from .model.job import runtime as _job_runtime

if TYPE_CHECKING:
    from .channels.channel import Channel, ChannelManager, manager
    from .defaults import Defaults
    from .drivers.dramatiq.middleware import WorkflowMiddleware
    from .drivers.dramatiq.setup import setup
    from .drivers.inprocess.worker import Worker
    from .engine.functions import WorkflowTask, actor_task, executor_task, workflow_task
    from .engine.job_io import schedule_many
    from .engine.pausing import (
        list_paused,
        pause_channel,
        pause_task,
        resume_channel,
        resume_task,
    )
    from .errors import (
        AmbiguousTaskNameError,
        BrokerUnavailableError,
        ChannelEnqueueError,
        ChannelFullError,
        ChannelStoppedError,
        ConfigError,
        DuplicateJobError,
        ExecutorError,
        InvalidConcurrencyKeyError,
        InvalidConcurrencyLimitError,
        InvalidPriorityError,
        InvalidRateKeyError,
        InvalidRateLimitError,
        InvalidTransitionError,
        JobCancellationError,
        JobNotRetriableError,
        JobRedeliveryError,
        JobRequeuedError,
        MessageError,
        NonRetriableError,
        NoTaskResultError,
        PausingUnsupportedError,
        PayloadError,
        PypepperError,
        ResultNotStorableError,
        RetryError,
        SchemaVersionError,
        StoreError,
        StoreNotConfiguredError,
        StoreUnavailableError,
        TaskCancelledError,
        TaskTimeoutError,
        UnknownChannelError,
        UnknownExecutorError,
        UnknownJobError,
        UnknownScheduleError,
        UnknownTaskError,
        UnstorableValueError,
        WaitInsideJobError,
        WaitTimeoutError,
    )
    from .limits.rates import Rate
    from .model.context import CANCEL_EVENT_KEY, Context
    from .model.executor import CallableExecutor, IExecutor, executor_registry
    from .model.job import IJobIO, Job, chain
    from .model.task import Task
    from .model.workflow import TaskOutcome, Workflow, WorkflowResult
    from .records.recurring import RecurringSchedule
    from .rules.status import Status
    from .rules.steps import RetryPolicy
    from .schedules import (
        list_recurring,
        pause_recurring,
        recurring,
        remove_recurring,
        resume_recurring,
        trigger_recurring,
    )
    from .stores.registry import (
        IJobStore,
        JobRecord,
        PersistenceWarning,
        configure_job_store,
        get_job_store,
        reset_job_store,
        set_job_store,
        setup_from_config,
    )
    from .transport import SendResult


#: Where each name of the package is defined (imported on first use).
_HOMES: dict[str, str] = {
    "Channel": ".channels.channel",
    "ChannelManager": ".channels.channel",
    "manager": ".channels.channel",
    "Defaults": ".defaults",
    "WorkflowMiddleware": ".drivers.dramatiq.middleware",
    "setup": ".drivers.dramatiq.setup",
    "Worker": ".drivers.inprocess.worker",
    "WorkflowTask": ".engine.functions",
    "actor_task": ".engine.functions",
    "executor_task": ".engine.functions",
    "workflow_task": ".engine.functions",
    "schedule_many": ".engine.job_io",
    "list_paused": ".engine.pausing",
    "pause_channel": ".engine.pausing",
    "pause_task": ".engine.pausing",
    "resume_channel": ".engine.pausing",
    "resume_task": ".engine.pausing",
    "AmbiguousTaskNameError": ".errors",
    "BrokerUnavailableError": ".errors",
    "ChannelEnqueueError": ".errors",
    "ChannelFullError": ".errors",
    "ChannelStoppedError": ".errors",
    "ConfigError": ".errors",
    "DuplicateJobError": ".errors",
    "ExecutorError": ".errors",
    "InvalidPriorityError": ".errors",
    "InvalidTransitionError": ".errors",
    "JobCancellationError": ".errors",
    "JobNotRetriableError": ".errors",
    "JobRedeliveryError": ".errors",
    "JobRequeuedError": ".errors",
    "MessageError": ".errors",
    "NonRetriableError": ".errors",
    "NoTaskResultError": ".errors",
    "PausingUnsupportedError": ".errors",
    "PayloadError": ".errors",
    "PypepperError": ".errors",
    "ResultNotStorableError": ".errors",
    "RetryError": ".errors",
    "SchemaVersionError": ".errors",
    "StoreError": ".errors",
    "StoreNotConfiguredError": ".errors",
    "StoreUnavailableError": ".errors",
    "TaskCancelledError": ".errors",
    "TaskTimeoutError": ".errors",
    "UnknownChannelError": ".errors",
    "InvalidRateKeyError": ".errors",
    "InvalidRateLimitError": ".errors",
    "InvalidConcurrencyLimitError": ".errors",
    "InvalidConcurrencyKeyError": ".errors",
    "Rate": ".limits.rates",
    "UnknownExecutorError": ".errors",
    "UnknownJobError": ".errors",
    "UnknownScheduleError": ".errors",
    "UnknownTaskError": ".errors",
    "UnstorableValueError": ".errors",
    "WaitInsideJobError": ".errors",
    "WaitTimeoutError": ".errors",
    "CANCEL_EVENT_KEY": ".model.context",
    "Context": ".model.context",
    "CallableExecutor": ".model.executor",
    "IExecutor": ".model.executor",
    "executor_registry": ".model.executor",
    "Job": ".model.job",
    "chain": ".model.job",
    "Task": ".model.task",
    "TaskOutcome": ".model.workflow",
    "Workflow": ".model.workflow",
    "WorkflowResult": ".model.workflow",
    "RecurringSchedule": ".records.recurring",
    "Status": ".rules.status",
    "RetryPolicy": ".rules.steps",
    "list_recurring": ".schedules",
    "pause_recurring": ".schedules",
    "recurring": ".schedules",
    "remove_recurring": ".schedules",
    "resume_recurring": ".schedules",
    "trigger_recurring": ".schedules",
    "IJobStore": ".stores.registry",
    "JobRecord": ".stores.registry",
    "PersistenceWarning": ".stores.registry",
    "configure_job_store": ".stores.registry",
    "get_job_store": ".stores.registry",
    "reset_job_store": ".stores.registry",
    "set_job_store": ".stores.registry",
    "setup_from_config": ".stores.registry",
    "SendResult": ".transport",
}


def __getattr__(name: str) -> Any:
    """The package's name ``name``, imported from its home on first use; or its
    submodule ``name`` (``pypepper_dramatiq.engine``...), as an attribute."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def _engine_job_io() -> IJobIO:
    """The job I/O the job methods use when ``setup()`` installed none: the engine's."""
    from .engine.job_io import JOB_IO

    return JOB_IO


_job_runtime.provide_default(_engine_job_io)

__version__ = "0.1.0"

__all__ = [
    # model
    "CANCEL_EVENT_KEY",
    "Context",
    "Job",
    "RetryPolicy",
    "chain",
    "schedule_many",
    "Status",
    "Task",
    "TaskOutcome",
    "Workflow",
    "WorkflowResult",
    # recurring schedules
    "RecurringSchedule",
    "list_recurring",
    "recurring",
    "pause_recurring",
    "remove_recurring",
    "resume_recurring",
    "trigger_recurring",
    # pausing channels and tasks
    "list_paused",
    "pause_channel",
    "pause_task",
    "resume_channel",
    "resume_task",
    # executors
    "CallableExecutor",
    "IExecutor",
    "executor_registry",
    # the Dramatiq driver
    "WorkflowMiddleware",
    "WorkflowTask",
    "actor_task",
    "executor_task",
    "setup",
    "workflow_task",
    # channels and the in-process worker
    "Channel",
    "ChannelManager",
    "SendResult",
    "Worker",
    "manager",
    # stores and configuration
    "Defaults",
    "IJobStore",
    "JobRecord",
    "PersistenceWarning",
    "config",
    "configure_job_store",
    "get_job_store",
    "reset_job_store",
    "set_job_store",
    "setup_from_config",
    # errors
    "AmbiguousTaskNameError",
    "BrokerUnavailableError",
    "ChannelEnqueueError",
    "ChannelFullError",
    "ChannelStoppedError",
    "ConfigError",
    "DuplicateJobError",
    "ExecutorError",
    "InvalidPriorityError",
    "InvalidTransitionError",
    "JobCancellationError",
    "JobNotRetriableError",
    "JobRedeliveryError",
    "JobRequeuedError",
    "MessageError",
    "NoTaskResultError",
    "PausingUnsupportedError",
    "PayloadError",
    "NonRetriableError",
    "PypepperError",
    "ResultNotStorableError",
    "RetryError",
    "SchemaVersionError",
    "StoreError",
    "StoreNotConfiguredError",
    "StoreUnavailableError",
    "TaskCancelledError",
    "TaskTimeoutError",
    "UnknownChannelError",
    "InvalidRateKeyError",
    "InvalidRateLimitError",
    "InvalidConcurrencyLimitError",
    "InvalidConcurrencyKeyError",
    "Rate",
    "UnknownExecutorError",
    "UnknownJobError",
    "UnknownScheduleError",
    "UnknownTaskError",
    "UnstorableValueError",
    "WaitInsideJobError",
    "WaitTimeoutError",
]
