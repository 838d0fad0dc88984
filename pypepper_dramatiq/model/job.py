"""A job: workflows run in order under one state machine, persisted with OCC."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from ..config import check_choice
from ..defaults import default_channel, installed_defaults
from ..errors import (
    ChannelFullError,
    ChannelStoppedError,
    DuplicateJobError,
    UnknownExecutorError,
    UnknownJobError,
)
from ..limits.concurrency import CONCURRENCY_KEY_KEY, check_concurrency_key
from ..limits.rates import RATE_KEY_KEY, check_rate_key
from ..records.links import RETRY_OF_KEY
from ..records.record import JobRecord, check_job_id, utcnow
from ..records.state import BY_API
from ..rules.events import Event, SchedulerFSM, build_scheduler_fsm
from ..rules.priorities import check_priority, priority_in, with_priority
from ..rules.start_times import StartOptions, check_start_options
from ..rules.status import Status
from ..rules.waits import ON_CONFLICT, Waits, check_unique_key, parent_ids
from .context import CANCEL_EVENT_KEY, JOB_ID_KEY, PARENT_RESULTS_KEY, RESULTS_KEY, Context
from .task import Task
from .workflow import Workflow

__all__ = [
    "CANCEL_EVENT_KEY",
    "Job",
    "IJobIO",
    "JobRuntime",
    "ScheduleOptions",
    "chain",
    "runtime",
]

#: What ``schedule_many`` answers per job: its id, or the error that refused it.
Scheduled = str | ChannelFullError | ChannelStoppedError | DuplicateJobError

#: How often internal snapshot writes are tried before giving up.
SAVE_ATTEMPTS = 3
#: Reads and writes :meth:`Job.cancel_saved` tries while workers keep moving the row.
CANCEL_ATTEMPTS = 20


# -- the options of scheduled() --------------------------------------------------------
#
# ScheduleOptions has one field per keyword of ``Job.scheduled()``; making one checks
# every option, in the order ``scheduled()`` always checked them (the priority, then the
# times, the unique key, ``on_conflict``, ``after``, ``on_parent_failure``): a bad one is
# a ValueError or TypeError naming it, before anything is queued or stored. Scheduling
# then reads the checked forms (``start``, ``key``, ``waits``), never the raw values again.


@dataclass(frozen=True)
class ScheduleOptions:
    """What ``scheduled()`` was asked (see :meth:`~pypepper_dramatiq.model.job.Job.scheduled`
    for each option); checked when made.

    Raises:
        ValueError, TypeError: a bad option, named (the messages of ``scheduled()``).
    """

    delay: float | timedelta | None = None
    eta: datetime | None = None
    unique_key: str | None = None
    on_conflict: str = "skip"
    #: As given; once made, the parents' ids in order (a generator is read once).
    after: Iterable[Job | str] | Job | str = ()
    on_parent_failure: str = "propagate"
    max_start_delay: float | timedelta | None = None
    connection: object | None = None
    #: The key whose rate limit the job's starts count against (checked).
    rate_key: str | None = None
    #: None: the job's own, else its first task's, else the default (``settle_priority``).
    priority: int | None = None
    #: The key whose concurrency limit the job's steps run under (checked).
    concurrency_key: str | None = None
    #: The checked time options (seconds); :meth:`StartOptions.times` plans them.
    start: StartOptions = field(init=False, repr=False, compare=False)
    #: The checked unique key.
    key: str | None = field(init=False, repr=False, compare=False)
    #: The parents and what their failure does.
    waits: Waits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.priority is not None:
            check_priority(self.priority)
        start = check_start_options(
            datetime.now(timezone.utc),
            delay=self.delay,
            eta=self.eta,
            max_start_delay=self.max_start_delay,
        )
        key = check_unique_key(self.unique_key)
        check_choice("on_conflict", self.on_conflict, ON_CONFLICT)
        if self.rate_key is not None:
            check_rate_key(self.rate_key)
        if self.concurrency_key is not None:
            check_concurrency_key(self.concurrency_key)
        waits = Waits(parent_ids(self.after), self.on_parent_failure)
        object.__setattr__(self, "after", waits.parents)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "waits", waits)

    @property
    def stored_first(self) -> bool:
        """Whether the job's row must be stored before its message is sent: a unique
        key or parents for the database to decide, or the caller's transaction."""
        return self.key is not None or bool(self.waits.parents) or self.connection is not None


