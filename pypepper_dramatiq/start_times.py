"""When a job may start, and until when: the ``scheduled()`` options of time.

Pure: the options are checked (a bad one is a ``ValueError`` or ``TypeError``
naming it, before anything is queued or stored) and turned into the planned
start and the start deadline the job row keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from .durations import MAX_SECONDS, MAX_SHOWN, bounded

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


def missed_deadline(deadline: datetime, now: datetime) -> str:
    """The error a job cancelled for its start deadline is stored with."""
    late = (now - deadline).total_seconds()
    return (
        f"start deadline passed: not started by {deadline.isoformat()} "
        f"(max_start_delay after its planned start); {late:.1f}s late"
    )


def duration(name: str, value: object) -> float:
    """``value`` (seconds or a timedelta) as seconds >= 0, at most
    :data:`~pypepper_dramatiq.durations.MAX_SECONDS`; a ValueError or TypeError
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


def start_times(
    now: datetime,
    *,
    delay: float | timedelta | None = None,
    eta: datetime | None = None,
    max_start_delay: float | timedelta | None = None,
) -> StartTimes:
    """The start times ``scheduled(delay=..., eta=..., max_start_delay=...)`` ask for.

    Raises:
        ValueError: ``delay`` and ``eta`` together, a naive ``eta`` or one more than
            :data:`~pypepper_dramatiq.durations.MAX_SECONDS` from now, a negative,
            infinite or longer ``delay`` or ``max_start_delay``.
        TypeError: an option of the wrong type.
    """
    if delay is not None and eta is not None:
        raise ValueError("delay and eta exclude each other: give one of them")
    planned = now
    if delay is not None:
        planned = now + timedelta(seconds=duration("delay", delay))
    elif eta is not None:
        if not isinstance(eta, datetime):
            raise TypeError(f"eta must be a timezone-aware datetime, got {eta!r}")
        if eta.tzinfo is None or eta.utcoffset() is None:
            raise ValueError(f"eta must be timezone-aware (a naive time is ambiguous): {eta!r}")
        if abs((eta - now).total_seconds()) > MAX_SECONDS:
            raise ValueError(
                f"eta must be within {MAX_SECONDS:.0f} seconds ({MAX_SHOWN}) of now, got {eta!r}"
            )
        planned = eta
    deadline = None
    if max_start_delay is not None:
        # From the planned start, even one already past (an eta in the past).
        deadline = planned + timedelta(seconds=duration("max_start_delay", max_start_delay))
    return StartTimes(planned if planned > now else None, deadline)
