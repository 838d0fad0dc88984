"""The paused channels and tasks (``scheduler_paused``), and the release of the rows
held for them."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import delete, insert, select, true, update
from sqlalchemy.exc import IntegrityError

from ...records.pauses import PAUSED_UNTIL, check_kind
from ...rules.status import Status
from ..schema import jobs
from ..schema import paused as paused_rows
from .boundary import boundary
from .engine import transaction
from .parts import SqlStorePart


class PauseRows(SqlStorePart):
    """Pauses: a row per paused channel or task; the held rows released by one UPDATE
    per status."""

    def pause(self, kind: str, name: str, at: datetime) -> bool:
        check_kind(kind)
        row = paused_rows.c
        found = select(row.name).where(row.kind == kind, row.name == name)
        with boundary(self._engine, f"pausing {kind} {name}"):
            try:
                with transaction(self._engine) as conn:
                    if conn.execute(found).first() is not None:
                        return False
                    conn.execute(insert(paused_rows).values(kind=kind, name=name, paused_at=at))
            except IntegrityError:  # another process paused it between our read and insert
                return False
        return True

    def resume(self, kind: str, name: str) -> bool:
        check_kind(kind)
        row = paused_rows.c
        stmt = delete(paused_rows).where(row.kind == kind, row.name == name)
        with boundary(self._engine, f"resuming {kind} {name}"), transaction(self._engine) as c:
            return c.execute(stmt).rowcount == 1

    def paused(self) -> frozenset[tuple[str, str]]:
        query = select(paused_rows.c.kind, paused_rows.c.name)
        with boundary(self._engine, "reading the paused set"), self._engine.connect() as c:
            return frozenset((str(kind), str(name)) for kind, name in c.execute(query))

    def release_paused(self, now: datetime, keep_channels: Collection[str] = ()) -> int:
        kept = sorted(set(keep_channels))
        others = jobs.c.channel_id.not_in(kept) if kept else true()
        held_first = update(jobs).where(
            jobs.c.status == Status.SCHEDULED.value,
            jobs.c.release_at >= PAUSED_UNTIL,
            others,
        )
        held_step = update(jobs).where(
            jobs.c.status == Status.IN_PROGRESS.value,
            jobs.c.lease_owner.is_(None),
            jobs.c.lease_expires >= PAUSED_UNTIL,
            others,
        )
        moved = {"updated": now, "version": jobs.c.version + 1}
        with (
            boundary(self._engine, "releasing the jobs held for a pause"),
            transaction(self._engine) as conn,
        ):
            first = conn.execute(held_first.values(release_at=jobs.c.created, **moved))
            steps = conn.execute(held_step.values(lease_expires=jobs.c.created, **moved))
            return int(first.rowcount) + int(steps.rowcount)
