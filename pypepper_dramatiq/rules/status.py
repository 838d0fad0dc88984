"""The job lifecycle: statuses and how they order."""

from __future__ import annotations

from .text_enum import TextEnum


class Status(TextEnum):
    """A job's status. The values are the strings stored in the job store."""

    UNKNOWN = "Unknown"
    INITIALIZING = "Initializing"
    SCHEDULED = "Scheduled"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def rank(self) -> int:
        """Position in the lifecycle; every terminal status shares the last rank."""
        return _RANK[self]


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})

_RANK = {
    Status.UNKNOWN: 0,
    Status.INITIALIZING: 1,
    Status.SCHEDULED: 2,
    Status.IN_PROGRESS: 3,
    Status.COMPLETED: 4,
    Status.FAILED: 4,
    Status.CANCELLED: 4,
}


def may_overwrite(durable: Status, new: Status) -> bool:
    """Whether a stored ``durable`` status may be replaced by ``new``.

    A status never moves back to an earlier lifecycle, and distinct terminals
    never replace each other.
    """
    if durable.is_terminal and new.is_terminal:
        return durable is new
    return new.rank >= durable.rank


def overwritable_by(new: Status) -> frozenset[Status]:
    """The stored statuses that ``new`` may replace (for guarded SQL updates)."""
    return frozenset(s for s in Status if may_overwrite(s, new))
