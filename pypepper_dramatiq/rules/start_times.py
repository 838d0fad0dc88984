"""When a job may start, and until when: the ``scheduled()`` options of time.

Pure: the options are checked (a bad one is a ``ValueError`` or ``TypeError``
naming it, before anything is queued or stored) and turned into the planned
start and the start deadline the job row keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..limits.durations import MAX_SECONDS, MAX_SHOWN, bounded, whole_milliseconds

#: Delays up to this long ride on Dramatiq's delayed messages (kept in a worker's
#: memory until due); longer ones are held in the job store and released by the
#: recovery sweep shortly before they are due.
SHORT_DELAY_SECONDS = 10.0


@dataclass(frozen=True)
class StartTimes:
    """The planned start (None: at once) and the latest permitted start (None: none)."""

    not_before: datetime | None = None
    deadline: datetime | None = None

    def delay_from(self, now: datetime) -> float:
        """Seconds from ``now`` to the planned start (0 when it has come)."""
        if self.not_before is None:
            return 0.0
        return max(0.0, (self.not_before - now).total_seconds())


def missed_deadline(deadline: datetime, now: datetime, retry_of: str | None = None) -> str:
    """The error a job cancelled for its start deadline is stored with; ``retry_of``:
    the name of the task whose retry came too late (:func:`late_retry`)."""
    late = (now - deadline).total_seconds()
    if retry_of is not None:
        return (
            f"start deadline passed: the retry of task {retry_of} was not picked up by "
            f"{deadline.isoformat()} (max_start_delay after its planned start; retries "
            f"keep the job's deadline); {late:.1f}s late"
        )
    return (
        f"start deadline passed: not started by {deadline.isoformat()} "
        f"(max_start_delay after its planned start); {late:.1f}s late"
    )


def is_retry(cursor: Sequence[int] | None) -> bool:
    """Whether the attempt at ``cursor`` (``[workflow, task, round, attempt]``) is a
    retry: an attempt of a task whose previous attempt failed (a later attempt of a
    round, or the first attempt of a later round). The first attempt of a task,
    after the task before it succeeded or was skipped, is not one."""
    return cursor is not None and len(cursor) == 4 and (cursor[2] > 0 or cursor[3] > 0)


def late_retry(deadline: datetime | None, cursor: Sequence[int] | None, now: datetime) -> bool:
    """Whether the attempt at ``cursor``, picked up at ``now``, is a retry (:func:`is_retry`)
    past the job's start deadline: the job is then cancelled before it runs.

    The one rule of retries and deadlines, for both drivers and every store (the
    stores apply it when a step is claimed, :func:`~pypepper_dramatiq.stores.base.
    why_not_claimable`): a retry keeps the job's original deadline, as a first
    start does (a start exactly at the deadline is still in time). An attempt
    already running is never cut short by it.
    """
    return deadline is not None and deadline < now and is_retry(cursor)


def duration(name: str, value: object) -> float:
    """``value`` (seconds or a timedelta) as seconds >= 0, at most
    :data:`~pypepper_dramatiq.limits.durations.MAX_SECONDS`; a ValueError or TypeError
    naming option ``name`` otherwise."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond floats
            seconds = math.inf
    else:
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return bounded(name, seconds)


def max_start_delay_seconds(value: object) -> float:
    """``max_start_delay`` (seconds or a timedelta) as seconds: a duration
    (:func:`duration`) of whole milliseconds, a ValueError naming the option otherwise.

    Dramatiq's delays are whole milliseconds, and a deadline finer than that
    could not be told apart from the start it bounds.
    """
    return whole_milliseconds("max_start_delay", duration("max_start_delay", value))


@dataclass(frozen=True)
class StartOptions:
    """The time options of ``scheduled()``, checked: seconds, or a timezone-aware eta."""

    delay: float | None = None
    eta: datetime | None = None
    max_start_delay: float | None = None

    def times(self, now: datetime) -> StartTimes:
        """The planned start and the start deadline these options ask for at ``now``."""
        planned = now
        if self.delay is not None:
            planned = now + timedelta(seconds=self.delay)
        elif self.eta is not None:
            planned = self.eta
        deadline = None
        if self.max_start_delay is not None:
            # From the planned start, even one already past (an eta in the past).
            deadline = planned + timedelta(seconds=self.max_start_delay)
        return StartTimes(planned if planned > now else None, deadline)


def check_start_options(
    now: datetime,
    *,
    delay: float | timedelta | None = None,
    eta: datetime | None = None,
    max_start_delay: float | timedelta | None = None,
) -> StartOptions:
    """``scheduled(delay=..., eta=..., max_start_delay=...)`` checked at ``now``.

    Raises:
        ValueError: ``delay`` and ``eta`` together, a naive ``eta`` or one more than
            :data:`~pypepper_dramatiq.limits.durations.MAX_SECONDS` from now, a negative,
            infinite or longer ``delay`` or ``max_start_delay``, a ``max_start_delay``
            that is not whole milliseconds.
        TypeError: an option of the wrong type.
    """
    if delay is not None and eta is not None:
        raise ValueError("delay and eta exclude each other: give one of them")
    seconds = None
    if delay is not None:
        seconds = duration("delay", delay)
    elif eta is not None:
        if not isinstance(eta, datetime):
            raise TypeError(f"eta must be a timezone-aware datetime, got {eta!r}")
        if eta.tzinfo is None or eta.utcoffset() is None:
            raise ValueError(f"eta must be timezone-aware (a naive time is ambiguous): {eta!r}")
        if abs((eta - now).total_seconds()) > MAX_SECONDS:
            raise ValueError(
                f"eta must be within {MAX_SECONDS:.0f} seconds ({MAX_SHOWN}) of now, got {eta!r}"
            )
    lateness = None if max_start_delay is None else max_start_delay_seconds(max_start_delay)
    return StartOptions(seconds, eta if delay is None else None, lateness)
