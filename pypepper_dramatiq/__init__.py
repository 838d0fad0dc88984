"""Durable workflow jobs for Dramatiq."""

from . import gateway  # noqa: F401  (installs the gateway the Job methods use)
from .channels.channel import Channel, ChannelManager, manager
from .channels.gates import SendResult
from .config import Config, config
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
    ExecutorError,
    InvalidTransitionError,
    JobRedeliveryError,
    JobRequeuedError,
    MessageError,
    NonRetriableError,
    NoTaskResultError,
    PypepperError,
    ResultNotStorableError,
    SchemaVersionError,
    StoreError,
    StoreNotConfiguredError,
    StoreUnavailableError,
    TaskCancelledError,
    TaskTimeoutError,
    UnknownExecutorError,
    UnknownJobError,
)
from .events import (
    CANCEL,
    COMPLETE,
    FAIL,
    INIT,
    RUN,
    SCHEDULE,
    Event,
    SchedulerFSM,
    build_scheduler_fsm,
)
from .executor import CallableExecutor, ExecutorRegistry, IExecutor, executor_registry
from .functions import WorkflowTask, actor_task, workflow_task
from .inprocess.worker import Worker
from .job import Job
from .rules import Position, RetryPolicy
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
from .workflow import TaskOutcome, Workflow, WorkflowResult

__version__ = "0.1.0"

__all__ = [
    # model
    "CANCEL_EVENT_KEY",
    "Context",
    "Job",
    "Position",
    "RetryPolicy",
    "Status",
    "Task",
    "TaskOutcome",
    "Workflow",
    "WorkflowResult",
    # events
    "CANCEL",
    "COMPLETE",
    "FAIL",
    "INIT",
    "RUN",
    "SCHEDULE",
    "Event",
    "SchedulerFSM",
    "build_scheduler_fsm",
    # executors
    "CallableExecutor",
    "ExecutorRegistry",
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
    "Config",
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
    "ExecutorError",
    "InvalidTransitionError",
    "JobRedeliveryError",
    "JobRequeuedError",
    "MessageError",
    "NoTaskResultError",
    "NonRetriableError",
    "PypepperError",
    "ResultNotStorableError",
    "SchemaVersionError",
    "StoreError",
    "StoreNotConfiguredError",
    "StoreUnavailableError",
    "TaskCancelledError",
    "TaskTimeoutError",
    "UnknownExecutorError",
    "UnknownJobError",
]
