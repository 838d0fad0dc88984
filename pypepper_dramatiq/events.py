"""The pypepper.scheduler import path of :mod:`pypepper_dramatiq.rules.events`."""

from .rules.events import (
    CANCEL,
    COMPLETE,
    FAIL,
    INIT,
    RUN,
    SCHEDULE,
    TRANSITIONS,
    Event,
    SchedulerFSM,
    build_scheduler_fsm,
    transition,
)

__all__ = [
    "Event",
    "INIT",
    "SCHEDULE",
    "RUN",
    "COMPLETE",
    "FAIL",
    "CANCEL",
    "TRANSITIONS",
    "transition",
    "SchedulerFSM",
    "build_scheduler_fsm",
]
