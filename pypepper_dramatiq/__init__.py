"""Durable workflow jobs for Dramatiq.

The names users need are here. The modules of the pypepper.scheduler API keep
their paths
(``pypepper_dramatiq.job``, ``.task``, ``.workflow``, ``.events``,
``.status``, ``.channel``, ``.worker``, ``.store``, ``.executor``,
``.config``, ``.errors``): the state machine's events and
``build_scheduler_fsm`` are in ``pypepper_dramatiq.events``.
"""

from . import gateway  # noqa: F401  (installs the gateway the Job methods use)
from .channels.channel import Channel, ChannelManager, manager
from .config import config
from .context import CANCEL_EVENT_KEY, Context
from .distributed.middleware import WorkflowMiddleware
from .distributed.setup import setup
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
from .executor import CallableExecutor, IExecutor, executor_registry
from .functions import WorkflowTask, actor_task, workflow_task
from .gateway import schedule_many
from .inprocess.worker import Worker
from .job import Job, chain
from .recurring import RecurringSchedule
from .rules import RetryPolicy
from .schedules import (
    list_recurring,
    pause_recurring,
    recurring,
    remove_recurring,
    resume_recurring,
    trigger_recurring,
)
from .status import Status
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
from .task import Task
from .transport import SendResult
from .workflow import TaskOutcome, Workflow, WorkflowResult

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
