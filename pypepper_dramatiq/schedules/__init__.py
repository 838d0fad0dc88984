"""Recurring schedules: store, list, pause and fire them (:mod:`.firing`).

The cron expressions they fire on are read by :mod:`pypepper_dramatiq.rules.cron`;
their stored form is :class:`pypepper_dramatiq.records.recurring.RecurringSchedule`.
"""

from .firing import (
    RecurringSchedule,
    fire_due,
    list_recurring,
    pause_recurring,
    recurring,
    remove_recurring,
    resume_recurring,
    trigger_recurring,
)

__all__ = [
    "RecurringSchedule",
    "fire_due",
    "list_recurring",
    "pause_recurring",
    "recurring",
    "remove_recurring",
    "resume_recurring",
    "trigger_recurring",
]
