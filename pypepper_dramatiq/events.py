"""Lifecycle events and the job state machine."""

from __future__ import annotations

import threading
from enum import Enum

from .errors import InvalidTransitionError
from .status import Status


class Event(str, Enum):
    INIT = "INIT"
    SCHEDULE = "SCHEDULE"
    RUN = "RUN"
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    CANCEL = "CANCEL"

    def __str__(self) -> str:
        return self.value


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
        event = Event(event)
        with self._lock:
            sources, target = TRANSITIONS[event]
            if self._state not in sources:
                raise InvalidTransitionError(event.value, self._state.value)
            self._state = target
            return target

    def restore(self, state: Status) -> None:
        """Put the machine back to a state it held before (rollback, not an event)."""
        with self._lock:
            self._state = Status(state)


def build_scheduler_fsm(state: Status = Status.UNKNOWN) -> SchedulerFSM:
    """A new job state machine, at ``Unknown`` unless told otherwise."""
    return SchedulerFSM(state)
