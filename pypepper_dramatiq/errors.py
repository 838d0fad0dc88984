"""Every error this package raises, under one root: :class:`PypepperError`.

Each class's docstring is its default message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .model.job import Job


class PypepperError(Exception):
    """A pypepper-dramatiq error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class InvalidTransitionError(PypepperError):
    """The job's state machine does not allow this event in its current status."""

    def __init__(self, event: str, status: str) -> None:
        super().__init__(f"event {event} is not allowed in status {status}")
        self.event = event
        self.status = status


class ChannelEnqueueError(PypepperError):
    """The channel refused the job before it was enqueued; nothing was queued or saved."""


class ChannelFullError(ChannelEnqueueError):
    """The channel is full."""


class ChannelStoppedError(ChannelEnqueueError):
    """The channel is stopped and accepts no new jobs."""


class BrokerUnavailableError(ChannelEnqueueError):
    """The message broker cannot be reached; nothing was queued."""


class JobRequeuedError(PypepperError):
    """The job's RUN snapshot did not persist; the job went back on its channel."""

    def __init__(self, job: Job, message: str | None = None) -> None:
        super().__init__(
            message or f"job {job.id} was re-enqueued: its RUN snapshot did not persist"
        )
        self.job = job


class JobRedeliveryError(PypepperError):
    """The job could not be started nor put back on its channel; it was marked Failed."""

    def __init__(self, job: Job, reason: Literal["full", "stopped"]) -> None:
        super().__init__(
            f"job {job.id} could not be re-enqueued (channel {reason}); it was marked Failed"
        )
        self.job = job
        self.reason = reason


class UnknownJobError(PypepperError, LookupError):
    """No job with this id is stored."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r} is stored")
        self.job_id = job_id


class DuplicateJobError(PypepperError):
    """Another active job holds this unique key (or this job id is already stored)."""

    def __init__(self, unique_key: str | None, existing_id: str | None) -> None:
        if unique_key is None:
            message = f"job {existing_id!r} is already stored"
        else:
            holder = "a job that just ended" if existing_id is None else f"job {existing_id!r}"
            message = f"unique key {unique_key!r} is held by {holder} (Scheduled or InProgress)"
        super().__init__(message)
        self.unique_key = unique_key
        #: The id of the job that holds the key (None: it ended while we looked).
        self.existing_id = existing_id


class WaitTimeoutError(PypepperError, TimeoutError):
    """The job did not end within the time ``Job.wait()`` was given."""

    def __init__(self, job_id: str, timeout: float, status: str) -> None:
        super().__init__(f"job {job_id!r} did not end within {timeout:g}s (it is {status})")
        self.job_id = job_id
        self.timeout = timeout
        #: The job's stored status when the wait gave up.
        self.status = status


class WaitInsideJobError(PypepperError, RuntimeError):
    """A task asked to wait for its own job, which cannot end before the task does."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"a task of job {job_id!r} called wait() on its own job: the job cannot end "
            "while this task runs, so the wait would never return"
        )
        self.job_id = job_id


class RetryError(PypepperError):
    """The job cannot be retried as asked (``Job.retry_saved``)."""


class JobNotRetriableError(RetryError):
    """Only a Failed or Cancelled job can be retried."""

    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(
            f"job {job_id!r} is {status}: only a Failed or Cancelled job can be retried"
        )
        self.job_id = job_id
        #: The job's stored status.
        self.status = status


class UnknownTaskError(RetryError, LookupError):
    """The job has no task by this name (or at this ``workflow.task`` position)."""

    def __init__(self, job_id: str, task: str, names: list[list[str]]) -> None:
        tasks = ", ".join(
            f"{w}.{t} {name}" for w, row in enumerate(names) for t, name in enumerate(row)
        )
        super().__init__(
            f"job {job_id!r} has no task {task!r}; its tasks (workflow.task name): "
            f"{tasks or 'none'}"
        )
        self.job_id = job_id
        self.task = task
        #: The task names of each workflow of the job.
        self.names = names


class UnknownScheduleError(PypepperError, LookupError):
    """No recurring schedule with this name is stored."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no recurring schedule {name!r} is stored")
        self.name = name


class UnknownChannelError(PypepperError, LookupError):
    """No process declared this channel here and no stored job uses it: nothing to pause."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no channel {name!r}: none is declared in this process and no stored job uses it"
        )
        self.name = name


class InvalidPriorityError(PypepperError, ValueError, TypeError):
    """A job's priority is not a whole number from 0 to 9 (a ``ValueError`` when out of
    range, a ``TypeError`` when not an int: both, so either ``except`` catches it)."""

    def __init__(self, value: object, label: str = "priority") -> None:
        super().__init__(f"{label} must be a whole number from 0 to 9, got {value!r}")
        #: The value refused.
        self.value = value


