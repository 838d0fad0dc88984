"""Durable workflow jobs for Dramatiq.

The names users need are here. The modules of the pypepper.scheduler API keep
their paths
(``pypepper_dramatiq.job``, ``.task``, ``.workflow``, ``.events``,
``.status``, ``.channel``, ``.worker``, ``.store``, ``.executor``,
``.config``, ``.errors``): the state machine's events and
``build_scheduler_fsm`` are in ``pypepper_dramatiq.events``.
"""

from .channels.channel import Channel, ChannelManager, manager
from .config import config
from .drivers.dramatiq.middleware import WorkflowMiddleware
from .drivers.dramatiq.setup import setup
from .drivers.inprocess.worker import Worker
from .engine import job_io as gateway  # noqa: F401  (installs the gateway the Job methods use)
from .engine.functions import WorkflowTask, actor_task, executor_task, workflow_task
from .engine.job_io import schedule_many
from .errors import (
    AmbiguousTaskNameError,
    BrokerUnavailableError,
    ChannelEnqueueError,
    ChannelFullError,
    ChannelStoppedError,
    ConfigError,
    DuplicateJobError,
    ExecutorError,
    InvalidTransitionError,
    JobCancellationError,
    JobNotRetriableError,
    JobRedeliveryError,
    JobRequeuedError,
    MessageError,
    NonRetriableError,
    NoTaskResultError,
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
    UnknownExecutorError,
    UnknownJobError,
    UnknownScheduleError,
    UnknownTaskError,
    WaitInsideJobError,
    WaitTimeoutError,
)
from .model.context import CANCEL_EVENT_KEY, Context
from .model.executor import CallableExecutor, IExecutor, executor_registry
from .model.job import Job, chain
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
    "InvalidTransitionError",
    "JobCancellationError",
    "JobNotRetriableError",
    "JobRedeliveryError",
    "JobRequeuedError",
    "MessageError",
    "NoTaskResultError",
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
    "UnknownExecutorError",
    "UnknownJobError",
    "UnknownScheduleError",
    "UnknownTaskError",
    "WaitInsideJobError",
    "WaitTimeoutError",
]
