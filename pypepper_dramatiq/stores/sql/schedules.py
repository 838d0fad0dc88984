"""Recurring schedules' rows."""

from __future__ import annotations

import builtins
from datetime import datetime

from sqlalchemy import delete, insert, select, update
from sqlalchemy import exc as sa_exc

from ...errors import StoreError
from ...records.recurring import RecurringSchedule
from ..rows import due_schedules, listed_schedules, recurring_schedule
from ..schema import recurring
from .boundary import boundary
from .engine import transaction
from .mapping import schedule_values
from .parts import SqlStorePart


class ScheduleRows(SqlStorePart):
    """The rows of recurring schedules."""

    def save_recurring(self, schedule: RecurringSchedule) -> RecurringSchedule:
        # Two first saves of one name (processes starting together) both find no
        # row; the primary key refuses the loser's insert, and its second try
        # finds the winner's row and replaces it.
        try:
            return self._save_recurring(schedule)
        except StoreError as exc:
            if not isinstance(exc.__cause__, sa_exc.IntegrityError):
                raise
        return self._save_recurring(schedule)

    def _save_recurring(self, schedule: RecurringSchedule) -> RecurringSchedule:
        with (
            boundary(self._engine, f"saving schedule {schedule.name}"),
            transaction(self._engine) as conn,
        ):
            current = conn.execute(
                select(recurring.c.version, recurring.c.created)
                .where(recurring.c.name == schedule.name)
                .with_for_update()
            ).first()
            if current is None:
                stored = schedule.evolve(version=1)
                conn.execute(insert(recurring).values(schedule_values(stored)))
                return stored
            stored = schedule.evolve(version=current.version + 1, created=current.created)
            values = schedule_values(stored)
            del values["name"], values["created"]
            conn.execute(update(recurring).where(recurring.c.name == schedule.name).values(values))
            return stored

    def advance_recurring(self, schedule: RecurringSchedule) -> bool:
        values = schedule_values(schedule)
        for column in ("name", "created"):
            del values[column]
        values["version"] = recurring.c.version + 1
        stmt = (
            update(recurring)
            .where(recurring.c.name == schedule.name, recurring.c.version == schedule.version)
            .values(values)
        )
        with (
            boundary(self._engine, f"updating schedule {schedule.name}"),
            self._engine.connect() as c,
        ):
            return c.execute(stmt).rowcount == 1

    def get_recurring(self, name: str) -> RecurringSchedule | None:
        query = select(recurring).where(recurring.c.name == name)
        with boundary(self._engine, f"loading schedule {name}"), self._engine.connect() as c:
            row = c.execute(query).mappings().first()
        return None if row is None else recurring_schedule(row)

    def list_recurring(self) -> builtins.list[RecurringSchedule]:
        query = select(recurring).order_by(recurring.c.name)
        with boundary(self._engine, "listing schedules"), self._engine.connect() as c:
            return listed_schedules(c.execute(query).mappings())

    def delete_recurring(self, name: str) -> bool:
        stmt = delete(recurring).where(recurring.c.name == name)
        with boundary(self._engine, f"deleting schedule {name}"), self._engine.connect() as c:
            return c.execute(stmt).rowcount == 1

    def due_recurring(self, now: datetime, limit: int = 100) -> builtins.list[RecurringSchedule]:
        query = (
            select(recurring)
            .where(recurring.c.next_slot <= now, recurring.c.paused.is_(False))
            .order_by(recurring.c.next_slot, recurring.c.name)
            .limit(limit)
        )
        with boundary(self._engine, "listing due schedules"), self._engine.connect() as c:
            return due_schedules(c.execute(query).mappings())