class InvalidRateKeyError(PypepperError, ValueError, TypeError):
    """A job's ``rate_key`` is no text a row can hold (not a ``str``, empty, longer than
    the column, or holding a character no store keeps): both a ``ValueError`` and a
    ``TypeError``, as :class:`InvalidPriorityError`, so either ``except`` catches it."""

    def __init__(self, value: object, why: str, label: str = "rate_key") -> None:
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        super().__init__(f"{label} {shown!r} is refused: {why}")
        #: The value refused.
        self.value = value


class PausingUnsupportedError(PypepperError, NotImplementedError):
    """The job store keeps no paused channels or tasks (a store of a third party that
    did not implement :meth:`~pypepper_dramatiq.stores.base.IJobStore.pause`)."""

    def __init__(self, store: object) -> None:
        super().__init__(
            f"the job store {type(store).__name__} cannot pause channels or tasks: "
            "it implements no IJobStore.pause / resume / paused"
        )
        self.store = store


class NonRetriableError(PypepperError):
    """Raised by a task: this failure will not go away; skip its remaining attempts.

    The task fails at once (an optional task is skipped, a required one fails
    the job), whatever attempts and rounds its retry table had left.
    """


class ResultNotStorableError(NonRetriableError, TypeError):
    """A task returned a value its job cannot store (not JSON); the attempt failed.

    Not retried: another attempt of the same code would return the same kind
    of value. Return JSON values (dicts, lists, strings, numbers, booleans,
    None), or store large or binary outputs elsewhere and return a reference.
    """

    def __init__(self, task_name: str, value: object, reason: str) -> None:
        kind = type(value).__module__ + "." + type(value).__qualname__
        if kind.startswith("builtins."):
            kind = kind[len("builtins.") :]
        super().__init__(
            f"task {task_name!r} returned a {kind} that the job cannot store as JSON ({reason})"
        )
        self.task_name = task_name
        self.type_name = kind


class PayloadError(NonRetriableError, TypeError):
    """A task's parameters cannot be stored, or its stored parameters cannot become
    what the task function takes; the attempt failed without calling the task.

    Not retried: the stored payload will not change, so neither would the next
    attempt. Raised at ``Task(...)`` (and ``.task(...)``) for a value no payload can
    hold, and before the call of a task whose stored payload has a required
    parameter missing, a value that cannot become its annotated type, or params
    that are no object at all.

    Attributes:
        task_name: the task's name in its workflow.
        parameter: the parameter at fault (None: the params as a whole).
        reason: why.
        where: where in the parameter's value the fault sits (``order.lines[0]``).
        executor_id: the task's stable name, when known.
    """

    def __init__(
        self,
        task_name: str,
        parameter: str | None,
        reason: str,
        *,
        where: str | None = None,
        executor_id: str | None = None,
        encoding: bool = False,
    ) -> None:
        task = f"task {task_name!r}"
        if executor_id is not None and executor_id != task_name:
            task += f" ({executor_id})"
        if parameter is None:
            what = "its stored params"
        else:
            what = f"parameter {parameter!r}"
            if where is not None and where != parameter:
                what += f" at {where}"
        verb = "params of" if encoding else "payload of"
        super().__init__(f"{verb} {task}: {what} {reason}")
        self.task_name = task_name
        self.parameter = parameter
        self.reason = reason
        self.where = where
        self.executor_id = executor_id


class TaskCancelledError(PypepperError):
    """The job was cancelled while the task's coroutine ran; the coroutine was stopped."""


class JobCancellationError(PypepperError):
    """Raised by a task: cancel this task's job.

    The job ends Cancelled, as after ``Job.cancel()``: no retry, no further
    task, no ``on_final_failure`` hook. Its error names the task and this
    exception's message; the attempt is recorded as cancelled.
    """


class AmbiguousTaskNameError(PypepperError, LookupError):
    """More than one task of the job has this name: say which workflow."""


class NoTaskResultError(PypepperError, KeyError):
    """No stored result for this task: no such task, or it has not produced one."""

    def __str__(self) -> str:
        # KeyError would print its message quoted, as it does a missing key.
        return str(self.args[0]) if self.args else ""


class ExecutorError(PypepperError):
    """A task has no executor that can run it."""


class UnknownExecutorError(ExecutorError, ValueError):
    """No executor is registered under this id."""

    def __init__(self, executor_id: str | None, where: str = "") -> None:
        what = (
            "a task has no executor_id"
            if executor_id is None
            else (f"no executor is registered under id {executor_id!r}")
        )
        super().__init__(f"{what}{': ' + where if where else ''}")
        self.executor_id = executor_id


class ConfigError(PypepperError, ValueError):
    """The configuration is invalid."""