class IJobIO(Protocol):
    """What a :class:`Job` asks of the world outside the model (the engine's
    :class:`~pypepper_dramatiq.engine.job_io.JobIO`, found through :data:`runtime`)."""

    def schedule(self, job: Job, options: ScheduleOptions | None = None) -> str: ...
    def schedule_many(
        self,
        jobs: Iterable[Job],
        *,
        priority: int | None = None,
        rate_key: str | None = None,
        concurrency_key: str | None = None,
    ) -> list[Scheduled]: ...
    def save(self, job: Job) -> bool: ...
    def persist(self, job: Job, attempts: int) -> bool: ...
    def cancel(self, job: Job, by: str = BY_API) -> bool: ...
    def cancel_saved(self, job_id: str, by: str = BY_API) -> bool: ...
    def retry_saved(self, job_id: str, from_task: str | None = None) -> str: ...
    def get_saved(self, job_id: str) -> JobRecord | None: ...
    def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRecord: ...
    async def wait_async(
        self, job_id: str, timeout: float | timedelta | None = None
    ) -> JobRecord: ...


class JobRuntime:
    """Where the job methods that do I/O find their :class:`IJobIO`.

    ``setup()`` installs the engine's job I/O (:meth:`install`); without it (the
    embedded default) the package names, when it is imported, how to find one on
    first use (:meth:`provide_default`), so that importing the model imports no
    engine. Thread-safe: the default is resolved once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job_io: IJobIO | None = None
        self._default: Callable[[], IJobIO] | None = None

    def install(self, job_io: IJobIO) -> None:
        """Make ``job_io`` the one the job methods use from now on."""
        with self._lock:
            self._job_io = job_io

    def provide_default(self, find: Callable[[], IJobIO]) -> None:
        """``find()`` gives the job I/O used when none was installed (called once,
        on the first job method that needs one)."""
        with self._lock:
            self._default = find

    @property
    def job_io(self) -> IJobIO:
        """The installed job I/O, or the default one (resolved now if not yet).

        Raises:
            RuntimeError: none was installed and no default was provided.
        """
        job_io = self._job_io
        if job_io is not None:
            return job_io
        with self._lock:
            if self._job_io is None:
                if self._default is None:
                    raise RuntimeError(
                        "no job I/O: call pypepper_dramatiq.setup() or import "
                        "pypepper_dramatiq, which provides the default one"
                    )
                self._job_io = self._default()
            return self._job_io


#: The process's job runtime: one per process, as the job store and the broker are.
runtime = JobRuntime()


def use_job_io(job_io: IJobIO) -> None:
    """Install the job I/O the job methods that do I/O delegate to
    (:meth:`JobRuntime.install`; ``setup()`` does it)."""
    runtime.install(job_io)


class Job:
    """Workflows to run, in order, as one unit with a status.

    Args:
        category: free-form label for grouping and listing.
        channel_id: the channel ``scheduled()`` sends the job to; None: the
            application's default channel (``setup(defaults={"channel_id": ...})``),
            else ``"default"``, read now.
        id: the job id (a new UUID by default), 1 to 64 characters.
        priority: 0 (the lowest) to 9: within its channel, a waiting job of a higher
            priority starts first; None: the application's default
            (``setup(defaults={"priority": ...})``), else 0. ``scheduled(priority=)``
            overrides it.

    Raises:
        ValueError: an id that is not 1 to 64 characters or holds a NUL or a lone
            surrogate, or an empty channel_id. (The rest of what the job row must
            hold is checked when the job is scheduled or saved.)
        InvalidPriorityError: ``priority`` is not a whole number from 0 to 9.
    """

    def __init__(
        self,
        category: str | None = None,
        channel_id: str | None = None,
        *,
        id: str | None = None,
        priority: int | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex if id is None else check_job_id(id)
        # Whether the job says its priority itself (else its first task may, at scheduling).
        self._own_priority = priority is not None
        if priority is None:
            priority = installed_defaults.current.priority
        if priority is not None:
            priority = check_priority(priority)
        if channel_id is None:
            channel_id = default_channel()
        if not isinstance(channel_id, str) or not channel_id:
            raise ValueError(f"channel_id must be a non-empty string, got {channel_id!r}")
        self.category = category
        self.channel_id = channel_id
        self.workflows: list[Workflow] = []
        self.version = 0
        self.created: datetime = utcnow()
        self.updated: datetime = self.created
        self.error: str | None = None
        #: The planned start, the latest permitted start, and (for a job held in
        #: the store) when its first message is due: set by ``scheduled()``.
        self.not_before: datetime | None = None
        self.start_deadline: datetime | None = None
        self.release_at: datetime | None = None
        #: The unique key the job holds, and what it waits for: set by ``scheduled()``.
        self.unique_key: str | None = None
        self.waits: dict[str, Any] | None = None
        #: The key whose rate limit every step start of the job counts against
        #: (``scheduled(rate_key=)``), stored in ``payload["rate_key"]``; None: none.
        self.rate_key: str | None = None
        #: The key whose concurrency limit every step of the job runs under
        #: (``scheduled(concurrency_key=)``), stored in ``payload["concurrency_key"]``;
        #: None: none.
        self.concurrency_key: str | None = None
        #: The id of the job this one retries (``Job.retry_saved``), stored in
        #: ``payload["retry_of"]``; None for a job that retries none.
        self.retry_of: str | None = None
        self.state: dict[str, Any] = {} if not priority else with_priority({}, priority)
        self.context = Context(
            {CANCEL_EVENT_KEY: threading.Event(), JOB_ID_KEY: self.id, RESULTS_KEY: {}}
        )
        self._fsm: SchedulerFSM = build_scheduler_fsm()
        self._lock = threading.RLock()

    # -- status -------------------------------------------------------------

    @property
    def status(self) -> Status:
        """The state machine's status (authoritative; may lead the stored one)."""
        return self._fsm.state

    @property
    def fsm(self) -> SchedulerFSM:
        return self._fsm

    def apply_event(self, event: Event) -> Status:
        """Fire ``event`` on the state machine; raises on an invalid transition."""
        return self._fsm.apply(event)

    def restore_status(self, status: Status) -> None:
        """Roll the state machine back to ``status`` (no event, no store write)."""
        self._fsm.restore(status)

    @property
    def priority(self) -> int:
        """0 (the lowest, a job's unless it says) to 9; kept in the job's state."""
        return priority_in(self.state)

    @priority.setter
    def priority(self, value: int) -> None:
        self.state = with_priority(self.state, check_priority(value))
        self._own_priority = True

    def settle_priority(self) -> int:
        """The priority the job is scheduled with, recorded in its state: its own
        (``Job(priority=)``, ``job.priority``), else its first task's
        (``@workflow_task(priority=)``), else the application's default, else 0."""
        if not self._own_priority:
            tasks = [task for workflow in self.workflows for task in workflow.get_tasks()]
            if tasks and tasks[0].priority is not None:
                self.state = with_priority(self.state, tasks[0].priority)
        return self.priority

    @property
    def cancel_event(self) -> threading.Event:
        event = self.context.context[CANCEL_EVENT_KEY]
        assert isinstance(event, threading.Event)
        return event

    @property
    def is_cancelled(self) -> bool:
        return self.status is Status.CANCELLED or self.cancel_event.is_set()

    def share_cancel_event(self) -> None:
        """Give every task this job's cancel event, job id and shared results."""
        for workflow in self.workflows:
            for task in workflow.get_tasks():
                task.context.context[CANCEL_EVENT_KEY] = self.cancel_event
                task.context.context[JOB_ID_KEY] = self.id
                task.context.context[RESULTS_KEY] = self.context.context[RESULTS_KEY]
                task.context.context[PARENT_RESULTS_KEY] = self.state.get(PARENT_RESULTS_KEY) or {}

    # -- lifecycle ----------------------------------------------------------

    def scheduled(
        self,
        *,
        delay: float | timedelta | None = None,
        eta: datetime | None = None,
        unique_key: str | None = None,
        on_conflict: str = "skip",
        after: Iterable[Job | str] | Job | str = (),
        on_parent_failure: str = "propagate",
        max_start_delay: float | timedelta | None = None,
        connection: object | None = None,
        rate_key: str | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> str:
        """INIT, SCHEDULE, send to the channel, persist Scheduled; returns the id of the
        job left in charge of the work (this one's, or the key holder's on a skip).

        Must be called from sync code (RuntimeError inside a running event loop).
        With no option it behaves as ``scheduled()`` of pypepper's scheduler.

        Args:
            delay: seconds (or a timedelta): start no earlier than now + delay.
            eta: a timezone-aware datetime: start no earlier than it.
            unique_key: at most one active (Scheduled or InProgress) job per key.
            on_conflict: when another active job holds ``unique_key``:
                ``"skip"`` stores nothing and returns the holder's id;
                ``"replace"`` cancels a holder not started yet and takes the key
                (a running holder is not interrupted: then as ``"after"``);
                ``"after"`` stores this job to run once the holder ended;
                ``"raise"`` raises :class:`~pypepper_dramatiq.errors.DuplicateJobError`.
            after: jobs (or job ids) this job waits for; each must be stored.
            on_parent_failure: when a parent ends Failed or Cancelled:
                ``"propagate"`` fails this job (its error names the parent),
                ``"cancel"`` cancels it, ``"ignore"`` runs it anyway.
            max_start_delay: seconds (or a timedelta): a job not started by its
                planned start plus this ends Cancelled, before any of its code
                runs (0: no lateness allowed). Waits do not move it. None: the
                application's default (``setup(defaults={"max_start_delay": ...})``),
                else no deadline.
            connection: the caller's SQLAlchemy ``Connection`` or ``Session`` on
                the job store's database: the job is written in the caller's
                transaction and sent only once it commits (by the workers' sweep
                within about a second, or at once by this process when a
                ``Session`` commits); a rollback leaves no trace. The channel's
                stop flag and bound are checked now (the errors below), and the
                job takes its slot when it is sent.
            rate_key: a key (``"tenant-42"``) whose rate limit, declared with
                ``setup(rate_limits={"tenant-*": "10/s"})``, every step start of the
                job counts against, for every worker together (besides its channel's
                own). A key no pattern matches is not limited. At most 128 characters.
            priority: 0 (the lowest) to 9: within the channel, a waiting job of a
                higher priority starts before lower ones, on every worker; equal
                priorities keep their submit order. None: the job's own
                (``Job(priority=)``), else its first task's
                (``@workflow_task(priority=)``), else the application's default,
                else 0.
            concurrency_key: a key (``"tenant-42"``) whose concurrency limit, declared
                with ``setup(concurrency={"tenant-*": 3})``, bounds how many steps of
                the jobs keyed alike run at once, on every worker together (besides
                its channel's ``max_running``). A key no pattern matches is not
                limited. A non-empty text of at most 128 characters.

        Raises:
            ChannelFullError, ChannelStoppedError: nothing was queued; the
                status is rolled back so ``scheduled()`` can be retried.
            DuplicateJobError: ``on_conflict="raise"`` and the key is held
                (``existing_id`` names the holder).
            UnknownJobError: a job of ``after`` is not stored.
            InvalidTransitionError: the job cannot be scheduled from its status.
            ConfigError: ``connection`` is not a SQLAlchemy Connection or Session,
                reaches another database than the job store's, or the store is
                not a SQL one.
            ValueError, TypeError: a bad option (naive eta, negative delay or one
                over 100 years, both delay and eta, an unknown on_conflict...), or
                a value the job row cannot hold (a category or channel_id over
                128 characters, a NUL or lone surrogate in any string of the job,
                its task parameters and their keys included, a NaN parameter),
                named with its limit; nothing was queued or stored, whatever the
                store (the in-memory store refuses what PostgreSQL and MySQL cannot
                keep).
            InvalidPriorityError: ``priority`` is not a whole number from 0 to 9
                (both a ValueError and a TypeError); nothing was queued or stored.
            InvalidConcurrencyKeyError: ``concurrency_key`` is not a non-empty text of
                at most 128 characters (a ValueError and a TypeError); nothing was
                queued or stored.
        """
        options = ScheduleOptions(
            delay=delay,
            eta=eta,
            unique_key=unique_key,
            on_conflict=on_conflict,
            after=after,
            on_parent_failure=on_parent_failure,
            max_start_delay=(
                installed_defaults.current.max_start_delay
                if max_start_delay is None
                else max_start_delay
            ),
            connection=connection,
            rate_key=rate_key,
            priority=priority,
            concurrency_key=concurrency_key,
        )
        if options.rate_key is not None:
            self.rate_key = options.rate_key
        if options.concurrency_key is not None:
            self.concurrency_key = options.concurrency_key
        if options.priority is not None:
            self.priority = options.priority
        else:
            self.settle_priority()
        return runtime.job_io.schedule(self, options)

    async def scheduled_async(self, *args: Any, **kwargs: Any) -> str:
        """:meth:`scheduled` for async code (``await job.scheduled_async()``).

        Runs :meth:`scheduled` with the same arguments on a worker thread
        (``asyncio.to_thread``), so the store write and the broker call do not
        block the event loop. That thread runs no event loop, so the sync-only
        guard of :meth:`scheduled` passes there.

        Cancelling the awaiting coroutine does not stop a dispatch already
        under way: the job may still end up queued and stored Scheduled.

        Raises:
            The errors of :meth:`scheduled`, unchanged (ChannelFullError,
            ChannelStoppedError, InvalidTransitionError, StoreNotConfiguredError...).
        """
        return await asyncio.to_thread(self.scheduled, *args, **kwargs)

    def cancel(self, by: str = BY_API) -> bool:
        """CANCEL, set the cancel event, persist Cancelled; True once persisted.

        On a failed write the job stays Cancelled and only the write is retried.
        The row keeps who cancelled (``by``, default ``"api"``) and this host
        (``state["cancelled_by"]``), which the dashboard's timeline shows.
        """
        return runtime.job_io.cancel(self, by)

    @staticmethod
    def cancel_saved(job_id: str, by: str = BY_API) -> bool:
        """Cancel the stored job ``job_id`` from any process, without its tasks' code.

        Writes Cancelled over its Scheduled or InProgress row (keeping the
        progress stored there, and recording who cancelled: ``by``, default
        ``"api"``, and this host), then tells running workers. True once this
        call wrote Cancelled; False if the row kept changing under every attempt.

        Raises:
            UnknownJobError: no job ``job_id`` is stored (also for an id no job
                row can hold, such as one with a NUL: the store is not asked).
            InvalidTransitionError: the job already ended: Completed, Failed, or
                Cancelled already (``exc.status`` names it).
            StoreError: the store failed.
        """
        return runtime.job_io.cancel_saved(job_id, by)

    @staticmethod
    def retry_saved(job_id: str, from_task: str | None = None) -> str:
        """Schedule a new job that takes the Failed or Cancelled job ``job_id`` up
        where it stopped; returns the new job's id.

        The new job has the same workflows, channel and category, and starts at
        the task that failed (or was cancelled), or at ``from_task``, with the
        results of the tasks before it kept: they do not run again, and the
        tasks after them see their results (``context.results``, ``result()``)
        as if they had. Those tasks' attempts are not copied: the original keeps
        its history, unchanged, as every ended job does. ``payload["retry_of"]``
        of the new job names the original. It goes through ``scheduled()``'s
        path (the channel's admission, its row stored, its message sent) and
        starts now, with no unique key, no parents and no start deadline.

        The process that calls it rebuilds the job's tasks, so the code of the
        job's ``@workflow_task`` functions (or registered executors) must be
        imported here, as where it was first scheduled.

        Args:
            job_id: the job to retry.
            from_task: start at this task instead: its name, or its position
                ``"workflow.task"`` (such as ``"0.1"``) when several tasks have
                that name. It may be earlier than where the job stopped (the
                tasks from there on run again), not later.

        Raises:
            UnknownJobError: no job ``job_id`` is stored (also for an id no job
                row can hold).
            JobNotRetriableError: the job is not Failed or Cancelled (it names
                the job and its status).
            UnknownTaskError: the job has no task ``from_task`` (it names the
                job's tasks).
            AmbiguousTaskNameError: several tasks are named ``from_task`` (the
                message names their positions: pass one).
            RetryError: ``from_task`` comes after where the job stopped.
            UnknownExecutorError: the job was stored without its workflows (a
                task had no ``executor_id``), so it cannot be retried from the
                store; or a task's executor id is not registered here.
            ChannelFullError, ChannelStoppedError, BrokerUnavailableError: as
                for ``scheduled()``; nothing was stored.
            StoreError: the store failed.
        """
        return runtime.job_io.retry_saved(job_id, from_task)

    # -- persistence --------------------------------------------------------

    def save(self) -> bool:
        """Write a snapshot; True if the store took it (then ``version``/``updated`` advance).

        Raises:
            StoreError: the store failed (not a rejection: that answers False).
            ValueError, TypeError: the row cannot hold a value of the job (named,
                as ``scheduled()`` names it); nothing was written.
        """
        return runtime.job_io.save(self)

    def persist(self, attempts: int = SAVE_ATTEMPTS) -> bool:
        """:meth:`save`, retried; never raises for store failures (a value the row
        cannot hold is not one: that raises at once, as for :meth:`save`).

        A write skipped because the row already holds our status (or, for a
        Scheduled write, a later one: a worker healed the row and went on)
        counts as done (the row's version is adopted, not rewritten). A write
        skipped for a stale version is retried on the stored version (and its
        stored progress) only when the stored status may be overwritten by ours.
        """
        return runtime.job_io.persist(self, attempts)

    @property
    def write_lock(self) -> threading.RLock:
        """Held while a snapshot is taken and written (a write is one unit)."""
        return self._lock

    def mark_saved(self, version: int, updated: datetime) -> None:
        """The store took a snapshot: it now holds ``version``, written at ``updated``."""
        with self._lock:
            self.version = version
            self.updated = updated

    def adopt_version(self, record: JobRecord) -> None:
        """Take the stored row's version and progress (not its status)."""
        with self._lock:
            self.version = record.version
            self.updated = record.updated
            self.state = dict(record.state)

    def follow_progress(self, record: JobRecord) -> None:
        """Take the stored row's version, progress and error (not its status):
        the row was written by the engine running this job here."""
        with self._lock:
            self.adopt_version(record)
            self.error = record.error

    def adopt(self, record: JobRecord) -> None:
        """Take the stored status and version (follow the durable row)."""
        with self._lock:
            self._fsm.restore(record.status)
            self.version = record.version
            self.updated = record.updated
            if record.status is Status.CANCELLED:
                self.cancel_event.set()

    @staticmethod
    def get_saved(job_id: str) -> JobRecord | None:
        """The stored snapshot of job ``job_id``, or None (also for an id no job row
        can hold, such as one with a NUL: the store is not asked).

        Raises:
            CorruptRecordError: (a ``StoreError``) the stored row cannot be read: a
                column holds what no writer of this package writes (changed by hand
                or by another program); the error names the job and the column.
            StoreError: the store failed.
        """
        return runtime.job_io.get_saved(job_id)

    # -- waiting for the outcome --------------------------------------------

    def wait(self, timeout: float | timedelta | None = None) -> JobRecord:
        """Block until this job is Completed, Failed or Cancelled; returns its stored row.

        The row says how it ended: ``status``, ``error``, the results
        (``record.result(name)``, ``record.results_by_name()``) and each task's
        last error (``record.state["errors"]``). This object is not changed
        (its state machine stays where this process left it): read the record.

        A job that has ended already is returned at once (one read). Otherwise
        the wait is woken by the notice its end sends (Redis pub/sub, or
        directly in this process), and reads the row every two seconds in
        case a notice is lost (``notices.POLL_SECONDS``).

        Args:
            timeout: seconds (or a timedelta) to wait at most; None: no limit.

        Raises:
            WaitTimeoutError: (a ``TimeoutError``) the job did not end in time.
            UnknownJobError: no such job is stored, or its row was deleted
                while waiting (retention).
            WaitInsideJobError: called from a task of this same job.
            RuntimeError: called inside a running event loop (use
                :meth:`wait_async`).
            ValueError, TypeError: a negative, infinite or non-numeric timeout.
            StoreError: the store failed at the first read (later outages of
                the store are waited out).
        """
        return runtime.job_io.wait(self.id, timeout)

    async def wait_async(self, timeout: float | timedelta | None = None) -> JobRecord:
        """:meth:`wait` for async code (``await job.wait_async()``): it holds no thread
        while it waits and does not block the event loop (the reads of the row
        run on worker threads). Same results and errors, but no RuntimeError."""
        return await runtime.job_io.wait_async(self.id, timeout)

    @staticmethod
    def wait_saved(job_id: str, timeout: float | timedelta | None = None) -> JobRecord:
        """:meth:`wait` for the stored job ``job_id``, from any process."""
        return runtime.job_io.wait(job_id, timeout)

    @staticmethod
    async def wait_saved_async(job_id: str, timeout: float | timedelta | None = None) -> JobRecord:
        """:meth:`wait_async` for the stored job ``job_id``, from any process."""
        return await runtime.job_io.wait_async(job_id, timeout)

    def result(self, name: str, workflow: int | None = None) -> Any:
        """The stored result of this job's task named ``name``.

        Reads the stored row as it is now: it does not wait for the job to
        end (call :meth:`wait` first for that). Of a job still running, the
        tasks that have finished have their results and the others raise
        :class:`NoTaskResultError` (not produced yet). One read per call;
        :meth:`wait` returns the row, whose ``result(name)`` and
        ``results_by_name()`` read it without another.

        Args:
            name: the task's name.
            workflow: the index of its workflow; needed only when tasks of
                several workflows have this name.

        Raises:
            NoTaskResultError: (a ``KeyError``) the job has no task so named, or
                it has no result: not run yet, failed, or skipped (optional,
                failed); the message says which. Also when the job was stored
                without its workflows (a task without an ``executor_id``).
            AmbiguousTaskNameError: (a ``LookupError``) several tasks have this
                name (pass ``workflow``; the message names their positions).
            UnknownJobError: the job is not stored.
        """
        record = runtime.job_io.get_saved(self.id)
        if record is None:
            raise UnknownJobError(self.id)
        return record.result(name, workflow)

    def to_record(self, *, updated: datetime | None = None) -> JobRecord:
        """A snapshot; workflows are included only when every task has an executor_id.

        ``updated``: the snapshot's time of writing, instead of the job's own (a
        write's record, made once rather than made and then changed)."""
        with self._lock:
            return JobRecord(
                id=self.id,
                channel_id=self.channel_id,
                category=self.category,
                status=self.status,
                version=self.version,
                created=self.created,
                updated=self.updated if updated is None else updated,
                payload=self._payload(),
                state=dict(self.state),
                error=self.error,
                not_before=self.not_before,
                release_at=self.release_at,
                start_deadline=self.start_deadline,
                unique_key=self.unique_key,
                waits=self.waits,
            )

    def _payload(self) -> dict[str, Any] | None:
        tasks = [t for w in self.workflows for t in w.get_tasks()]
        if any(t.executor_id is None for t in tasks):
            return None
        payload: dict[str, Any] = {
            "workflows": [
                {"tasks": [t.to_dict(self.channel_id) for t in w.get_tasks()]}
                for w in self.workflows
            ]
        }
        if self.retry_of is not None:
            payload[RETRY_OF_KEY] = self.retry_of
        if self.rate_key is not None:
            payload[RATE_KEY_KEY] = self.rate_key
        if self.concurrency_key is not None:
            payload[CONCURRENCY_KEY_KEY] = self.concurrency_key
        return payload

    @classmethod
    def from_record(cls, record: JobRecord) -> Job:
        """Rebuild a runnable job; its state machine starts at Unknown.

        Raises:
            UnknownExecutorError: (a ``ValueError``) the record holds no
                workflows, or names an executor id that is not registered.
        """
        if record.payload is None:
            raise UnknownExecutorError(
                None, f"job {record.id} was saved without executor ids and cannot be rebuilt"
            )
        job = cls(record.category, record.channel_id, id=record.id)
        try:
            job.workflows = [
                Workflow(Task.from_dict(t) for t in w.get("tasks", []))
                for w in record.payload.get("workflows", [])
            ]
        except UnknownExecutorError as exc:
            raise UnknownExecutorError(exc.executor_id, f"job {record.id}") from None
        job.version = record.version
        job.created, job.updated = record.created, record.updated
        job.state = dict(record.state)
        job._own_priority = True  # the stored priority was settled when it was scheduled
        job.error = record.error
        job.not_before, job.start_deadline = record.not_before, record.start_deadline
        job.release_at = record.release_at
        job.unique_key, job.waits = record.unique_key, record.waits
        retry_of = record.payload.get(RETRY_OF_KEY)
        job.retry_of = retry_of if isinstance(retry_of, str) else None
        rate_key = record.payload.get(RATE_KEY_KEY)
        job.rate_key = rate_key if isinstance(rate_key, str) else None
        concurrency_key = record.payload.get(CONCURRENCY_KEY_KEY)
        job.concurrency_key = concurrency_key if isinstance(concurrency_key, str) else None
        return job

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, channel_id={self.channel_id!r}, status={self.status.value})"


def chain(*jobs: Job, on_parent_failure: str = "propagate") -> list[str]:
    """Schedule ``jobs`` so that each starts after the one before ended; returns their ids.

    The first is scheduled at once; each next one with ``after=`` the one
    before and ``on_parent_failure`` (by default a failure fails the rest of
    the chain, each naming its parent).

    Raises:
        The errors of :meth:`Job.scheduled`; the jobs scheduled before the
        error stay scheduled.
    """
    ids: list[str] = []
    for job in jobs:
        if ids:
            job.scheduled(after=ids[-1], on_parent_failure=on_parent_failure)
        else:
            job.scheduled()
        ids.append(job.id)
    return ids
