"""Who hears what happens to jobs: the seam that metrics (or anything else) plug into.

The engine calls the functions below at the one place where each thing is
decided (a job stored Scheduled, a job's end after the write that records it, an attempt's end, a
retry, a recovered step, a missed start deadline, a step start held by a rate
limit or a pause, a recurring firing, a failing duty of the recovery sweep), so that
both drivers report the same facts. Each function hands the fact to every
installed :class:`Observer`; with none installed it returns at once, so the
step path pays one call and one test of an empty tuple.

An observer must be quick and must not block: it runs in the thread that made
the decision (a worker thread, the recovery sweep). One that raises is logged
(once per method) and changes nothing: the engine never fails because of it.

This module imports nothing of the package at run time, so that every layer
may call it (:mod:`pypepper_dramatiq.metrics.prometheus` is one observer, high up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from .logs import get_logger

if TYPE_CHECKING:
    from ..records.record import JobRecord

logger = get_logger(__name__)

_P = ParamSpec("_P")

#: How a recovered step was found (:meth:`Observer.recovered`).
LEASE_LAPSED = "lease_lapsed"
MESSAGE_LOST = "message_lost"
#: Why a step start was held instead of run (:meth:`Observer.start_held`): over its
#: channel's or its key's rate limit, its channel or task paused, or over its
#: channel's or its key's concurrency limit.
HELD_BY_RATE_LIMIT = "rate_limit"
HELD_BY_PAUSE = "paused"
HELD_BY_CONCURRENCY = "concurrency_limit"
#: Every reason of :meth:`Observer.start_held`, in the order the metrics list them.
START_HELD_REASONS = (HELD_BY_RATE_LIMIT, HELD_BY_PAUSE, HELD_BY_CONCURRENCY)


class Observer:
    """Hears the decisions of the engine; every method does nothing by default.

    Subclass it and override what you need. Records passed in are the rows as
    written (or, in process, the job's snapshot): read them, never keep them.
    """

    def worker_started(self) -> None:
        """A Dramatiq worker has booted in this process (every middleware's
        ``after_process_boot`` ran) and starts taking messages."""

    def job_scheduled(self, channel_id: str) -> None:
        """A job was stored Scheduled on channel ``channel_id`` by this process."""

    def scheduling(
        self, job_id: str, channel_id: str
    ) -> AbstractContextManager[Mapping[str, str]] | None:
        """Job ``job_id`` is being scheduled on ``channel_id`` by this process.

        An observer that follows a job across processes (a tracer) returns a
        context manager: it is entered before the job is stored or sent, and
        the text pairs it yields are stored with the job (its state's ``trace``,
        :mod:`~pypepper_dramatiq.records.state`), read back by every attempt
        (:meth:`attempt_started`); it is left once the job is stored and sent
        (or refused: then with the exception). None (the default): nothing to do.
        """
        return None

    def job_started(self, record: JobRecord, started: datetime) -> None:
        """A job's first step was claimed at ``started`` (it moved to InProgress)."""

    def job_ended(self, record: JobRecord) -> None:
        """A job ended (``record.status`` is Completed, Failed or Cancelled): called
        once per job, by whoever wrote the end."""

    def step_started(self, channel_id: str, task: str) -> None:
        """An attempt of task ``task`` starts running in this process."""

    def step_finished(self, channel_id: str, task: str) -> None:
        """The attempt that :meth:`step_started` announced is over (however it ended)."""

    def attempt_started(self, record: JobRecord, task: str, attempt: int, round: int) -> None:
        """An attempt of task ``task`` of job ``record`` starts in this thread
        (``attempt`` and ``round`` counted from 1). What this thread is told next
        about the job (:meth:`task_ended`, :meth:`retried`, :meth:`job_ended`)
        belongs to it, until :meth:`attempt_left` or :meth:`attempt_ended`."""

    def attempt_left(self, job_id: str) -> None:
        """The task of the attempt :meth:`attempt_started` announced in this thread
        has ended, and its outcome is handed to another thread: what that thread is
        told about the job, up to :meth:`attempt_ended`, belongs to the attempt;
        what follows in this thread does not."""

    def attempt_ended(self, job_id: str) -> None:
        """The attempt :meth:`attempt_started` announced was recorded (or could not
        be), in this thread or in the one it was left to: what follows in this
        thread is no part of it."""

    def task_ended(
        self,
        record: JobRecord,
        task: str,
        outcome: str,
        started: datetime | None,
        ended: datetime | None,
    ) -> None:
        """An attempt's outcome is being recorded. ``outcome`` is the attempt
        history's word (``succeeded``, ``failed``, ``timed_out``, ``cancelled``);
        ``started`` / ``ended`` are None when not known (a crashed actor)."""

    def retried(self, record: JobRecord, task: str) -> None:
        """A failed attempt of ``task`` was recorded and another one is due."""

    def recovered(self, record: JobRecord, kind: str) -> None:
        """The recovery sweep sent a step again: :data:`LEASE_LAPSED` (its worker
        died or hung) or :data:`MESSAGE_LOST` (a Scheduled job's message was gone)."""

    def deadline_missed(self, record: JobRecord) -> None:
        """A job not started by its start deadline was cancelled (``record`` as written)."""

    def fired(self, schedule: str, job_id: str) -> None:
        """Recurring schedule ``schedule`` fired: job ``job_id`` was stored for a slot
        (or for ``trigger_recurring``)."""

    def start_held(self, channel_id: str, reason: str) -> None:
        """A step of ``channel_id`` that was to start now was held, unrun and no
        attempt counted: :data:`HELD_BY_RATE_LIMIT` (it asks again at its turn) or
        :data:`HELD_BY_PAUSE` (until its channel or task is resumed). A start held
        again (refused once more at its turn) is told again."""

    def channel_depths(self, depths: Mapping[str, int]) -> None:
        """Jobs waiting in each channel, as the recovery sweep read them."""

    def held_jobs(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Scheduled jobs held in the store, by ``(channel, reason)`` (``"jobs"``:
        waiting for other jobs, ``"time"``: for a time), as the recovery sweep read them."""

    def sweep_duties(self, duties: Sequence[str]) -> None:
        """A recovery sweeper starts in this process; ``duties`` are the names of
        its duties (each a label :meth:`sweep_failed` may be told)."""

    def sweep_failed(self, duty: str) -> None:
        """A duty of the recovery sweep failed (it raised: the rest of the pass went
        on), or skipped one row it could not read or handle."""


class _Installed:
    """The observers installed now (a tuple, replaced whole: read without the lock)
    and the (observer id, method) pairs whose failure was logged already."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.observers: tuple[Observer, ...] = ()
        self.complained: set[tuple[int, str]] = set()


_installed = _Installed()


def install(observer: Observer) -> None:
    """Add ``observer`` (no-op if it is installed already)."""
    with _installed.lock:
        if observer not in _installed.observers:
            _installed.observers = (*_installed.observers, observer)


def remove(observer: Observer) -> None:
    """Take ``observer`` out (no-op if it is not installed)."""
    with _installed.lock:
        _installed.observers = tuple(o for o in _installed.observers if o is not observer)


def clear() -> None:
    """Remove every observer (tests)."""
    with _installed.lock:
        _installed.observers = ()
        _installed.complained.clear()


def installed() -> tuple[Observer, ...]:
    """The observers installed now, in the order they were added."""
    return _installed.observers


def observing() -> bool:
    """Whether any observer is installed: callers test it before building costly arguments."""
    return bool(_installed.observers)


def _failed(observer: Observer, method: str) -> None:
    key = (id(observer), method)
    if key in _installed.complained:
        return
    _installed.complained.add(key)
    logger.exception(
        "observer %r failed in %s; ignored (later failures of it there are not logged)",
        observer,
        method,
    )


# The notifications. Each loops over a snapshot of the tuple (replaced, never
# mutated), so that install() from another thread never disturbs a loop; with no
# observer installed each returns at once.


def _tell(method: str, *args: Any, **kwargs: Any) -> None:
    """Call ``method(*args, **kwargs)`` on each observer, logging what one raises."""
    for observer in _installed.observers:
        try:
            getattr(observer, method)(*args, **kwargs)
        except Exception:
            _failed(observer, method)


def _notification(method: Callable[Concatenate[Observer, _P], None]) -> Callable[_P, None]:
    """The function the engine calls to tell every observer what ``method`` hears.

    One definition for every notification, typed as the :class:`Observer` method it
    forwards to: with no observer installed it returns at once.
    """
    name = method.__name__

    def notify(*args: _P.args, **kwargs: _P.kwargs) -> None:
        if _installed.observers:
            _tell(name, *args, **kwargs)

    notify.__name__ = notify.__qualname__ = name
    notify.__doc__ = method.__doc__
    return notify


worker_started = _notification(Observer.worker_started)
job_scheduled = _notification(Observer.job_scheduled)


#: What :func:`scheduling` returns when no observer is installed (reusable).
_NOT_SCHEDULING: AbstractContextManager[Mapping[str, str] | None] = nullcontext(None)


class _Scheduling:
    """The observers' :meth:`Observer.scheduling` contexts, entered as one: yields
    the text pairs they gave (None for none)."""

    def __init__(self, job_id: str, channel_id: str) -> None:
        self._job_id, self._channel_id = job_id, channel_id
        self._stack = ExitStack()

    def __enter__(self) -> Mapping[str, str] | None:
        carrier: dict[str, str] = {}
        for observer in _installed.observers:
            try:
                context = observer.scheduling(self._job_id, self._channel_id)
                if context is not None:
                    carrier.update(self._stack.enter_context(context))
            except Exception:
                _failed(observer, "scheduling")
        return carrier or None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            self._stack.__exit__(kind, error, trace)
        except Exception:
            logger.exception("an observer failed leaving scheduling; ignored")


def scheduling(job_id: str, channel_id: str) -> AbstractContextManager[Mapping[str, str] | None]:
    """Enter around the scheduling of job ``job_id``: yields what to store with the
    job as its trace context (None: nothing). Callers test :func:`observing` first
    (with no observer it yields None)."""
    if not _installed.observers:
        return _NOT_SCHEDULING
    return _Scheduling(job_id, channel_id)


attempt_started = _notification(Observer.attempt_started)
attempt_left = _notification(Observer.attempt_left)
attempt_ended = _notification(Observer.attempt_ended)
job_started = _notification(Observer.job_started)
job_ended = _notification(Observer.job_ended)
step_started = _notification(Observer.step_started)
step_finished = _notification(Observer.step_finished)
task_ended = _notification(Observer.task_ended)
retried = _notification(Observer.retried)
recovered = _notification(Observer.recovered)
deadline_missed = _notification(Observer.deadline_missed)
fired = _notification(Observer.fired)
start_held = _notification(Observer.start_held)
channel_depths = _notification(Observer.channel_depths)
held_jobs = _notification(Observer.held_jobs)


def sweep_duties(duties: Sequence[str]) -> None:
    """Tells the observers the sweep's duties, as a tuple (never the caller's list)."""
    if _installed.observers:
        _tell("sweep_duties", tuple(duties))


sweep_failed = _notification(Observer.sweep_failed)