class InvalidRateLimitError(ConfigError):
    """A rate limit is not ``"<count>/<s|m|h>"`` with a whole count of at least 1."""

    def __init__(self, where: str, value: object, why: str) -> None:
        super().__init__(f'{where}: {value!r} is no rate limit ({why}); write e.g. "100/m"')
        self.where = where
        self.value = value


class InvalidConcurrencyLimitError(ConfigError, TypeError):
    """A concurrency limit (``max_running``, ``setup(concurrency=...)``) is not a whole
    number of at least 1 (a ``ConfigError``, which is a ``ValueError``, and a
    ``TypeError``: either ``except`` catches it)."""

    def __init__(self, where: str, value: object, why: str) -> None:
        super().__init__(f"{where}: {value!r} is no concurrency limit ({why}); write e.g. 3")
        #: Where the value was given (``"max_running of 'etl'"``).
        self.where = where
        #: The value refused.
        self.value = value


class UnstorableValueError(PypepperError, ValueError):
    """A value a job row cannot keep, refused where it enters (``Job(...)``,
    ``scheduled()``, ``schedule_many()``, ``recurring()``...), nothing stored or queued:
    a NUL or a lone surrogate, a text longer than its column, a float JSON cannot
    hold, values nested too deep, or a type JSON cannot hold. A ``ValueError``.

    Attributes:
        field: where the value sits, as its user knows it (``category``, or a path
            into a task's params such as ``...['params']['url']``).
        reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


class InvalidConcurrencyKeyError(PypepperError, ValueError, TypeError):
    """A job's ``concurrency_key`` is not a non-empty text a job row can keep (a
    ``ValueError`` and a ``TypeError``: either ``except`` catches it)."""

    def __init__(self, value: object, why: str) -> None:
        super().__init__(f"concurrency_key {value!r} is refused: {why}")
        #: The value refused.
        self.value = value


class StoreError(PypepperError):
    """The job store failed."""


class StoreUnavailableError(StoreError):
    """The job store cannot be reached."""


class StoreDataError(StoreError):
    """The store refused what a write holds (a value its column cannot take, a row
    whose content breaks a constraint): sending the same write again cannot cure it.

    Not an outage: the caller records the failure (or dead-letters the message)
    instead of leaving the step to its lease or deferring the message.

    Attributes:
        reason: what the store said, without where it is (fit to store in a job's
            error, which should not name the database); the message by default.
    """

    def __init__(self, message: str | None = None, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or str(self)


class CorruptRecordError(StoreError):
    """A stored row cannot be read as a job: one of its columns holds what no writer
    of this package writes (a manual edit, a foreign writer).

    Attributes:
        job_id: the row's id.
        column: the column that cannot be read.
        reason: what is wrong with it.
    """

    def __init__(self, job_id: str, column: str, reason: str) -> None:
        super().__init__(f"job {job_id}: stored row is damaged: column {column!r}: {reason}")
        self.job_id = job_id
        self.column = column
        self.reason = reason


class CorruptScheduleError(CorruptRecordError):
    """A stored recurring schedule's row cannot be read (see :class:`CorruptRecordError`).

    Attributes:
        name: the schedule's name (also ``job_id``, the row's key).
    """

    def __init__(self, name: str, column: str, reason: str) -> None:
        super().__init__(name, column, reason)
        self.args = (
            f"recurring schedule {name}: stored row is damaged: column {column!r}: {reason}",
        )
        self.name = name


class SchemaVersionError(StoreError):
    """The database schema is not at the version this package needs."""


class StoreNotConfiguredError(StoreError, ValueError):
    """The YAML configuration names a durable job store that was never set up.

    Call ``setup_from_config(config.get_yml_config())`` (or ``configure_job_store``)
    before saving or loading jobs.
    """


class MessageError(PypepperError):
    """A message could not be decoded into a job step."""


def is_retriable(exc: BaseException) -> bool:
    """False for failures another attempt cannot fix: :class:`NonRetriableError`,
    and a task whose executor id is not registered here."""
    return not isinstance(exc, (NonRetriableError, UnknownExecutorError))


def cancels_job(exc: BaseException) -> bool:
    """True when a task raised ``exc`` to cancel its job (:class:`JobCancellationError`)."""
    return isinstance(exc, JobCancellationError)


def describe(exc: BaseException) -> str:
    """``Type: message`` for logs and stored errors."""
    return f"{type(exc).__name__}: {exc}"


class TaskTimeoutError(PypepperError, TimeoutError):
    """A task attempt ran longer than its round_timeout."""


def retry_may_cure(exc: BaseException) -> bool:
    """Whether doing the same store call again may succeed: False for a data error
    (:class:`StoreDataError`) or a damaged row (:class:`CorruptRecordError`), which
    the caller records or dead-letters; True for an outage and other store errors."""
    return not isinstance(exc, (StoreDataError, CorruptRecordError))
