"""A recurring schedule as stored: a cron expression, a time zone and the job it copies.

Part of the model: the stores keep it, :mod:`pypepper_dramatiq.schedules.firing` fires it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..records.record import as_utc, utcnow


@dataclass(frozen=True)
class RecurringSchedule:
    """One recurring schedule.

    ``version`` works as a job row's: a store accepts a CAS write only if it
    still holds the version the writer read, and then holds ``version + 1``.
    """

    name: str
    cron: str
    timezone: str
    #: The job each firing copies: ``channel_id``, ``category`` and ``payload``
    #: (the workflows, as
    #: :attr:`JobRecord.payload <pypepper_dramatiq.records.record.JobRecord.payload>`).
    template: dict[str, Any]
    #: The first slot not handled yet (UTC).
    next_slot: datetime
    max_start_delay: float | None = None
    overlap: str = "skip"
    catch_up: str = "latest"
    #: The latest slot fired, and the job that firing created.
    last_slot: datetime | None = None
    last_job_id: str | None = None
    paused: bool = False
    version: int = 0
    created: datetime = field(default_factory=utcnow)
    updated: datetime = field(default_factory=utcnow)
    #: Why the stored row could not be read (a listing's placeholder: the columns and
    #: what is wrong; the other fields hold what could be read, text as stored). None
    #: for every row a store reads whole. Never stored; never fired.
    damaged: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("next_slot", "last_slot", "created", "updated"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_utc(value))

    def evolve(self, **changes: Any) -> RecurringSchedule:
        return replace(self, **changes)
