"""Lifecycle events and the job state machine."""

from __future__ import annotations

import threading

from ..errors import InvalidTransitionError
from .status import Status
from .text_enum import TextEnum


class Event(TextEnum):
    INIT = "INIT"
    SCHEDULE = "SCHEDULE"
    RUN = "RUN"
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    CANCEL = "CANCEL"


INIT = Event.INIT
SCHEDULE = Event.SCHEDULE
RUN = Event.RUN
COMPLETE = Event.COMPLETE
FAIL = Event.FAIL
CANCEL = Event.CANCEL

#: event -> (statuses it may fire from, status it leads to)
TRANSITIONS: dict[Event, tuple[frozenset[Status], Status]] = {
    INIT: (frozenset({Status.UNKNOWN}), Status.INITIALIZING),
    SCHEDULE: (frozenset({Status.INITIALIZING}), Status.SCHEDULED),
    RUN: (frozenset({Status.SCHEDULED}), Status.IN_PROGRESS),
    COMPLETE: (frozenset({Status.IN_PROGRESS}), Status.COMPLETED),
    FAIL: (
        frozenset({Status.INITIALIZING, Status.SCHEDULED, Status.IN_PROGRESS}),
        Status.FAILED,
    ),
    CANCEL: (frozenset({Status.SCHEDULED, Status.IN_PROGRESS}), Status.CANCELLED),
}


def transition(status: Status, event: Event) -> Status:
    """The status ``event`` leads to from ``status``, by :data:`TRANSITIONS`.

    Every status change of a job goes through here (a stored row's as well as
    a state machine's), so that the table is the only definition of the moves.

    Raises:
        InvalidTransitionError: ``event`` may not fire from ``status``.
    """
    sources, target = TRANSITIONS[Event(event)]
    if status not in sources:
        raise InvalidTransitionError(Event(event).value, Status(status).value)
    return target


class SchedulerFSM:
    """A thread-safe state machine over :data:`TRANSITIONS`."""

    def __init__(self, state: Status = Status.UNKNOWN) -> None:
        self._state = Status(state)
        self._lock = threading.Lock()

    @property
    def state(self) -> Status:
        return self._state

    def can(self, event: Event) -> bool:
        return self._state in TRANSITIONS[Event(event)][0]

    def apply(self, event: Event) -> Status:
        """Fire ``event``; raise :class:`InvalidTransitionError` if not allowed here."""
        with self._lock:
            self._state = transition(self._state, event)
            return self._state

    def restore(self, state: Status) -> None:
        """Put the machine back to a state it held before (rollback, not an event)."""
        with self._lock:
            self._state = Status(state)


def build_scheduler_fsm(state: Status = Status.UNKNOWN) -> SchedulerFSM:
    """A new job state machine, at ``Unknown`` unless told otherwise."""
    return SchedulerFSM(state)
