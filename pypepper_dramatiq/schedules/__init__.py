"""Recurring schedules: store, list, pause and fire them (:mod:`.firing`).

The cron expressions they fire on are read by :mod:`pypepper_dramatiq.rules.cron`;
their stored form is :class:`pypepper_dramatiq.records.recurring.RecurringSchedule`.
"""

from . import firing
from .firing import *  # noqa: F403 (the package's names are its firing API's)

__all__: list[str] = []
__all__ += firing.__all__
